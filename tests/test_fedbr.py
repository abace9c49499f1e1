"""FedBR (issue 7): pseudo-data, L_con, the max/min steps, the trainer's hooks and the uniform server average."""

from __future__ import annotations

import copy
import math
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
from torch import nn

from client_app.state import ClientState
from client_app.trainers.base import ClientData, TrainJob
from client_app.trainers.fedbr.trainer import (ContrastiveTerm, FedBRTrainer, MaxStep, PseudoBatch,
                                               PseudoClassTerm)
from client_app.trainers.fedbr.pseudo_data import (contrastive_loss, mixture_pseudo_data, mixup, proxy_samples,
                                                   rsm_pseudo_data, similarities, soft_cross_entropy,
                                                   uniform_labels)
from client_app.training import Step
from flcore.config import PROJECT_ROOT, ConfigError, RunConfig
from flcore.methods.fedbr import METRICS, STATE_KEY, FedBRConfig
from flcore.registry import get_method
from models.base import FLModel
from models.extras import ProjectionHead, add_fedbr_projection
from models.networks import Flatten
from strategies.base import ClientUpdate
from strategies.methods.fedbr import FedBRStrategy, uniform_delta_average

torch.set_num_threads(1)
C = 3


# ------------------------------------------------------------------------------------------------ pseudo-data
def test_rsm_samples_are_means_of_distinct_local_samples_with_uniform_labels():
    n = 20
    x_local = torch.eye(n)  # sample j is e_j, so a mean reveals which samples it averaged
    x, q = rsm_pseudo_data(x_local, size=32, subset=10, num_classes=C, generator=torch.Generator().manual_seed(0))
    assert x.shape == (32, n) and q.shape == (32, C)
    for row in x:
        used = row > 0
        assert int(used.sum()) == 10  # 10 distinct local samples (no replacement)
        assert torch.allclose(row[used], torch.full((10,), 0.1))
    assert torch.allclose(q, torch.full((32, C), 1 / C))
    assert len({tuple(r.tolist()) for r in x}) > 1  # different random subsets
    # subset larger than the local set: the mean of all local samples
    x_all, _ = rsm_pseudo_data(x_local[:4], 2, 10, C, torch.Generator().manual_seed(0))
    assert torch.allclose(x_all, x_local[:4].mean(0).expand(2, -1))


def test_mixture_follows_eq4_and_labels_sum_to_one():
    n, k, p = 6, 2, 40
    x_local = torch.cat([torch.eye(n), torch.zeros(n, 1)], dim=1)  # local sample j = e_j
    y_local = torch.tensor([0, 1, 2, 0, 1, 2])
    x_proxy = torch.zeros(p, n + 1)
    x_proxy[:, n] = 5.0 + torch.arange(p, dtype=torch.float32)  # proxy sample in its own coordinate
    x, q = mixture_pseudo_data(x_proxy, x_local, y_local, C, k, torch.Generator().manual_seed(3))
    assert torch.allclose(q.sum(1), torch.ones(p))
    scaled = x * (k + 1)
    assert torch.allclose(scaled[:, n], x_proxy[:, n])  # (x_p + sum x_k)/(K+1)
    counts = scaled[:, :n].round().long()  # how often each local sample was drawn
    assert torch.all(counts.sum(1) == k)
    expected_q = (1 / C + counts.float() @ F.one_hot(y_local, C).float()) / (k + 1)
    assert torch.allclose(q, expected_q, atol=1e-6)
    # K = 0: the proxy itself with the uniform label
    x0, q0 = mixture_pseudo_data(x_proxy, x_local, y_local, C, 0, torch.Generator().manual_seed(3))
    assert torch.equal(x0, x_proxy) and torch.allclose(q0, uniform_labels(p, C))


def test_proxy_is_seeded_shared_and_standardised():
    a = proxy_samples((1, 28, 28), 32, seed=7)
    b = proxy_samples((1, 28, 28), 32, seed=7)
    c = proxy_samples((1, 28, 28), 32, seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)  # every client builds the same set from the seed
    flat = a.reshape(32, -1)
    assert torch.allclose(flat.mean(1), torch.zeros(32), atol=1e-5)
    assert torch.allclose(flat.std(1, correction=0), torch.ones(32), atol=1e-5)
    tiny = proxy_samples((1, 4, 4), 8, seed=1).reshape(8, -1)  # small inputs stay well defined
    assert torch.allclose(tiny.std(1, correction=0), torch.ones(8), atol=1e-5)
    # smooth noise is spatially correlated, white noise is not
    def nb(z):
        return float(F.cosine_similarity(z[..., 1:].reshape(-1), z[..., :-1].reshape(-1), dim=0))

    assert nb(a) > 0.8 and abs(nb(proxy_samples((1, 28, 28), 32, 7, "white-noise"))) < 0.05
    assert proxy_samples((60,), 4, 1).shape == (4, 60)
    with pytest.raises(ValueError, match="proxy"):
        proxy_samples((2, 3), 4, 1)


# ------------------------------------------------------------------------------------------------ losses
def test_contrastive_loss_equals_hand_computed_values():
    # row 1: sim(a, g) = 1, sim(a, c) = 0;  row 2: sim(a, g) = 0, sim(a, c) = 1/sqrt(2)
    a = torch.tensor([[1.0, 0.0], [2.0, 0.0]])
    g = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    c = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    tau = 0.5
    row1 = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + math.exp(0.0)))  # = log(1 + e^-2)
    row2 = -math.log(1.0 / (1.0 + math.exp(2 ** -0.5 / tau)))
    assert contrastive_loss(a, g, c, tau, tau, "index").item() == pytest.approx((row1 + row2) / 2, rel=1e-6)
    assert row1 == pytest.approx(0.126928, abs=1e-6)
    # different temperatures: f1 = exp(1/0.25), f2 = exp(0/1)
    assert contrastive_loss(a[:1], g[:1], c[:1], 0.25, 1.0).item() == pytest.approx(math.log(1 + math.exp(-4)), rel=1e-6)
    # all-pairs: mean over the 2 x 2 (pseudo, real) pairs; sims of a with c rows: [[0, 1/sqrt2], [0, 1/sqrt2]]
    s = 2 ** -0.5
    pairs = [(1, 0), (1, s), (0, 0), (0, s)]
    want = np.mean([math.log(math.exp(s1 / tau) + math.exp(s2 / tau)) - s1 / tau for s1, s2 in pairs])
    assert contrastive_loss(a, g, c, tau, tau, "all-pairs").item() == pytest.approx(want, rel=1e-6)
    # mean: each pseudo sample against the mean real feature (0.5, 1) -> cos = 0.5/sqrt(1.25)
    sm = 0.5 / math.sqrt(1.25)
    want = np.mean([math.log(math.exp(s1 / tau) + math.exp(sm / tau)) - s1 / tau for s1 in (1, 0)])
    assert contrastive_loss(a, g, c, tau, tau, "mean").item() == pytest.approx(want, rel=1e-6)
    # index pairing wraps around a shorter real batch
    assert contrastive_loss(a, g, c[:1], tau, tau).item() == pytest.approx(
        (row1 + math.log(1 + math.exp(0))) / 2, rel=1e-6)


def test_similarities_are_the_cosines_inside_l_con():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    g = torch.tensor([[1.0, 1.0], [0.0, 1.0]])           # cos 1/sqrt(2), 1
    c = torch.tensor([[-1.0, 0.0], [3.0, 0.0]])          # index pairing: cos -1, 0
    s1, s2 = similarities(a, g, c, "index")
    assert s1 == pytest.approx((2 ** -0.5 + 1) / 2) and s2 == pytest.approx(-0.5)
    # L_con = mean softplus(s2/tau2 - s1/tau1), here by hand with tau = 0.5
    want = np.mean([math.log1p(math.exp(-2 - 2 * 2 ** -0.5)), math.log1p(math.exp(0 - 2))])
    assert contrastive_loss(a, g, c, 0.5, 0.5, "index").item() == pytest.approx(want, rel=1e-6)
    # collapse: every projected vector on one direction -> s1 = s2 = 1 and L_con = log 2, whatever tau
    one = torch.ones(4, 3)
    assert similarities(one, 2 * one, 3 * one, "all-pairs") == pytest.approx((1.0, 1.0))
    assert contrastive_loss(one, one, one, 0.5, 0.5).item() == pytest.approx(math.log(2))


def test_soft_cross_entropy_reduces_to_ce_and_log_c():
    logits = torch.randn(5, C, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 2, 1, 1, 0])
    assert soft_cross_entropy(logits, F.one_hot(y, C).float()).item() == pytest.approx(F.cross_entropy(logits, y).item())
    assert soft_cross_entropy(torch.zeros(4, C), uniform_labels(4, C)).item() == pytest.approx(math.log(C))


def test_mixup_is_a_convex_combination_within_the_batch():
    x = torch.arange(12.0).reshape(6, 2)
    xm, perm, lam = mixup(x, 0.2, torch.Generator().manual_seed(0))
    assert 0 <= lam <= 1 and sorted(perm.tolist()) == list(range(6))
    assert torch.allclose(xm, lam * x + (1 - lam) * x[perm])


# ------------------------------------------------------------------------------------------------ model + job
def tiny_model(cfg: RunConfig) -> FLModel:
    torch.manual_seed(0)
    model = FLModel(nn.Sequential(Flatten(), nn.Linear(16, 6), nn.ReLU()), nn.Linear(6, C), 6, C)
    add_fedbr_projection(model, cfg)
    return model


def make_job(overrides: dict | None = None, n: int = 24, server_round: int = 1, state: ClientState | None = None,
             model: FLModel | None = None) -> TrainJob:
    cfg = RunConfig.from_dict({"method": "fedbr", "batch-size": 8, "lr": 0.1, "momentum": 0.0, "weight-decay": 0.0,
                               "fedbr.proxy": "smooth-noise", **(overrides or {})})  # no proxy dataset read
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n, 1, 4, 4, generator=gen)
    y = torch.randint(0, C, (n,), generator=gen)
    model = model or tiny_model(cfg)
    return TrainJob(cfg, 0, server_round, model, {k: v.clone() for k, v in model.state_dict().items()},
                    ClientData(x, y, x[:4], y[:4], C), {}, {}, state or ClientState(RecordDict(), 0),
                    torch.device("cpu"), torch.Generator().manual_seed(server_round))


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def changed(before: dict, module: nn.Module) -> set[str]:
    return {k for k, v in module.named_parameters() if not torch.equal(v, before[k])}


def test_projection_head_is_d_2d_2d_d_mlp():
    assert get_method("fedbr").model_hook == "models.extras:add_fedbr_projection"
    head = ProjectionHead(6)
    dims = [(m.in_features, m.out_features) for m in head if isinstance(m, nn.Linear)]
    assert dims == [(6, 12), (12, 12), (12, 6)]
    assert sum(isinstance(m, nn.ReLU) for m in head) == 2


def test_max_step_changes_only_theta_and_is_one_sgd_step_on_minus_lcon():
    job = make_job()
    model = job.model
    x_p = torch.randn(8, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    pb = PseudoBatch(lambda xb, yb: (x_p, uniform_labels(8, C)), per_step=False, need_global=True)
    max_step = MaxStep(pb, 0.5, 0.5, "index", lr=0.3, momentum=0.0, weight_decay=0.0)
    proj = model.extras["proj"]
    for p in proj.parameters():
        p.requires_grad_(False)  # as in FedBRTrainer.fit
    expected = copy.deepcopy(proj)
    before = snapshot(model)
    pb.begin(model)
    max_step.begin(model)
    x = job.data.x_train[:8]
    logits, z = model.forward_features(x)
    step = Step(x, job.data.y_train[:8], logits, z, 0, 0)
    pb.loss(model, step)
    max_step.loss(model, step)
    assert changed(before, model) == {k for k in before if k.startswith("extras.proj.")}
    # the same step by hand: theta <- theta - lr * grad_theta(-L_con)
    for p in expected.parameters():
        p.requires_grad_(True)
    with torch.no_grad():
        g = model.features(x_p)
    obj = -contrastive_loss(expected(pb.z.detach()), expected(g), expected(z.detach()), 0.5, 0.5)
    grads = torch.autograd.grad(obj, list(expected.parameters()))
    for p_new, p_old, gr in zip(proj.parameters(), expected.parameters(), grads):
        assert torch.allclose(p_new, p_old - 0.3 * gr, atol=1e-7)
    # the step raised L_con (it is a maximisation)
    with torch.no_grad():
        after = contrastive_loss(proj(pb.z), proj(g), proj(z), 0.5, 0.5)
    assert after.item() > -obj.item()


def test_max_step_is_plain_sgd_with_the_runs_weight_decay_unless_max_momentum_is_set():
    """Authors' code: the projection head's optimizer is SGD(lr, weight_decay) without momentum, whatever the
    local optimizer's momentum; fedbr.max-momentum adds one."""
    for over, want in (({"momentum": 0.9, "weight-decay": 1e-3}, 0.0),
                       ({"momentum": 0.9, "weight-decay": 1e-3, "fedbr.max-momentum": 0.5}, 0.5)):
        trainer = FedBRTrainer(make_job(over))
        max_step = next(t for t in trainer.terms() if isinstance(t, MaxStep))
        max_step.begin(trainer.job.model)
        group = max_step.opt.param_groups[0]
        assert (group["momentum"], group["weight_decay"], group["lr"]) == (want, 1e-3, 0.1)
        assert trainer.optim_config().momentum == 0.9          # the min step keeps the run's optimizer


def test_global_features_of_each_step_or_cached_from_the_rounds_first_pseudo_batch():
    """Eq. 5 pairs phi_i(x_p) with phi_g(x_p) of the same x_p (step); the authors' code keeps phi_g of the
    round's first Mixture batch for the whole round (round)."""
    job = make_job()
    model = job.model
    for once, want in ((False, [1.0, 2.0, 3.0]), (True, [1.0, 1.0, 1.0])):
        batches = iter([torch.full((2, 1, 4, 4), float(v)) for v in (1, 2, 3)])
        pb = PseudoBatch(lambda xb, yb, batches=batches: (next(batches), uniform_labels(2, C)), per_step=True,
                         need_global=True,
                         global_once=once)
        pb.begin(model)
        for _ in range(3):
            pb.before_step(model, job.data.x_train[:2], job.data.y_train[:2])
            x_p = pb.x
            with torch.no_grad():
                expect = model.features(torch.full_like(x_p, want.pop(0)))
            torch.testing.assert_close(pb.g, expect)
        pb.end(model)
    trainer = FedBRTrainer(make_job({"fedbr.global-features": "round"}))
    assert next(t for t in trainer.terms() if isinstance(t, PseudoBatch)).global_once


def test_min_step_never_changes_theta():
    job = make_job({"fedbr.max-step": False})
    before = snapshot(job.model)
    stats = FedBRTrainer(job).fit()
    assert stats.steps == 3
    moved = changed(before, job.model)
    assert not any(k.startswith("extras.proj.") for k in moved)
    assert {"backbone.1.weight", "head.weight"} <= moved
    assert all(p.requires_grad and p.grad is None for p in job.model.extras["proj"].parameters())


def test_one_local_step_equals_algorithm_1_by_hand():
    """Max step on theta with phi^0, then the min step on (phi, omega) with theta^1 (Alg. 1 lines 8-11)."""
    over = {"fedbr.pseudo": "rsm", "fedbr.pairing": "mean", "batch-size": 32, "max-local-steps": 1,
            "fedbr.mu": 0.7, "fedbr.lambda": 0.9}
    job = make_job(over)
    init = copy.deepcopy(job.model)
    trainer = FedBRTrainer(job)
    trainer.fit()
    stored = job.state.get_arrays(STATE_KEY)
    x_p, q = torch.from_numpy(stored["x"]), torch.from_numpy(stored["q"])
    x, y, lr = job.data.x_train, job.data.y_train, 0.1
    m = init
    proj = m.extras["proj"]
    with torch.no_grad():
        g = m.features(x_p)
    zp, z = m.features(x_p), m.features(x)
    obj = -contrastive_loss(proj(zp.detach()), proj(g), proj(z.detach()), 0.5, 0.5, "mean")
    theta = list(proj.parameters())
    grads = torch.autograd.grad(obj, theta)
    with torch.no_grad():
        for p, gr in zip(theta, grads):
            p -= lr * gr
    loss = (F.cross_entropy(m.head(z), y) + 0.9 * soft_cross_entropy(m.head(zp), q)
            + 0.7 * contrastive_loss(proj(zp), proj(g), proj(z), 0.5, 0.5, "mean"))
    rest = [p for n, p in m.named_parameters() if not n.startswith("extras.proj.")]
    grads = torch.autograd.grad(loss, rest)
    with torch.no_grad():
        for p, gr in zip(rest, grads):
            p -= lr * gr
    for (name, want), got in zip(m.named_parameters(), job.model.parameters()):
        assert torch.allclose(got, want, atol=1e-6), name
    metrics = trainer.extra_metrics(None)
    assert set(metrics) == set(METRICS)
    assert metrics["fedbr-max-con-loss"] == pytest.approx(-obj.item(), rel=1e-5)
    # after the max step (theta^1, phi^0): the min step's L_con term and its two cosines
    with torch.no_grad():
        a0, g0, c0 = proj(zp), proj(g), proj(z)       # proj is theta^1 here, zp/z were computed with phi^0
        assert metrics["fedbr-con-loss"] == pytest.approx(contrastive_loss(a0, g0, c0, 0.5, 0.5, "mean").item(),
                                                          rel=1e-5)
        assert (metrics["fedbr-sim-global"], metrics["fedbr-sim-real"]) == pytest.approx(
            similarities(a0, g0, c0, "mean"), rel=1e-5)
        # end of local training: theta^1, phi^1 on the same (only) batches
        end = contrastive_loss(proj(m.features(x_p)), proj(g), proj(m.features(x)), 0.5, 0.5, "mean").item()
    assert metrics["fedbr-con-end"] == pytest.approx(end, rel=1e-5)


@pytest.mark.parametrize("over,kinds", [
    ({}, [PseudoBatch, MaxStep, ContrastiveTerm, PseudoClassTerm]),
    ({"fedbr.feature-debias": False}, [PseudoBatch, PseudoClassTerm]),          # component 1 only
    ({"fedbr.classifier-debias": False}, [PseudoBatch, MaxStep, ContrastiveTerm]),  # component 2 only
    ({"fedbr.max-step": False}, [PseudoBatch, ContrastiveTerm, PseudoClassTerm]),  # without max step
    ({"fedbr.feature-debias": False, "fedbr.classifier-debias": False}, []),
])
def test_ablations_select_terms(over, kinds):
    assert [type(t) for t in FedBRTrainer(make_job(over)).terms()] == kinds


def test_pseudo_refresh_once_keeps_rsm_in_client_state_round_rebuilds():
    state = ClientState(RecordDict(), 0)
    j1 = make_job({"fedbr.pseudo": "rsm"}, server_round=1, state=state)
    x1, _ = FedBRTrainer(j1).pseudo_source()[0](None, None)
    x2, _ = FedBRTrainer(make_job({"fedbr.pseudo": "rsm"}, server_round=2, state=state)).pseudo_source()[0](None, None)
    assert torch.equal(x1, x2) and STATE_KEY in state.keys()
    r = {"fedbr.pseudo": "rsm", "fedbr.pseudo-refresh": "round"}
    y1, _ = FedBRTrainer(make_job(r, server_round=1)).pseudo_source()[0](None, None)
    y2, _ = FedBRTrainer(make_job(r, server_round=2)).pseudo_source()[0](None, None)
    assert not torch.equal(y1, y2)
    # Mixture: the shared proxy is fixed ("once"), the local partners are redrawn every step
    make, per_step = FedBRTrainer(make_job()).pseudo_source()
    (a, qa), (b, _) = make(None, None), make(None, None)
    assert per_step and not torch.equal(a, b)
    assert a.shape[0] == 8 and torch.allclose(qa.sum(1), torch.ones(8))  # |D_p| = B (Alg. 1)


def test_mixup_option_trains_and_full_fedbr_learns_on_a_separable_task():
    gen = torch.Generator().manual_seed(0)
    n = 60
    y = torch.arange(n) % C
    x = torch.randn(n, 1, 4, 4, generator=gen) * 0.3
    x[:, 0, 0, :] += 2.0 * F.one_hot(y, 4)[:, :4].float()  # class c lights up pixel (0, c)
    for over in ({}, {"fedbr.mixup": True}):
        job = make_job({"local-epochs": 15, "batch-size": 16, **over}, n=n)
        job.data = ClientData(x, y, x, y, C)
        trainer = FedBRTrainer(job)
        stats = trainer.fit()
        assert all(math.isfinite(v) for v in [stats.mean_loss, *trainer.extra_metrics(stats).values()])
        acc = (job.model(x).argmax(1) == y).float().mean().item()
        assert acc > 0.9, over


# ------------------------------------------------------------------------------------------------ config + server
def test_config_defaults_match_pyproject_and_bad_values_name_the_key():
    with open(PROJECT_ROOT / "pyproject.toml", "rb") as fh:
        table = flatten_dict(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])
    defaults = {k: v for k, v in table.items() if k.startswith("fedbr.")}
    assert FedBRConfig.parse(defaults) == FedBRConfig()
    assert len(defaults) == len(fields(FedBRConfig))
    assert FedBRConfig.parse({"fedbr.lambda": 0.3}).lambda_ == 0.3   # the key of field lambda_
    for key, bad, message in (("fedbr.tau1", 0.0, "got 0.0; allowed: > 0, finite"),
                              ("fedbr.pseudo", "gan", "got 'gan'; allowed: one of mixture, rsm"),
                              ("fedbr.mu", "a lot", "must be a float, got 'a lot'"),
                              ("fedbr.lambda", -1.0, "got -1.0; allowed: >= 0, finite")):
        with pytest.raises(ConfigError, match=re.escape(f"run-config key '{key}' {message}")):
            FedBRConfig.parse({key: bad})


def test_server_averages_deltas_uniformly():
    g = OrderedDict(w=np.array([1.0, 1.0], np.float32), step=np.array(4, np.int64))
    clients = [OrderedDict(w=np.array([2.0, 1.0], np.float32), step=np.array(5, np.int64)),
               OrderedDict(w=np.array([1.0, 4.0], np.float32), step=np.array(5, np.int64)),
               OrderedDict(w=np.array([0.0, 1.0], np.float32), step=np.array(8, np.int64))]
    out = uniform_delta_average(g, clients)
    assert np.allclose(out["w"], [1.0, 2.0]) and out["w"].dtype == np.float32 and int(out["step"]) == 6
    cfg = RunConfig.from_dict({"method": "fedbr"})
    updates = [ClientUpdate(i, p, n, {"fedbr-con-loss": float(i)}, {}) for i, (p, n) in enumerate(zip(clients, (1, 10, 100)))]
    strat = FedBRStrategy(cfg)
    assert np.allclose(strat.aggregate(1, g, updates)["w"], [1.0, 2.0])  # n_k ignored
    assert strat.round_metrics() == {"fedbr-con-loss": 1.0}
    weighted = FedBRStrategy(RunConfig.from_dict({"method": "fedbr", "fedbr.weighting": "samples"}))
    assert np.allclose(weighted.aggregate(1, g, updates)["w"], [(2 + 10 + 0) / 111, (1 + 40 + 100) / 111])
    with pytest.raises(ConfigError, match=re.escape("run-config key 'fedbr.weighting' got 'median'; allowed: one "
                                                    "of uniform, samples")):
        RunConfig.from_dict({"method": "fedbr", "fedbr.weighting": "median"})


# ------------------------------------------------------------------------------------------------ end to end
@pytest.mark.slow
def test_fedbr_simulation_learns_and_averages_the_projection_head(tmp_path):
    import torch as th

    from experiments.simulate import simulate
    doc = simulate({"method": "fedbr", "dataset": "digits", "num-server-rounds": 3, "partition": "dirichlet",
                    "dirichlet-alpha": 0.5, "local-epochs": 2, "local-test-fraction": 0.0, "lr": 0.05,
                    "out-dir": str(tmp_path)}, num_supernodes=4)
    rounds = doc["rounds"]
    assert len(rounds) == 3 and all(r["num_updates"] == 4 for r in rounds)
    accs = [r["global_accuracy"] for r in rounds]
    assert accs[-1] > 0.5 and accs[-1] > accs[0]  # 10 classes: chance is 0.1
    for r in rounds:  # the clients' max/min-step losses reach the server every round
        s = r["strategy"]
        assert set(s) == set(METRICS)
        assert all(math.isfinite(v) for v in s.values())
        assert all(s[k] > 0 for k in ("fedbr-max-con-loss", "fedbr-con-loss", "fedbr-con-end", "fedbr-pseudo-ce"))
        assert all(-1 <= s[k] <= 1 for k in ("fedbr-sim-global", "fedbr-sim-real"))
    state = th.load(tmp_path / "final_model.pt")
    assert {"extras.proj.0.weight", "extras.proj.4.weight"} <= set(state)  # P_theta is averaged with the model
