"""FedDyn (issue 3): the regulariser's gradient, the client state update, the server step, and the invariant
h = (1/m) sum over all clients of their gradient states."""

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, register, run_round
from client_app.state import ClientState
from client_app.trainers.feddyn import STATE_GRAD, feddyn_regulariser, feddyn_state_update
from flcore.config import ConfigError
from strategies.base import ClientUpdate
from strategies.methods.feddyn import FedDynStrategy, feddyn_server_update


def test_regulariser_value_and_gradient():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    wg = torch.tensor([0.0, 1.0])
    g = torch.tensor([0.5, -1.0])
    alpha = 0.2
    val = feddyn_regulariser([(w, wg, g)], alpha)
    # -<g, w> + alpha/2 ||w - wg||^2 = -(0.5 - 2) + 0.1 * 2 = 1.7
    assert val.item() == pytest.approx(1.7)
    val.backward()
    torch.testing.assert_close(w.grad, -g + alpha * (w.detach() - wg))


def test_client_state_update_by_hand():
    out = feddyn_state_update({"w": np.array([1.0, 0.0])}, {"w": np.array([3.0, 1.0])}, {"w": np.array([1.0, 1.0])}, 0.5)
    np.testing.assert_allclose(out["w"], [0.0, 0.0])  # [1, 0] - 0.5 * [2, 0]


def test_server_update_by_hand():
    theta = {"w": np.array([0.0, 0.0], np.float32)}
    locals_ = [{"w": np.array([2.0, 0.0], np.float32)}, {"w": np.array([0.0, 4.0], np.float32)}]
    h = {"w": np.array([0.1, 0.0])}
    new_theta, new_h = feddyn_server_update(theta, locals_, h, alpha=0.5, num_clients=4)
    # h = h - alpha/m sum(theta_k - theta) = [0.1, 0] - 0.125 * [2, 4] = [-0.15, -0.5]
    np.testing.assert_allclose(new_h["w"], [-0.15, -0.5])
    # theta = mean(theta_k) - h/alpha = [1, 2] + [0.3, 1.0]
    np.testing.assert_allclose(new_theta["w"], [1.3, 3.0])


def test_h_equals_mean_of_client_gradient_states_over_rounds():
    cfg = make_cfg(method="feddyn", alpha=0.1)
    datas = {cid: make_data(cid) for cid in range(4)}
    states = {cid: RecordDict() for cid in datas}
    strategy = FedDynStrategy(cfg)
    register(strategy, datas)
    params = initial_params(cfg)
    for rnd, sampled in enumerate([[0, 1], [1, 2, 3], [0, 3]], start=1):
        new_params, _ = run_round(cfg, strategy, rnd, params, datas, states, sampled)
        grads = [ClientState(states[c], c).get_arrays(STATE_GRAD) for c in datas]
        for k, h in strategy.h.items():
            mean = sum(g[k] if g is not None else 0.0 for g in grads) / len(datas)
            np.testing.assert_allclose(h, mean, rtol=1e-4, atol=1e-6)
        params = new_params


def test_second_round_uses_the_regulariser():
    """With a non-zero gradient state the local solution differs from plain SGD by the linear term."""
    cfg = make_cfg(method="feddyn", alpha=0.1)
    data = {0: make_data(0)}
    strategy = FedDynStrategy(cfg)
    register(strategy, data)
    state = {0: RecordDict()}
    p1, _ = run_round(cfg, strategy, 1, initial_params(cfg), data, state, [0])
    g1 = ClientState(state[0], 0).get_arrays(STATE_GRAD)
    assert sum(float(np.abs(v).sum()) for v in g1.values()) > 0


def test_aggregate_and_state_round_trip():
    cfg = make_cfg(method="feddyn", alpha=0.5)
    strategy = FedDynStrategy(cfg)
    register(strategy, {i: make_data(i) for i in range(4)})
    params = {"w": np.zeros(2, np.float32), "n": np.array(3, np.int64)}
    ups = [ClientUpdate(0, {"w": np.array([2.0, 0.0], np.float32), "n": np.array(5, np.int64)}, 10, {}, {}),
           ClientUpdate(1, {"w": np.array([0.0, 4.0], np.float32), "n": np.array(7, np.int64)}, 1, {}, {})]
    new = strategy.aggregate(1, params, ups)
    # h = -0.5/4 [2, 4]; theta = [1, 2] - h / 0.5 = [1.5, 3]
    np.testing.assert_allclose(new["w"], [1.5, 3.0])
    assert new["w"].dtype == np.float32 and int(new["n"]) == 6  # integer entries: plain average
    other = FedDynStrategy(cfg)
    other.load_state_dict(strategy.state_dict())
    np.testing.assert_allclose(other.h["w"], strategy.h["w"])
    with pytest.raises(ConfigError, match=bound_error("feddyn.alpha", 0.0, "> 0, finite")):
        FedDynStrategy(make_cfg(method="feddyn", alpha=0.0))
