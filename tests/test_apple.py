"""APPLE (Luo & Wu, IJCAI 2022, issue 41): lambda(r) and p_0 by hand, the personalized model's mixture and its
gradients, one local step against a hand computation, the reduction to local training (p one-hot on the client
itself, p fixed), the server's store and relay of the core models (K models per client), its checkpoint, and the
refusals."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict
from torch.func import functional_call

from client_app.state import ClientState
from client_app.trainers.apple import AppleTrainer, carried_p, mixed_params
from client_app.trainers.base import Trainer
from flcore.methods.apple import CORE_PREFIX, GROUP, P_SELF, STATE_P, initial_p, reg_coef
from flcore.records import record_to_params
from strategies.aggregation import weighted_average
from strategies.methods.apple import AppleStrategy
from tests._baselines_util import initial_params, make_cfg, make_data, make_job, register, run_client, run_round


def test_reg_coef_by_hand():
    # R = 100, fraction 0.1: R_d = 10 rounds with a proximal term
    assert reg_coef(0.1, 0, 100, 0.1, "exponential") == pytest.approx(0.1)
    assert reg_coef(0.1, 5, 100, 0.1, "exponential") == pytest.approx(0.1 * 0.001 ** 0.5)
    assert reg_coef(0.1, 5, 100, 0.1, "cosine") == pytest.approx(0.05)                 # (cos(pi/2) + 1) / 2 mu
    assert reg_coef(0.1, 10, 100, 0.1, "cosine") == 0.0 == reg_coef(0.1, 10, 100, 0.1, "exponential")
    assert reg_coef(0.0, 0, 100, 0.1, "cosine") == 0.0
    assert reg_coef(0.1, 0, 5, 0.1, "exponential") == 0.0                              # R_d = int(0.5) = 0


def test_initial_p_and_carried_p():
    assert initial_p([10, 30]) == [0.25, 0.75]
    stored = {"p": np.array([0.5, 0.4], np.float32), "cids": np.array([0, 2])}
    got = carried_p(stored, [0, 1, 2], [0.2, 0.3, 0.5])                   # client 1 is new: p_0's entry
    np.testing.assert_allclose(got, [0.5, 0.3, 0.4], rtol=1e-6)
    assert carried_p(None, [0, 1], [0.6, 0.4]) == [0.6, 0.4]
    with pytest.raises(ValueError, match="initial_p|positive"):
        initial_p([0, 0])


def test_mixture_and_its_gradients_by_hand():
    p = torch.tensor([0.25, 0.75], requires_grad=True)
    own = torch.tensor([4.0, 0.0], requires_grad=True)
    other = torch.tensor([0.0, 4.0])
    w = mixed_params(p, [{"w": own}, {"w": other}])["w"]
    torch.testing.assert_close(w.detach(), torch.tensor([1.0, 3.0]))
    c = torch.tensor([1.0, 2.0])
    (w * c).sum().backward()                                   # d/dp_j = <c, core_j>, d/d own = p_own c
    torch.testing.assert_close(p.grad, torch.tensor([4.0, 8.0]))
    torch.testing.assert_close(own.grad, torch.tensor([0.25, 0.5]))


def _setting(**keys):
    cfg = make_cfg(method="apple", **{"batch-size": 24, "max-local-steps": 1, "momentum": 0.0, **keys})
    datas = {cid: make_data(cid, n=24) for cid in range(3)}
    strategy = AppleStrategy(cfg)
    register(strategy, datas)
    return cfg, datas, strategy, initial_params(cfg)


def _trained_cores(cfg, strategy, params, datas):
    """Round 1 trains every client; the stored cores differ from the initial model."""
    states = {c: RecordDict() for c in datas}
    run_round(cfg, strategy, 1, params, datas, states, [0, 1, 2])
    return states


def test_one_step_by_hand():
    """One full-batch step at round 2 (R = 10, fraction 0.5: lambda = mu 0.001^(1/5)) from the stored cores:
    w_p = sum_j p_j w_j, g = grad CE(w_p); own <- own - lr (p_own g + wd own); p <- p - p_lr (<g, w_j> + 2 lambda (p - p_0))."""
    mu, p_lr = 0.3, 0.05
    cfg, datas, strategy, params = _setting(**{"apple.mu": mu, "apple.p-lr": p_lr, "apple.p-momentum": 0.0,
                                               "apple.reg-fraction": 0.5, "num-server-rounds": 10})
    states = _trained_cores(cfg, strategy, params, datas)
    cores = [{k: torch.from_numpy(np.asarray(v)) for k, v in strategy.cores[j].items()} for j in range(3)]
    p = torch.tensor(record_to_params(states[1][STATE_P])["p"], requires_grad=True)
    n = [datas[c].num_train for c in range(3)]
    p0 = torch.tensor([x / sum(n) for x in n])
    lam = mu * 0.001 ** (1 / 5)
    model = make_job(cfg, 1, 2, {k: v.numpy() for k, v in cores[1].items()}, datas[1], RecordDict()).model
    names = [k for k, _ in model.named_parameters()]
    wp = {k: sum(p[j] * cores[j][k] for j in range(3)) for k in names}
    wp_leaf = {k: v.detach().requires_grad_(True) for k, v in wp.items()}
    logits = functional_call(model, wp_leaf, (datas[1].x_train,))
    F.cross_entropy(logits, datas[1].y_train).backward()
    g = {k: wp_leaf[k].grad for k in names}
    want_own = {k: cores[1][k] - cfg.lr * (p[1].detach() * g[k] + cfg.weight_decay * cores[1][k]) for k in names}
    want_p = p.detach() - p_lr * (torch.stack([sum((g[k] * cores[j][k]).sum() for k in names) for j in range(3)])
                                  + 2 * lam * (p.detach() - p0))
    trainer, reply = run_client(cfg, strategy, 1, 2, params, datas[1], states[1])
    got = record_to_params(reply["arrays"])
    for k in names:
        torch.testing.assert_close(torch.from_numpy(np.asarray(got[k])), want_own[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.from_numpy(record_to_params(states[1][STATE_P])["p"]), want_p,
                               rtol=1e-5, atol=1e-6)
    assert reply["metrics"][P_SELF] == pytest.approx(float(want_p[1]), rel=1e-5)
    pfl = dict(trainer.personalized().named_parameters())
    for k in names:                                       # P-FL: sum_j p_j w_j with the new p and own core
        mix = sum(want_p[j] * (want_own[k] if j == 1 else cores[j][k]) for j in range(3))
        torch.testing.assert_close(pfl[k].detach(), mix, rtol=1e-5, atol=1e-6)


def test_p_one_hot_on_itself_and_fixed_is_local_training():
    """p = e_i with p-lr = 0 and mu = 0: w_p is the own core, so the round is plain local SGD from it, and the
    P-FL model is the trained core."""
    cfg, datas, strategy, params = _setting(**{"apple.p-lr": 0.0, "apple.mu": 0.0, "max-local-steps": 0,
                                               "batch-size": 8, "momentum": 0.5})
    states = _trained_cores(cfg, strategy, params, datas)
    ClientState(states[2], 2).put_arrays(STATE_P, {"p": np.array([0.0, 0.0, 1.0], np.float32),
                                                   "cids": np.array([0, 1, 2])})
    core = strategy.cores[2]
    trainer, reply = run_client(cfg, strategy, 2, 2, params, datas[2], states[2])
    base = Trainer(make_job(cfg, 2, 2, core, datas[2], RecordDict()))
    want = base.run()
    got = record_to_params(reply["arrays"])
    for k, v in want.params.items():
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(v), rtol=0, atol=1e-6)
    assert reply["metrics"]["local-accuracy"] == want.metrics["local-accuracy"]
    assert reply["metrics"][P_SELF] == 1.0


def test_server_stores_and_relays_every_other_core():
    cfg, datas, strategy, params = _setting()
    first = strategy.train_content(1, 1, params)
    assert sorted(k for k in first if k.startswith(CORE_PREFIX)) == [f"{CORE_PREFIX}0", f"{CORE_PREFIX}2"]
    assert dict(first[GROUP]) == {"cids": [0, 1, 2], "samples": [24, 24, 24]}
    for k, v in record_to_params(first[f"{CORE_PREFIX}0"]).items():        # never trained: the initial model
        np.testing.assert_array_equal(v, params[k])
    new, updates = run_round(cfg, strategy, 1, params, datas, {c: RecordDict() for c in datas}, [0, 1])
    mean = weighted_average([u.params for u in updates], [u.num_examples for u in updates])
    for k in params:
        np.testing.assert_array_equal(new[k], mean[k])
    by_cid = {u.cid: u.params for u in updates}
    msg = strategy.train_content(2, 0, new)                # client 0: its own core is the model, K - 1 records
    models = 1 + sum(k.startswith(CORE_PREFIX) for k in msg)
    assert models == len(strategy.clients) == 3
    for k, v in record_to_params(msg["arrays"]).items():
        np.testing.assert_array_equal(v, by_cid[0][k])
    for k, v in record_to_params(msg[f"{CORE_PREFIX}1"]).items():
        np.testing.assert_array_equal(v, by_cid[1][k])
    for k, v in record_to_params(msg[f"{CORE_PREFIX}2"]).items():           # client 2 not sampled yet
        np.testing.assert_array_equal(v, params[k])
    assert strategy.round_metrics()["apple-relayed-cores"] == 2
    assert math.isfinite(strategy.round_metrics()[f"mean-{P_SELF}"])
    other = AppleStrategy(cfg)
    other.load_state_dict(strategy.state_dict())
    assert sorted(other.cores) == [0, 1]
    for k in params:
        np.testing.assert_array_equal(other.cores[1][k], by_cid[1][k])
        np.testing.assert_array_equal(other.initial[k], params[k])


def test_refusals_name_the_client_and_record():
    cfg, datas, strategy, params = _setting()
    content = strategy.train_content(1, 0, params)
    del content[f"{CORE_PREFIX}2"]
    job = make_job(cfg, 0, 1, params, datas[0], RecordDict(), content)
    with pytest.raises(ValueError, match=f"client 0: .*lacks client 2's core '{CORE_PREFIX}2'"):
        AppleTrainer(job).run()
    content = strategy.train_content(1, 0, params)
    del content[GROUP]
    with pytest.raises(ValueError, match=f"client 0: .*no record '{GROUP}'"):
        AppleTrainer(make_job(cfg, 0, 1, params, datas[0], RecordDict(), content)).run()
