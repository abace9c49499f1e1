"""FedMTL (MOCHA's primal, Smith et al., NeurIPS 2017, issue 41): the Omega update by hand, the coupling's gradient
lambda (W Omega)_t, one local step by hand, lambda = 0 is local training, the server's W / Omega / coupling
messages and their checkpoint."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_app.trainers.base import Trainer
from client_app.trainers.fedmtl import FedMTLTrainer, coupling_penalty
from flcore.methods.fedmtl import COUPLING, OMEGA_TT, omega_from_models
from flcore.records import record_to_params
from strategies.methods.fedmtl import FedMTLStrategy
from tests._baselines_util import initial_params, make_cfg, make_data, make_job, register, run_client, run_round


def test_omega_by_hand():
    # orthogonal columns of norms 3 and 1: A^{1/2} = diag(3, 1), Sigma = diag(3, 1) / 4, Omega = diag(4/3, 4)
    np.testing.assert_allclose(omega_from_models(np.array([[3.0, 0.0], [0.0, 1.0]])), np.diag([4 / 3, 4.0]),
                               atol=1e-12)
    # equal columns: A = [[1, 1], [1, 1]], eigenvalues 0 (floored at 1e-7) and 2; Omega 1 = tr / sqrt(2) 1
    om = omega_from_models(np.array([[1.0, 1.0]]))
    np.testing.assert_allclose(om @ np.ones(2), (np.sqrt(2) + np.sqrt(1e-7)) / np.sqrt(2) * np.ones(2), rtol=1e-9)
    np.testing.assert_allclose(om, om.T, atol=1e-9)


def test_coupling_gradient_is_lambda_w_omega():
    w = torch.tensor([1.0, -2.0], requires_grad=True)
    u = torch.tensor([0.5, 0.25])
    coupling_penalty({"w": w}, {"w": u}, 3.0, 0.1).backward()
    torch.testing.assert_close(w.grad, 0.1 * (3.0 * torch.tensor([1.0, -2.0]) + u))   # lambda (Omega_tt w + u)


def _setting(**keys):
    cfg = make_cfg(method="fedmtl", **{"batch-size": 24, "max-local-steps": 1, "momentum": 0.0, **keys})
    datas = {cid: make_data(cid, n=24) for cid in range(3)}
    strategy = FedMTLStrategy(cfg)
    register(strategy, datas)
    return cfg, datas, strategy, initial_params(cfg)


def test_server_omega_and_coupling():
    cfg, datas, strategy, params = _setting()
    first = strategy.train_content(1, 1, params)
    assert dict(first["config"])[OMEGA_TT] == 3.0                          # Sigma = I / K: Omega = K I
    assert all(np.all(v == 0) for v in record_to_params(first[COUPLING]).values())
    new, updates = run_round(cfg, strategy, 1, params, datas, {c: RecordDict() for c in datas}, [0, 1, 2])
    names = list(params)
    w = np.stack([np.concatenate([np.asarray(strategy.models[c][k], np.float64).ravel() for k in names])
                  for c in range(3)], axis=1)
    om = omega_from_models(w)
    np.testing.assert_allclose(strategy.omega, om)
    msg = strategy.train_content(2, 0, new)
    assert dict(msg["config"])[OMEGA_TT] == pytest.approx(om[0, 0])
    got = record_to_params(msg[COUPLING])
    for k in names:
        want = om[0, 1] * strategy.models[1][k].astype(np.float64) + om[0, 2] * strategy.models[2][k]
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6)
    for k, v in record_to_params(msg["arrays"]).items():                   # its own model, not the mean
        np.testing.assert_array_equal(v, strategy.models[0][k])
    other = FedMTLStrategy(cfg)
    other.load_state_dict(strategy.state_dict())
    np.testing.assert_array_equal(other.omega, strategy.omega)
    for k in names:
        np.testing.assert_array_equal(other.models[2][k], strategy.models[2][k])


def test_one_step_by_hand():
    lam = 0.01
    cfg, datas, strategy, params = _setting(**{"fedmtl.lam": lam})
    run_round(cfg, strategy, 1, params, datas, {c: RecordDict() for c in datas}, [0, 1, 2])
    msg = strategy.train_content(2, 2, params)
    u, om = record_to_params(msg[COUPLING]), dict(msg["config"])[OMEGA_TT]
    w0 = strategy.models[2]
    ref = make_job(cfg, 2, 2, w0, datas[2], RecordDict()).model
    F.cross_entropy(ref(datas[2].x_train), datas[2].y_train).backward()
    _, reply = run_client(cfg, strategy, 2, 2, params, datas[2], RecordDict())
    got = record_to_params(reply["arrays"])
    for k, p in ref.named_parameters():
        x = torch.from_numpy(np.asarray(w0[k]))
        want = x - cfg.lr * (p.grad + cfg.weight_decay * x + lam * (om * x + torch.from_numpy(u[k])))
        torch.testing.assert_close(torch.from_numpy(np.asarray(got[k])), want, rtol=1e-5, atol=1e-6)


def test_lambda_zero_is_local_training():
    cfg, datas, strategy, params = _setting(**{"fedmtl.lam": 0.0, "max-local-steps": 0, "batch-size": 8,
                                               "momentum": 0.5})
    run_round(cfg, strategy, 1, params, datas, {c: RecordDict() for c in datas}, [0, 1, 2])
    w0 = strategy.models[1]
    _, reply = run_client(cfg, strategy, 1, 2, params, datas[1], RecordDict())
    want = Trainer(make_job(cfg, 1, 2, w0, datas[1], RecordDict())).run()
    got = record_to_params(reply["arrays"])
    for k, v in want.params.items():
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(v))
    assert reply["metrics"]["local-accuracy"] == want.metrics["local-accuracy"]


def test_refuses_a_message_without_the_coupling():
    cfg, datas, strategy, params = _setting()
    content = strategy.train_content(1, 0, params)
    del content[COUPLING]
    with pytest.raises(ValueError, match=f"client 0: .*'{COUPLING}'"):
        FedMTLTrainer(make_job(cfg, 0, 1, params, datas[0], RecordDict(), content)).run()
