"""FedBC (seed 001): dual updates, dual-weighted averaging, the local Lagrangian term and the variants."""

from __future__ import annotations

import json
import re
import tomllib
from collections import OrderedDict
from dataclasses import fields

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict
from flwr.common.config import flatten_dict

from client_app.state import ClientState
from client_app.trainers.base import ClientData, Trainer, TrainJob
from client_app.training import evaluate
from client_app.trainers.fedbc import (FedBCFineTuneTrainer, FedBCTrainer, LagrangianPenalty, PerFedBCTrainer,
                                       squared_distance as torch_sq_dist)
from flcore.config import PROJECT_ROOT, ConfigError, RunConfig
from flcore.methods.fedbc import FedBCConfig
from flcore.records import model_params
from models import build_model
from strategies.base import ClientInfo, ClientUpdate
from strategies.methods.fedbc.strategy import FedBCStrategy, FedBCUniformStrategy
from strategies.methods.fedbc.duals import (dual_ascent, dual_weighted_average, dual_weights, gamma_step, project,
                                   squared_distance, stats, uniform_average, weight_gaps)


def P(**arrays) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict((k, np.asarray(v, np.float32)) for k, v in arrays.items())


def run_cfg(**overrides) -> RunConfig:
    values = {"method": "fedbc", "dataset": "synthetic", "partition": "power-law", "model": "logistic",
              "batch-size": 4, "lr": 0.1, "local-epochs": 1, "seed": 0, "local-test-fraction": 0.25,
              "momentum": 0.0, "weight-decay": 0.0}
    values.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return RunConfig.from_dict(values)


def strategy(num_clients: int = 3, cls=FedBCStrategy, **fedbc) -> FedBCStrategy:
    s = cls(run_cfg(**{f"fedbc.{k.replace('_', '-')}": v for k, v in fedbc.items()}))
    for cid in range(num_clients):
        s.clients[cid] = ClientInfo(cid, 100 + cid, 10 * (cid + 1), [1, 1])
    return s


def upd(cid: int, params, n: int) -> ClientUpdate:
    return ClientUpdate(cid, params, n, {"num-examples": n}, {})


# ------------------------------------------------------------------------------------------ pure math
def test_squared_distance_hand_value_and_int_buffers_skipped():
    z = P(w=[[1.0, 2.0]], b=[0.5])
    z["steps"] = np.array(3, np.int64)
    x = P(w=[[2.0, 0.0]], b=[1.5])
    x["steps"] = np.array(99, np.int64)
    assert squared_distance(x, z) == pytest.approx(1.0 + 4.0 + 1.0)
    assert squared_distance(z, z) == 0.0


def test_dual_ascent_step_and_projection_match_hand_values():
    # Eq. (11): lambda + eta * (d - gamma), projected on [0, lambda_max]
    lam, buf = dual_ascent(0.5, violation=2.0, eta=0.1, upper=None)
    assert (lam, buf) == (pytest.approx(0.7), 2.0)
    assert dual_ascent(0.1, violation=-5.0, eta=0.1, upper=None)[0] == 0.0        # clipped at 0
    assert dual_ascent(0.9, violation=5.0, eta=0.1, upper=1.0)[0] == 1.0          # clipped at lambda_max
    assert dual_ascent(0.9, violation=5.0, eta=0.1, upper=None)[0] == pytest.approx(1.4)
    # heavy ball as torch SGD(momentum=0.5): buf' = 0.5*1 + 2 = 2.5, lambda' = 0.5 + 0.1*2.5
    lam, buf = dual_ascent(0.5, violation=2.0, eta=0.1, upper=None, momentum=0.5, buf=1.0)
    assert buf == pytest.approx(2.5) and lam == pytest.approx(0.75)
    assert project(-3.0, 2.0) == 0.0 and project(3.0, 2.0) == 2.0 and project(1.5, None) == 1.5


def test_dual_ascent_matches_torch_sgd_with_momentum_on_the_negated_gradient():
    """The authors run the ascent as torch SGD(momentum) on -dL/dlambda, then clamp at 0."""
    lam_t = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([lam_t], lr=0.01, momentum=0.5)
    lam, buf = 0.0, 0.0
    for viol in (3.0, 1.0, -2.0, 0.5):
        opt.zero_grad()
        (-(lam_t * viol)).sum().backward()
        opt.step()
        with torch.no_grad():
            lam_t.clamp_(min=0)
        lam, buf = dual_ascent(lam, viol, 0.01, None, 0.5, buf)
        assert lam == pytest.approx(float(lam_t), abs=1e-7)


def test_gamma_heuristic_moves_gamma_by_eta_times_lambda():
    gamma, buf = gamma_step(0.2, lam=0.5, eta=0.01)
    assert gamma == pytest.approx(0.205) and buf == 0.5
    assert gamma_step(0.2, lam=0.0, eta=0.01)[0] == 0.2        # lambda = 0: gamma stays
    gamma, buf = gamma_step(0.2, lam=0.5, eta=0.01, momentum=0.5, buf=0.4)
    assert buf == pytest.approx(0.7) and gamma == pytest.approx(0.207)


def test_dual_weights_and_sum_zero_fallback():
    w, fb = dual_weights([1.0, 3.0], [10, 10])
    assert not fb and np.allclose(w, [0.25, 0.75])
    w, fb = dual_weights([0.0, 0.0, 0.0], [10, 30, 60])
    assert fb and np.allclose(w, [0.1, 0.3, 0.6])
    with pytest.raises(ValueError, match="finite and >= 0"):
        dual_weights([-1.0, 2.0], [1, 1])
    with pytest.raises(ValueError, match="one lambda per client"):
        dual_weights([1.0], [1, 2])


def test_equal_multipliers_give_the_plain_mean_whatever_the_sizes():
    xs = [P(w=[1.0, 0.0]), P(w=[3.0, 2.0]), P(w=[8.0, 4.0])]
    z, w, fb = dual_weighted_average(xs, [0.7, 0.7, 0.7], [1, 50, 1000])
    assert not fb and np.allclose(w, 1 / 3)
    np.testing.assert_allclose(z["w"], [4.0, 2.0], rtol=1e-6)


# ------------------------------------------------------------------------------------------ server
def test_constant_lambda_and_zero_dual_step_is_plain_averaging():
    s = strategy(lambda_init=0.7, eta_lambda=0.0, eta_gamma=0.0)
    z = P(w=[0.0, 0.0])
    ups = [upd(0, P(w=[1.0, 1.0]), 10), upd(1, P(w=[2.0, 5.0]), 20), upd(2, P(w=[6.0, 0.0]), 30)]
    for rnd in (1, 2, 3):
        z = s.aggregate(rnd, z if rnd == 1 else z, ups)
        np.testing.assert_allclose(z["w"], [3.0, 2.0], rtol=1e-6)
        assert all(s.client_config(rnd, c) == {"fedbc-lambda": 0.7, "fedbc-gamma": 0.0} for c in range(3))
    assert s.round_metrics()["fedbc-fallback"] == 0


def test_one_server_round_hand_computed():
    s = strategy(2, eta_lambda=0.1, eta_gamma=0.1, lambda_momentum=0.0)
    z = P(w=[0.0, 0.0])
    # round 1: lambda = 0 -> lambda_k = 0.1 * ||x_k - z||^2; gamma uses the pre-step lambda (0): unchanged
    x0, x1 = P(w=[1.0, 2.0]), P(w=[0.0, 1.0])          # d = 5 and 1
    z1 = s.aggregate(1, z, [upd(0, x0, 10), upd(1, x1, 90)])
    assert s.dual(0).lam == pytest.approx(0.5) and s.dual(1).lam == pytest.approx(0.1)
    assert s.dual(0).gamma == 0.0 and s.dual(1).gamma == 0.0
    np.testing.assert_allclose(z1["w"], (0.5 * np.array([1, 2]) + 0.1 * np.array([0, 1])) / 0.6, rtol=1e-6)
    m = s.round_metrics()
    assert m["fedbc-round-weights"] == pytest.approx([0.5 / 0.6, 0.1 / 0.6])
    assert m["fedbc-round-sample-weights"] == pytest.approx([0.1, 0.9])
    assert m["fedbc-sq-dist"] == pytest.approx([5.0, 1.0])
    # round 2, client 0 alone: violation = ||x - z1||^2 - gamma; gamma += 0.1 * lambda(old) = 0.05
    x0b = P(w=[2.0, 2.0])
    d = float(np.sum((np.array([2.0, 2.0]) - z1["w"].astype(np.float64)) ** 2))
    z2 = s.aggregate(2, z1, [upd(0, x0b, 10)])
    assert s.dual(0).lam == pytest.approx(0.5 + 0.1 * (d - 0.0))
    assert s.dual(0).gamma == pytest.approx(0.05)
    np.testing.assert_allclose(z2["w"], [2.0, 2.0])        # a single client: z = x_0
    assert s.dual(1).lam == pytest.approx(0.1)              # not sampled: untouched


def test_dropped_client_keeps_its_duals_and_momentum():
    s = strategy(3, eta_lambda=0.01)
    z = P(w=[0.0, 0.0, 0.0])
    s.aggregate(1, z, [upd(c, P(w=[c + 1.0, 1.0, 0.0]), 10) for c in range(3)])
    before = {c: vars(s.dual(c)).copy() for c in range(3)}
    # round 2: clients 0, 1, 2 sampled, client 1 dropped out (no update reaches aggregate)
    s.aggregate(2, z, [upd(0, P(w=[1.0, 0.0, 0.0]), 10), upd(2, P(w=[0.0, 0.0, 4.0]), 10)])
    assert vars(s.dual(1)) == before[1]
    assert vars(s.dual(0)) != before[0] and vars(s.dual(2)) != before[2]
    assert s.round_metrics()["fedbc-round-cids"] == [0, 2]


def test_sum_lambda_zero_falls_back_to_sample_weighted_average_and_reports_it(caplog):
    s = strategy(2, lambda_init=0.0, eta_lambda=0.0)
    z = s.aggregate(1, P(w=[0.0]), [upd(0, P(w=[1.0]), 10), upd(1, P(w=[4.0]), 30)])
    np.testing.assert_allclose(z["w"], [(10 * 1.0 + 30 * 4.0) / 40])
    m = s.round_metrics()
    assert m["fedbc-fallback"] == 1 and m["fedbc-aggregation"] == "sample-weighted-fallback"
    assert "sum of lambda" in caplog.text


def test_fix_gamma_keeps_gamma_and_uses_it_in_the_violation():
    s = strategy(1, gamma_init=4.0, fix_gamma=True, eta_lambda=0.1, lambda_init=1.0, lambda_momentum=0.0)
    s.aggregate(1, P(w=[0.0]), [upd(0, P(w=[1.0]), 5)])       # d = 1 < gamma = 4: lambda decreases
    assert s.dual(0).gamma == 4.0 and s.dual(0).lam == pytest.approx(1.0 + 0.1 * (1.0 - 4.0))


def test_round_metrics_vectors_and_state_dict_roundtrip():
    s = strategy(3, eta_lambda=0.01)
    z = P(w=[0.0, 0.0])
    for rnd in (1, 2):
        z = s.aggregate(rnd, z, [upd(0, P(w=[1.0, rnd]), 10), upd(2, P(w=[3.0, 0.0]), 30)])
    m = s.round_metrics()
    assert m["fedbc-cids"] == [0, 1, 2] and m["fedbc-num-examples"] == [10, 20, 30]
    assert m["fedbc-lambda"][1] == 0.0 and m["fedbc-lambda"][0] > 0 and m["fedbc-lambda"][2] > 0
    assert m["fedbc-lambda-max"] == max(m["fedbc-lambda"]) and m["fedbc-gamma-min"] == min(m["fedbc-gamma"])
    state = json.loads(json.dumps(s.state_dict()))            # plain, JSON-safe values
    t = strategy(3, eta_lambda=0.01)
    t.load_state_dict(state)
    for c in range(3):
        assert vars(t.dual(c)) == pytest.approx(vars(s.dual(c)))
    # the restored strategy continues exactly as the original
    a = s.aggregate(3, z, [upd(0, P(w=[2.0, 2.0]), 10), upd(1, P(w=[0.0, 1.0]), 20)])
    b = t.aggregate(3, z, [upd(0, P(w=[2.0, 2.0]), 10), upd(1, P(w=[0.0, 1.0]), 20)])
    np.testing.assert_array_equal(a["w"], b["w"])
    with pytest.raises(ValueError, match="fedbc"):
        t.load_state_dict({"rng": state["rng"], "client_accuracy": {}})


def test_weight_gaps_and_stats_hand_values():
    g = weight_gaps([0.5, 0.25, 0.25], [10, 10, 20])
    assert g["vs-samples"] == pytest.approx(0.25 + 0.0 + 0.25) and g["vs-uniform"] == pytest.approx(1 / 6 + 2 / 12)
    assert weight_gaps([0.25, 0.75], [1, 3]) == {"vs-samples": 0.0, "vs-uniform": pytest.approx(0.5)}
    assert stats([3.0, 1.0, 2.0]) == {"mean": 2.0, "min": 1.0, "max": 3.0}
    with pytest.raises(ValueError, match="one weight per client"):
        weight_gaps([1.0], [1, 2])
    z, w = uniform_average([P(w=[1.0, 0.0]), P(w=[3.0, 6.0])])
    np.testing.assert_allclose(z["w"], [2.0, 3.0])
    np.testing.assert_allclose(w, [0.5, 0.5])


def test_round_metrics_over_the_round_clients_trained_lambda_gaps_and_penalty():
    s = strategy(3, eta_lambda=0.1, eta_gamma=0.1, lambda_momentum=0.0, lambda_init=0.2)
    z = P(w=[0.0, 0.0])
    x0, x2 = P(w=[1.0, 2.0]), P(w=[0.0, 1.0])                  # d = 5 and 1
    z1 = s.aggregate(1, z, [upd(0, x0, 10), upd(2, x2, 30)])
    m = s.round_metrics()
    lam0, lam2 = 0.2 + 0.1 * 5, 0.2 + 0.1 * 1                 # gamma was 0 when they trained
    assert m["fedbc-round-lambda-trained"] == [0.2, 0.2]
    assert m["fedbc-round-lambda-mean"] == pytest.approx((lam0 + lam2) / 2)
    assert m["fedbc-round-lambda-min"] == pytest.approx(lam2) and m["fedbc-round-lambda-max"] == pytest.approx(lam0)
    assert m["fedbc-round-gamma-mean"] == pytest.approx(0.1 * 0.2)            # gamma += eta * old lambda
    # every known client: client 1 (not sampled) is still at lambda-init
    assert m["fedbc-lambda"] == pytest.approx([lam0, 0.2, lam2]) and m["fedbc-lambda-min"] == pytest.approx(0.2)
    w = np.array([lam0, lam2]) / (lam0 + lam2)
    assert m["fedbc-round-weights"] == pytest.approx(w.tolist())
    assert m["fedbc-weights-l1-vs-samples"] == pytest.approx(abs(w[0] - 0.25) + abs(w[1] - 0.75))
    assert m["fedbc-weights-l1-vs-uniform"] == pytest.approx(abs(w[0] - 0.5) + abs(w[1] - 0.5))
    assert m["fedbc-penalty-mean"] == pytest.approx((0.2 * 5 + 0.2 * 1) / 2)
    assert m["fedbc-aggregation"] == "dual-weighted" and m["fedbc-local-model-accuracy"] is None
    np.testing.assert_allclose(z1["w"], w[0] * np.array([1.0, 2.0]) + w[1] * np.array([0.0, 1.0]), rtol=1e-6)


def test_fedbc_uniform_averages_unweighted_with_the_same_dual_steps():
    """The control: the plain mean of the returned models, lambda/gamma exactly as FedBC's."""
    kw = dict(eta_lambda=0.05, eta_gamma=0.02, lambda_momentum=0.5)
    bc, un = strategy(3, **kw), strategy(3, cls=FedBCUniformStrategy, **kw)
    z = P(w=[0.0, 0.0, 0.0])
    rounds = [[upd(0, P(w=[1.0, 2.0, 0.0]), 10), upd(1, P(w=[0.0, 1.0, 3.0]), 50), upd(2, P(w=[4.0, 0.0, 1.0]), 200)],
              [upd(0, P(w=[2.0, 2.0, 1.0]), 10), upd(2, P(w=[0.0, -1.0, 2.0]), 200)]]
    for rnd, ups in enumerate(rounds, 1):
        za, zu = bc.aggregate(rnd, z, ups), un.aggregate(rnd, z, ups)
        np.testing.assert_allclose(zu["w"], np.mean([u.params["w"] for u in ups], axis=0), rtol=1e-6)
        assert not np.allclose(za["w"], zu["w"])                   # FedBC's lambdas are unequal here
        for c in range(3):
            assert vars(un.dual(c)) == pytest.approx(vars(bc.dual(c)))
            assert un.client_config(rnd + 1, c) == bc.client_config(rnd + 1, c)
        m = un.round_metrics()
        assert m["fedbc-aggregation"] == "uniform" and m["fedbc-fallback"] == 0
        assert m["fedbc-round-weights"] == pytest.approx([1 / len(ups)] * len(ups))
        assert m["fedbc-weights-l1-vs-uniform"] == pytest.approx(0.0, abs=1e-12)
    # lambda constant (eta = 0): FedBC is the plain mean too, so the two coincide
    bc0, un0 = (strategy(3, cls=c, lambda_init=0.3, eta_lambda=0.0, eta_gamma=0.0)
                for c in (FedBCStrategy, FedBCUniformStrategy))
    np.testing.assert_array_equal(bc0.aggregate(1, z, rounds[0])["w"], un0.aggregate(1, z, rounds[0])["w"])
    # lambda = 0 everywhere: FedBC falls back to sample weights, the control stays uniform
    un00 = strategy(2, cls=FedBCUniformStrategy, lambda_init=0.0, eta_lambda=0.0)
    zz = un00.aggregate(1, P(w=[0.0]), [upd(0, P(w=[1.0]), 10), upd(1, P(w=[4.0]), 30)])
    np.testing.assert_allclose(zz["w"], [2.5])
    assert un00.round_metrics()["fedbc-fallback"] == 0 and un00.round_metrics()["fedbc-aggregation"] == "uniform"


@pytest.mark.parametrize("key,value,allowed", [("fedbc.eta-lambda", -1.0, ">= 0, finite"),
                                               ("fedbc.lambda-momentum", 1.0, ">= 0, < 1, finite"),
                                               ("fedbc.gamma-init", float("nan"), ">= 0, finite"),
                                               ("fedbc.finetune-steps", -1, ">= 0"),
                                               ("fedbc.maml-inner-lr", 0.0, "> 0, finite")])
def test_bad_config_values_name_the_key(key, value, allowed):
    """Refused when the run config is parsed (server start, and every client's parse of what it receives)."""
    with pytest.raises(ConfigError, match=re.escape(f"run-config key '{key}' got {value!r}; allowed: {allowed}")):
        run_cfg(**{key: value})
    with pytest.raises(ConfigError, match=re.escape(f"run-config key '{key}' got {value!r}")):
        FedBCConfig.parse({key: value})


def test_lambda_init_above_lambda_max_is_refused():
    with pytest.raises(ConfigError, match=re.escape("'fedbc.lambda-init' (2.0) must not exceed 'fedbc.lambda-max' "
                                                    "(1.0)")):
        run_cfg(**{"fedbc.lambda-init": 2.0, "fedbc.lambda-max": 1.0})
    cfg = run_cfg(**{"fedbc.lambda-init": 2.0, "fedbc.lambda-max": 0.0})   # 0 = no upper bound
    assert cfg.section(FedBCConfig).upper is None


def test_config_defaults_equal_pyproject_block():
    with open(PROJECT_ROOT / "pyproject.toml", "rb") as fh:
        defaults = flatten_dict(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])
    c = FedBCConfig()
    names = [f.name for f in fields(FedBCConfig)]
    for field_name in ("lambda_init", "gamma_init", "eta_lambda", "eta_gamma", "lambda_momentum", "lambda_max",
                       "fix_gamma", "finetune_steps", "finetune_lr", "maml_inner_steps", "maml_inner_lr"):
        assert field_name in names
    for field_name in names:
        assert defaults["fedbc." + field_name.replace("_", "-")] == getattr(c, field_name)
    assert run_cfg().section(FedBCConfig) == c


# ------------------------------------------------------------------------------------------ client
def make_data(n: int = 12, d: int = 5, classes: int = 3, seed: int = 0) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return ClientData(x, y, x[:6].clone(), y[:6].clone(), classes)


def make_job(cfg: RunConfig, config: dict, data: ClientData | None = None, shift: float = 0.0) -> TrainJob:
    data = data or make_data()
    model = build_model(cfg, tuple(data.x_train.shape[1:]), data.num_classes)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(shift)
    gp = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return TrainJob(cfg=cfg, cid=3, server_round=1, model=model, global_params=gp, data=data, config=config,
                    records={}, state=ClientState(RecordDict(), 3), device=torch.device("cpu"),
                    generator=torch.Generator().manual_seed(7))


def test_local_gradient_equals_fedprox_with_mu_two_lambda():
    cfg = run_cfg()
    lam, gamma = 0.3, 0.8
    job = make_job(cfg, {"fedbc-lambda": lam, "fedbc-gamma": gamma})
    model = job.model
    z = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():                                       # move x away from z
        for p in model.parameters():
            p.add_(torch.linspace(-0.5, 0.5, p.numel()).reshape(p.shape))
    x, y = job.data.x_train, job.data.y_train

    def grads(extra):
        model.zero_grad()
        (F.cross_entropy(model(x), y) + extra()).backward()
        return [p.grad.clone() for p in model.parameters()]

    pen = LagrangianPenalty(z, lam, gamma)
    g_bc = grads(lambda: pen.value(model))
    mu = 2 * lam                                                # FedProx: mu/2 ||x - z||^2
    g_prox = grads(lambda: mu / 2 * sum(((p - z[n]) ** 2).sum() for n, p in model.named_parameters()))
    for a, b in zip(g_bc, g_prox):
        torch.testing.assert_close(a, b)
    g_ce = grads(lambda: torch.zeros(()))
    for a, c, (n, p) in zip(g_bc, g_ce, model.named_parameters()):   # closed form: + 2 lambda (x - z)
        torch.testing.assert_close(a - c, 2 * lam * (p.detach() - z[n]))
    # the constant -lambda*gamma is part of the value (Lagrangian), not of the gradient
    assert float(pen.value(model)) == pytest.approx(lam * (float(torch_sq_dist(model, z)) - gamma), rel=1e-6)


def test_trainer_with_lambda_zero_is_fedavg_and_reports_the_distance():
    cfg = run_cfg()
    bc = FedBCTrainer(make_job(cfg, {"fedbc-lambda": 0.0, "fedbc-gamma": 0.0})).run()
    avg = Trainer(make_job(cfg, {})).run()
    for k in avg.params:
        np.testing.assert_array_equal(bc.params[k], avg.params[k])
    job = make_job(cfg, {"fedbc-lambda": 0.0, "fedbc-gamma": 0.0})
    z = model_params(job.model)
    assert bc.metrics["fedbc-sq-dist"] == pytest.approx(squared_distance(bc.params, z), rel=1e-5)
    assert bc.metrics["fedbc-sq-dist"] > 0 and bc.metrics["fedbc-lambda"] == 0.0
    assert bc.metrics["fedbc-local-model-accuracy"] == bc.metrics["local-accuracy"]


def test_no_local_test_split_reports_no_local_model_accuracy_and_the_server_logs_none():
    """local-test-fraction = 0: the client trains on everything and omits fedbc-local-model-accuracy."""
    cfg = run_cfg()
    full = make_data()
    data = ClientData(full.x_train, full.y_train, full.x_train[:0], full.y_train[:0], full.num_classes)
    for cls in (FedBCTrainer, FedBCFineTuneTrainer, PerFedBCTrainer):
        reply = cls(make_job(cfg, {"fedbc-lambda": 0.2, "fedbc-gamma": 0.0}, data)).run()
        assert "fedbc-local-model-accuracy" not in reply.metrics
        assert reply.metrics["fedbc-sq-dist"] > 0 and reply.metrics["num-examples"] == 12
    s = strategy(2, eta_lambda=0.1)
    ups = [ClientUpdate(c, P(w=[c + 1.0]), 10, {"num-examples": 10, "fedbc-sq-dist": (c + 1.0) ** 2}, {})
           for c in range(2)]
    s.aggregate(1, P(w=[0.0]), ups)
    assert s.round_metrics()["fedbc-local-model-accuracy"] is None
    ups[0].metrics["fedbc-local-model-accuracy"] = 0.5                      # one client with a split
    s.aggregate(2, P(w=[0.0]), ups)
    assert s.round_metrics()["fedbc-local-model-accuracy"] == 0.5


def test_larger_lambda_keeps_the_local_model_closer_to_z():
    cfg = run_cfg(lr=0.05, local_epochs=5)
    dist = [FedBCTrainer(make_job(cfg, {"fedbc-lambda": lam, "fedbc-gamma": 0.0})).run().metrics["fedbc-sq-dist"]
            for lam in (0.0, 1.0, 5.0)]
    assert dist[0] > dist[1] > dist[2]


def test_missing_or_bad_dual_values_are_errors_naming_key_and_client():
    cfg = run_cfg()
    with pytest.raises(ValueError, match="client 3.*fedbc-lambda"):
        FedBCTrainer(make_job(cfg, {"fedbc-gamma": 0.0}))
    with pytest.raises(ValueError, match="client 3.*fedbc-gamma.*>= 0"):
        FedBCTrainer(make_job(cfg, {"fedbc-lambda": 0.1, "fedbc-gamma": -1.0}))


def test_finetune_personalizes_a_copy_with_sgd_on_local_training_data():
    cfg = run_cfg(**{"fedbc.finetune-steps": 2, "fedbc.finetune-lr": 0.5, "batch-size": 12})
    job = make_job(cfg, {"fedbc-lambda": 0.2, "fedbc-gamma": 0.0})
    tr = FedBCFineTuneTrainer(job)
    reply = tr.run()
    local = {k: v.clone() for k, v in job.model.state_dict().items()}
    tuned = tr.personalized()
    # reported: the fine-tuned copy as P-FL model, the local model x_k as reference
    assert reply.metrics["local-accuracy"] == evaluate(tuned, job.data.x_test, job.data.y_test)[1]
    assert reply.metrics["fedbc-local-model-accuracy"] == evaluate(job.model, job.data.x_test, job.data.y_test)[1]
    # the local model (what is sent to the server) is untouched
    for k, v in job.model.state_dict().items():
        torch.testing.assert_close(v, local[k])
    # batch = all 12 samples: two full-batch GD steps on plain CE, by hand
    ref = build_model(cfg, (5,), 3)
    ref.load_state_dict(local)
    for _ in range(2):
        ref.zero_grad()
        F.cross_entropy(ref(job.data.x_train), job.data.y_train).backward()
        with torch.no_grad():
            for p in ref.parameters():
                p.sub_(0.5 * p.grad)
    for a, b in zip(tuned.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_per_fedbc_is_a_first_order_maml_step_by_hand():
    alpha, beta, lam, gamma = 0.3, 0.2, 0.4, 0.1
    cfg = run_cfg(**{"batch-size": 12, "lr": beta, "fedbc.maml-inner-lr": alpha, "fedbc.finetune-steps": 0})
    job = make_job(cfg, {"fedbc-lambda": lam, "fedbc-gamma": gamma})
    x, y = job.data.x_train, job.data.y_train
    z = {n: p.detach().clone() for n, p in job.model.named_parameters()}
    ref = build_model(cfg, (5,), 3)
    ref.load_state_dict(job.model.state_dict())
    tr = PerFedBCTrainer(job)
    tr.fit()                                   # one epoch, one (full) batch: one FO-MAML step
    # by hand: x' = x - alpha grad[CE(x) + lam(||x - z||^2 - gamma)];  x <- x - beta grad CE(x')
    params = list(ref.parameters())
    theta = [p.detach().clone() for p in params]
    loss = F.cross_entropy(ref(x), y) + lam * (sum(((p - z[n]) ** 2).sum() for n, p in ref.named_parameters()) - gamma)
    g_in = torch.autograd.grad(loss, params)
    with torch.no_grad():
        for p, g in zip(params, g_in):
            p.sub_(alpha * g)
    g_out = torch.autograd.grad(F.cross_entropy(ref(x), y), params)
    expected = [t - beta * g for t, g in zip(theta, g_out)]
    for p, e in zip(job.model.parameters(), expected):
        torch.testing.assert_close(p.detach(), e, rtol=1e-5, atol=1e-6)
    # P-FL model: the received global model (finetune-steps = 0 -> unchanged)
    for n, p in tr.personalized().named_parameters():
        torch.testing.assert_close(p.detach(), z[n])


# ------------------------------------------------------------------------------------------ plotting
def test_plot_reads_lambda_vectors_from_results_json(tmp_path):
    from experiments.plot_fedbc import coefficients, lambda_series, plot

    s = strategy(3, eta_lambda=0.01)
    rounds, z = [], P(w=[0.0, 0.0])
    for rnd in (1, 2):
        z = s.aggregate(rnd, z, [upd(0, P(w=[1.0, rnd]), 10), upd(2, P(w=[3.0, 0.0]), 30)])
        rounds.append({"round": rnd, "strategy": s.round_metrics()})
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"run_config": {}, "rounds": rounds}))
    data = lambda_series(json.loads(path.read_text()))
    assert data["lambda"].shape == (2, 3) and data["lambda"][1].tolist() == s.round_metrics()["fedbc-lambda"]
    coef, size_coef = coefficients(data["lambda"], data["sizes"])
    assert np.allclose(np.nansum(coef, 1), 1.0) and np.allclose(size_coef, [10 / 60, 20 / 60, 30 / 60])
    assert np.isnan(coefficients(np.zeros((1, 2)), np.array([1.0, 1.0]))[0]).all()   # sum lambda = 0
    assert plot(path, tmp_path / "f.png").stat().st_size > 1000


# ------------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_fedbc_simulation_learns_and_keeps_dual_invariants(tmp_path):
    from experiments.simulate import simulate

    doc = simulate({"method": "fedbc", "num-server-rounds": 4, "dataset": "synthetic", "partition": "power-law",
                    "local-test-fraction": 0.25, "fraction-train": 0.5, "lr": 0.01, "batch-size": 20, "momentum": 0.5,
                    "federated-eval-every": 4, "out-dir": str(tmp_path)}, num_supernodes=6)
    rounds = doc["rounds"]
    assert len(rounds) == 4 and doc["final"]["num_clients"] == 6
    times_updated = {c: 0 for c in range(6)}
    prev_gamma = [0.0] * 6
    for r in rounds:
        s = r["strategy"]
        assert s["fedbc-cids"] == list(range(6)) and s["fedbc-fallback"] == 0
        for c in s["fedbc-round-cids"]:
            times_updated[c] += 1
        lam, gam = s["fedbc-lambda"], s["fedbc-gamma"]
        # lambda_k > 0 exactly for the clients that have made a dual step (all squared distances > 0);
        # gamma_k moves only from a client's 2nd step on (its 1st step sees lambda_k = 0), and never decreases
        assert [lam[c] > 0 for c in range(6)] == [times_updated[c] > 0 for c in range(6)]
        assert [gam[c] > 0 for c in range(6)] == [times_updated[c] > 1 for c in range(6)]
        assert all(g >= p for g, p in zip(gam, prev_gamma))
        prev_gamma = gam
        # the aggregation weights are lambda_k / sum lambda over this round's clients
        round_lam = np.array([lam[c] for c in s["fedbc-round-cids"]])
        np.testing.assert_allclose(s["fedbc-round-weights"], round_lam / round_lam.sum(), rtol=1e-9)
        assert all(d > 0 for d in s["fedbc-sq-dist"])
        # the clients' own ||x_k - z||^2 (float32, parameters only) agrees with the server's (float64)
        np.testing.assert_allclose(s["fedbc-client-sq-dist"], s["fedbc-sq-dist"], rtol=1e-4)
        assert s["fedbc-local-model-accuracy"] == pytest.approx(r["local_accuracy"])
    assert rounds[-1]["global_loss"] < rounds[0]["global_loss"]
    assert doc["final"]["global_accuracy"] > 0.5 and rounds[-1]["local_accuracy"] is not None
    assert rounds[-1]["min_data_client_accuracy"] is not None


@pytest.mark.slow
def test_fedbc_uniform_end_to_end_without_local_test_split(tmp_path):
    """local-test-fraction = 0 (no P-FL split): the control runs, averages uniformly, reports no local accuracy."""
    from experiments.simulate import simulate

    doc = simulate({"method": "fedbc-uniform", "num-server-rounds": 2, "dataset": "digits", "model": "mlp",
                    "local-test-fraction": 0.0, "federated-eval-every": 0, "batch-size": 32,
                    "out-dir": str(tmp_path)}, num_supernodes=4)
    for r in doc["rounds"]:
        s = r["strategy"]
        assert s["fedbc-aggregation"] == "uniform" and s["fedbc-round-weights"] == pytest.approx([0.25] * 4)
        assert s["fedbc-local-model-accuracy"] is None and r["local_accuracy"] is None
        assert s["fedbc-round-lambda-min"] > 0 and s["fedbc-weights-l1-vs-samples"] > 0
    assert doc["rounds"][-1]["strategy"]["fedbc-round-lambda-trained"] == pytest.approx(
        doc["rounds"][0]["strategy"]["fedbc-lambda"])
    assert doc["final"]["global_accuracy"] > 0.3
