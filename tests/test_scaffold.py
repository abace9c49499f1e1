"""SCAFFOLD (issue 3): control-variate formulas (options I/II), gradient correction, server updates,
reduction to FedAvg, the invariant c = mean_i c_i, validation and checkpoint state."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import MetricRecord, RecordDict

from tests._baselines_util import (bound_error, initial_params, make_cfg, make_data, make_job, register,
                                   register_sizes, run_client, run_round)
from client_app.trainers.base import Trainer
from client_app.trainers.scaffold import (DELTA_C, STATE_C_I, ControlVariateTerm, full_gradient,
                                          option2_variate, momentum_step_sum)
from client_app.training import default_forward
from flcore.config import ConfigError
from flcore.records import params_to_record, record_to_params
from strategies.base import ClientUpdate
from strategies.methods.scaffold import ScaffoldStrategy, scaffold_model_update, scaffold_variate_update


def t(*v):
    return torch.tensor(v, dtype=torch.float64)


def test_option2_formula_by_hand():
    # c_i+ = c_i - c + (x - y)/(K lr) = [1, 0] - [0.5, 0.5] + ([2, 2] - [1, 3])/(4 * 0.5)
    out = option2_variate({"w": t(1, 0)}, {"w": t(0.5, 0.5)}, {"w": t(2, 2)}, {"w": t(1, 3)}, 4, 0.5)
    torch.testing.assert_close(out["w"], t(1.0, -1.0))


@pytest.mark.parametrize("momentum", [0.0, 0.5, 0.9])
def test_option2_recovers_a_constant_gradient_under_momentum(momentum):
    # loss = g . w has the constant gradient g: after K torch-SGD steps (fresh momentum buffer) option II
    # with c_i = c = 0 must return g itself, whatever the momentum
    g = t(0.3, -1.2, 2.0)
    w = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.05, momentum=momentum)
    for _ in range(7):
        opt.zero_grad()
        (g @ w).backward()
        opt.step()
    zero = {"w": torch.zeros(3, dtype=torch.float64)}
    out = option2_variate(zero, zero, {"w": torch.zeros(3, dtype=torch.float64)}, {"w": w.detach()}, 7, 0.05, momentum)
    torch.testing.assert_close(out["w"], g)
    assert momentum_step_sum(7, 0.0) == 7.0
    with pytest.raises(ValueError, match="momentum"):
        momentum_step_sum(7, 1.0)


def test_full_gradient_is_the_full_batch_gradient():
    cfg = make_cfg(method="scaffold")
    data = make_data(0, n=21)
    job = make_job(cfg, 0, 1, initial_params(cfg), data, RecordDict())
    names = [k for k, _ in job.model.named_parameters()]
    got = full_gradient(job.model, data.x_train, data.y_train, names, 8, default_forward)  # 3 uneven batches
    job.model.zero_grad()
    F.cross_entropy(job.model(data.x_train), data.y_train).backward()
    for k, p in job.model.named_parameters():
        torch.testing.assert_close(got[k], p.grad, rtol=1e-5, atol=1e-6)


def test_correction_adds_c_minus_c_i_to_gradients():
    lin = torch.nn.Linear(2, 1)
    lin.weight.grad = torch.tensor([[1.0, 2.0]])
    lin.bias.grad = torch.tensor([3.0])
    term = ControlVariateTerm({"weight": torch.tensor([[0.5, -1.0]]), "bias": torch.tensor([0.25])})
    term.begin(lin)
    term.on_gradients(lin)
    torch.testing.assert_close(lin.weight.grad, torch.tensor([[1.5, 1.0]]))
    torch.testing.assert_close(lin.bias.grad, torch.tensor([3.25]))


def _client_round(option: str, c_value: float, c_i_value: float, **cfg_over):
    """One SCAFFOLD client call with constant-valued c and c_i; returns (trainer, new c_i)."""
    cfg = make_cfg(method="scaffold", option=option, **cfg_over)
    params = initial_params(cfg)
    strategy = ScaffoldStrategy(cfg)
    strategy.train_content(1, 0, params)
    strategy.c = {k: np.full(v.shape, c_value) for k, v in strategy.c.items()}
    state = RecordDict()
    names = [k for k, p in make_job(cfg, 0, 1, params, make_data(0), RecordDict()).model.named_parameters()]
    from client_app.state import ClientState
    ClientState(state, 0).put_arrays(STATE_C_I, {k: np.full(params[k].shape, c_i_value, np.float32) for k in names})
    trainer, reply = run_client(cfg, strategy, 0, 1, params, make_data(0), state)
    return trainer, ClientState(state, 0).get_arrays(STATE_C_I), reply


def test_one_full_batch_step_makes_options_I_and_II_agree_on_the_local_gradient():
    # One plain-SGD step on the full batch: y = x - lr (g - c_i + c), so option II gives
    # c_i - c + (g - c_i + c) = g, which is option I's full local gradient (of the loss alone: no weight decay).
    over = dict(batch_size=64, max_local_steps=1, momentum=0.0, weight_decay=0.0)
    tr1, c1, r1 = _client_round("I", 0.3, -0.2, **over)
    tr2, c2, r2 = _client_round("II", 0.3, -0.2, **over)
    for k in c1:
        np.testing.assert_allclose(c1[k], c2[k], rtol=1e-3, atol=1e-5)
    # and delta c_i = c_i+ - c_i is what the client reports
    delta = record_to_params(r2[DELTA_C])
    for k in c2:
        np.testing.assert_allclose(delta[k], c2[k] + 0.2, rtol=1e-5, atol=1e-6)


def test_option_II_matches_formula_after_several_steps():
    tr, c_new, reply = _client_round("II", 0.1, 0.05, local_epochs=2, batch_size=8)
    x = tr.job.global_params
    y = record_to_params(reply["arrays"])
    steps = int(reply["metrics"]["local-steps"])
    assert steps == 6  # 24 samples, batch 8, 2 epochs
    scale = 0.1 * momentum_step_sum(steps, tr.cfg.momentum)  # = steps * lr without momentum
    for k in c_new:
        expected = 0.05 - 0.1 + (x[k].numpy() - y[k]) / scale
        np.testing.assert_allclose(c_new[k], expected, rtol=1e-4, atol=1e-5)


def test_zero_variates_and_one_client_equal_fedavg():
    cfg = make_cfg(method="scaffold", local_epochs=2)
    params = initial_params(cfg)
    data = make_data(3)
    strategy = ScaffoldStrategy(cfg)
    register(strategy, {0: data})
    new_params, updates = run_round(cfg, strategy, 1, params, {0: data}, {0: RecordDict()}, [0])
    fedavg_job = make_job(cfg, 0, 1, params, data, RecordDict())
    fedavg = Trainer(fedavg_job).run().params
    for k in params:
        np.testing.assert_allclose(updates[0].params[k], fedavg[k], rtol=0, atol=0)
        np.testing.assert_allclose(new_params[k], fedavg[k], rtol=1e-6, atol=1e-7)


def test_server_updates_by_hand():
    x = {"w": np.array([1.0, 1.0], np.float32)}
    ys = [{"w": np.array([2.0, 0.0], np.float32)}, {"w": np.array([4.0, 2.0], np.float32)}]
    # x + 0.5 * mean(y - x) = [1, 1] + 0.5 * [2, 0]
    np.testing.assert_allclose(scaffold_model_update(x, ys, 0.5)["w"], [2.0, 1.0])
    c = {"w": np.array([0.0, 1.0])}
    dcs = [{"w": np.array([1.0, 2.0])}, {"w": np.array([3.0, 2.0])}]
    # N = 4 registered clients: c + (|S|/N) mean(delta c) = c + sum/4
    np.testing.assert_allclose(scaffold_variate_update(c, dcs, 4)["w"], [1.0, 2.0])
    with pytest.raises(ValueError):
        scaffold_variate_update(c, dcs, 1)


def test_server_variate_stays_the_mean_of_client_variates():
    """Alg. 1: with c = c_i = 0 at start, c = (1/N) sum over ALL N clients of c_i after every round."""
    cfg = make_cfg(method="scaffold", server_lr=1.0)
    datas = {cid: make_data(cid) for cid in range(3)}
    states = {cid: RecordDict() for cid in datas}
    strategy = ScaffoldStrategy(cfg)
    register(strategy, datas)
    params = initial_params(cfg)
    from client_app.state import ClientState
    for rnd, sampled in enumerate([[0, 1], [1, 2], [0, 2]], start=1):
        params, _ = run_round(cfg, strategy, rnd, params, datas, states, sampled)
        c_is = [ClientState(states[i], i).get_arrays(STATE_C_I) for i in datas]
        assert sum(ci is None for ci in c_is) == (1 if rnd == 1 else 0)
        for k, c in strategy.c.items():
            mean = sum(ci[k] if ci is not None else 0.0 for ci in c_is) / 3
            np.testing.assert_allclose(c, mean, rtol=1e-4, atol=1e-6)


def test_update_without_delta_c_is_rejected():
    cfg = make_cfg(method="scaffold")
    params = initial_params(cfg)
    strategy = ScaffoldStrategy(cfg)
    strategy.train_content(1, 0, params)
    register_sizes(strategy, {5: 4})
    content = RecordDict({"arrays": params_to_record(params),
                          "metrics": MetricRecord({"num-examples": 4, "local-steps": 1})})
    updates, rejected = strategy.collect_updates(1, {5: SimpleNamespace(content=content)}, params)
    assert updates == [] and rejected[0].cid == 5 and DELTA_C in rejected[0].reason
    content[DELTA_C] = params_to_record({k: np.zeros((2, 2), np.float32) for k in list(params)[:1]})
    updates, rejected = strategy.collect_updates(1, {5: SimpleNamespace(content=content)}, params)
    assert updates == [] and "shape" in rejected[0].reason


def test_client_without_server_variate_fails_clearly():
    cfg = make_cfg(method="scaffold")
    job = make_job(cfg, 4, 1, initial_params(cfg), make_data(0), RecordDict())
    from client_app.trainers.scaffold import ScaffoldTrainer
    with pytest.raises(KeyError, match="client 4.*scaffold-c"):
        ScaffoldTrainer(job)


def test_state_dict_round_trip_and_config_errors():
    cfg = make_cfg(method="scaffold")
    strategy = ScaffoldStrategy(cfg)
    strategy.c = {"w": np.array([1.5, -2.0])}
    other = ScaffoldStrategy(cfg)
    other.load_state_dict(strategy.state_dict())
    np.testing.assert_array_equal(other.c["w"], [1.5, -2.0])
    with pytest.raises(ConfigError, match=bound_error("scaffold.option", "III", "one of I, II")):
        ScaffoldStrategy(make_cfg(method="scaffold", option="III"))
    with pytest.raises(ConfigError, match=bound_error("scaffold.server-lr", 0.0, "> 0, finite")):
        ScaffoldStrategy(make_cfg(method="scaffold", server_lr=0.0))


def test_aggregate_uses_registered_client_count():
    cfg = make_cfg(method="scaffold")
    strategy = ScaffoldStrategy(cfg)
    params = {"w": np.zeros(2, np.float32)}
    strategy.train_content(1, 0, params)
    register(strategy, {i: make_data(i) for i in range(5)})
    ups = [ClientUpdate(0, {"w": np.ones(2, np.float32)}, 3, {}, {DELTA_C: params_to_record({"w": np.full(2, 5.0, np.float32)})})]
    new = strategy.aggregate(1, params, ups)
    np.testing.assert_allclose(new["w"], [1.0, 1.0])
    np.testing.assert_allclose(strategy.c["w"], [1.0, 1.0])  # 5 / N=5
