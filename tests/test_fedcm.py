"""FedCM (Xu et al. 2021, issue 41): the client-level momentum v = alpha g + (1 - alpha) Delta and the server's
Delta by hand, one local step against a hand computation, the server state over two rounds (Delta broadcast
to the clients), alpha = 1 being FedAvg bit for bit, and the bounds."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_app.trainers.fedcm import ClientMomentumTerm, FedCMTrainer, client_momentum
from flcore.config import ConfigError
from flcore.methods.fedcm import DELTA
from flcore.records import params_to_record, record_to_params
from strategies.aggregation import weighted_average
from strategies.methods.fedcm import FedCMStrategy, global_momentum
from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job, register, run_round
from tests.known_outputs import COMMON, run_job


def test_client_momentum_by_hand():
    g = torch.tensor([1.0, -2.0])
    # 0.1 * [1, -2] + 0.9 * [3, 1] = [2.8, 0.7]
    torch.testing.assert_close(client_momentum(g, torch.tensor([3.0, 1.0]), 0.1), torch.tensor([2.8, 0.7]))


def test_global_momentum_by_hand():
    x = {"w": np.array([1.0, 2.0], np.float32), "n": np.array(3, np.int64)}
    ys = [{"w": np.array([0.0, 1.0], np.float32), "n": np.array(5, np.int64)},
          {"w": np.array([1.0, 0.0], np.float32), "n": np.array(5, np.int64)}]
    # p = (1/4, 3/4); (x - y1)/(0.5 * 2) = [1, 1], (x - y2)/(0.5 * 1) = [0, 4]: Delta = [.25, .25] + [0, 3]
    out = global_momentum(x, ys, [1.0, 3.0], [2.0, 1.0], 0.5)
    np.testing.assert_allclose(out["w"], [0.25, 3.25])
    assert list(out) == ["w"]                               # integer buffers carry no gradient
    with pytest.raises(ValueError, match="steps and lr > 0"):
        global_momentum(x, ys, [1.0, 3.0], [2.0, 0.0], 0.5)


def test_one_local_step_by_hand():
    """One full-batch step without momentum: y_1 = x - lr (alpha grad f(x) + (1 - alpha) Delta)."""
    data = make_data(0, n=24)
    cfg = make_cfg(method="fedcm", momentum=0.0, weight_decay=0.0, batch_size=24, max_local_steps=1,
                   **{"fedcm.alpha": 0.3})
    params = initial_params(cfg)
    delta = {k: np.full(np.shape(v), 0.2, np.float32) for k, v in params.items()}
    content = RecordDict({DELTA: params_to_record(delta)})
    job = make_job(cfg, 0, 1, params, data, RecordDict(), content)
    ref = make_job(cfg, 0, 1, params, data, RecordDict()).model
    F.cross_entropy(ref(data.x_train), data.y_train).backward()
    FedCMTrainer(job).fit()
    for name, p in job.model.named_parameters():
        x0 = torch.from_numpy(params[name])
        expect = x0 - 0.1 * (0.3 * dict(ref.named_parameters())[name].grad + 0.7 * 0.2)
        torch.testing.assert_close(p.detach(), expect, rtol=1e-5, atol=1e-6)


def test_server_keeps_and_sends_delta():
    """Round 1 (Delta_0 = 0 sent): the server's new Delta is global_momentum of the round's models, its model the
    FedAvg mean; round 2's messages carry that Delta."""
    cfg = make_cfg(method="fedcm", momentum=0.0)
    datas = {cid: make_data(cid) for cid in range(3)}
    strategy = FedCMStrategy(cfg)
    register(strategy, datas)
    params = initial_params(cfg)
    states = {cid: RecordDict() for cid in datas}
    content = strategy.train_content(1, 0, params)
    assert all(not np.any(v) for v in record_to_params(content[DELTA]).values())
    new, updates = run_round(cfg, strategy, 1, params, datas, states, [0, 1, 2])
    weights = [u.num_examples for u in updates]
    mean = weighted_average([u.params for u in updates], weights)
    for k in params:
        np.testing.assert_array_equal(new[k], mean[k])
    expect = global_momentum(params, [u.params for u in updates], weights,
                             [u.metrics["local-steps"] for u in updates], cfg.lr)
    for k in expect:
        np.testing.assert_allclose(strategy.delta[k], expect[k])
    sent = record_to_params(strategy.train_content(2, 1, new)[DELTA])
    for k in expect:
        np.testing.assert_array_equal(sent[k], strategy.delta[k].astype(np.float32))
    assert strategy.round_metrics()["fedcm-delta-norm"] > 0
    state = strategy.state_dict()
    other = FedCMStrategy(cfg)
    other.load_state_dict(state)
    for k in expect:
        np.testing.assert_array_equal(other.delta[k], strategy.delta[k])


def test_alpha_one_is_fedavg_bit_for_bit(tmp_path):
    from flcore.config import resolve_run_config

    def run(name, **extra):
        values = resolve_run_config({**COMMON, **extra})       # 2 rounds: Delta_1 is nonzero in round 2
        values.pop("out-dir")
        return run_job(values, tmp_path / name)

    fedavg = run("fedavg", method="fedavg")
    assert run("one", method="fedcm", **{"fedcm.alpha": 1.0}).digest == fedavg.digest
    assert run("cm", method="fedcm").digest.split(":")[0] != fedavg.digest.split(":")[0]


def test_term_skips_parameters_without_gradient_and_config_bounds():
    p = torch.nn.Parameter(torch.ones(2))
    model = torch.nn.Module()
    model.register_parameter("w", p)
    term = ClientMomentumTerm({"w": torch.tensor([1.0, 1.0])}, 0.5)
    term.begin(model)
    term.on_gradients(model)                     # no grad yet: nothing to correct
    assert p.grad is None
    assert make_cfg(method="fedcm").momentum == 0.0      # the recipe: plain SGD (Alg. 1)
    for key, value, allowed in [("fedcm.alpha", 0.0, "> 0, <= 1, finite"), ("fedcm.server-lr", 0.0, "> 0, finite")]:
        with pytest.raises(ConfigError, match=bound_error(key, value, allowed)):
            make_cfg(method="fedcm", **{key: value})


@pytest.mark.slow
def test_it_learns_beside_fedavg(tmp_path):
    """digits, 10 clients, Dirichlet(0.1), 15 rounds (tests/_learning_util.py): FedCM's global model is within 0.1
    of FedAvg's and well above chance (0.1), its local accuracy within 0.1 of FedAvg's; its global momentum is
    active (nonzero norm every round). Measured 2026-12-01 (means of the last 3 rounds): G-FL / P-FL FedAvg
    0.808 / 0.879, FedCM 0.742 / 0.856."""
    from tests._learning_util import fedavg_doc, final, run
    fedavg, fedcm = fedavg_doc(), run(tmp_path, "fedcm")
    assert final(fedcm, "global_accuracy") >= final(fedavg, "global_accuracy") - 0.1
    assert final(fedcm, "global_accuracy") > 0.6
    assert final(fedcm, "local_accuracy") >= final(fedavg, "local_accuracy") - 0.1
    assert all(r["strategy"]["fedcm-delta-norm"] > 0 for r in fedcm["rounds"])
