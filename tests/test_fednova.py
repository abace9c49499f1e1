"""FedNova (issue 3): ||a_k||_1 for SGD and momentum, reduction to FedAvg, unequal steps by hand."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict

from flcore.records import params_to_record
from strategies.aggregation import weighted_average
from strategies.base import ClientUpdate
from strategies.methods.fednova import FedNovaStrategy, a_norm, fednova_aggregate
from tests._baselines_util import make_cfg, register_sizes


def test_a_norm_plain_sgd_is_the_step_count():
    assert a_norm(7, 0.0) == 7.0


@pytest.mark.parametrize("steps,rho", [(1, 0.9), (5, 0.5), (12, 0.9)])
def test_a_norm_with_momentum_matches_torch_sgd(steps, rho):
    # sum of the per-gradient weights sum_{m=1..tau} (1 - rho^m)/(1 - rho) ...
    brute = sum((1 - rho ** m) / (1 - rho) for m in range(1, steps + 1))
    assert a_norm(steps, rho) == pytest.approx(brute)
    # ... is the displacement of PyTorch momentum SGD (lr 1) driven by a constant unit gradient
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1.0, momentum=rho)
    for _ in range(steps):
        opt.zero_grad()
        w.grad = torch.ones(1)
        opt.step()
    assert -w.item() == pytest.approx(a_norm(steps, rho), rel=1e-5)


def test_equal_step_counts_give_fedavg():
    x = {"w": np.array([0.0, 1.0], np.float32)}
    ps = [{"w": np.array([1.0, 1.0], np.float32)}, {"w": np.array([3.0, -1.0], np.float32)}]
    new, tau_eff = fednova_aggregate(x, ps, [1, 3], [a_norm(4, 0.9)] * 2)
    np.testing.assert_allclose(new["w"], weighted_average(ps, [1, 3])["w"], rtol=1e-6)
    assert tau_eff == pytest.approx(a_norm(4, 0.9))


def test_unequal_steps_by_hand():
    # p = (0.5, 0.5), tau = (1, 3): tau_eff = 2; w = x + 2 (0.5 (1 - 0)/1 + 0.5 (3 - 0)/3) = 2
    new, tau_eff = fednova_aggregate({"w": np.array([0.0])}, [{"w": np.array([1.0])}, {"w": np.array([3.0])}],
                                     [1, 1], [1.0, 3.0])
    assert tau_eff == 2.0
    np.testing.assert_allclose(new["w"], [2.0])  # FedAvg would give 2.0 too here; see next line
    new2, _ = fednova_aggregate({"w": np.array([0.0])}, [{"w": np.array([1.0])}, {"w": np.array([6.0])}],
                                [1, 1], [1.0, 3.0])
    np.testing.assert_allclose(new2["w"], [2 * (0.5 + 1.0)])  # 3.0, vs FedAvg's 3.5


def test_strategy_reads_local_steps_and_momentum():
    cfg = make_cfg(method="fednova", momentum=0.5)
    s = FedNovaStrategy(cfg)
    x = {"w": np.array([0.0], np.float32)}
    ups = [ClientUpdate(0, {"w": np.array([1.0], np.float32)}, 2, {"local-steps": 2}, {}),
           ClientUpdate(1, {"w": np.array([4.0], np.float32)}, 1, {"local-steps": 8}, {})]
    a = [a_norm(2, 0.5), a_norm(8, 0.5)]
    p = np.array([2 / 3, 1 / 3])
    expected = np.dot(p, a) * (p[0] * 1.0 / a[0] + p[1] * 4.0 / a[1])
    np.testing.assert_allclose(s.aggregate(1, x, ups)["w"], [expected], rtol=1e-6)
    assert s.round_metrics()["fednova-tau-eff"] == pytest.approx(np.dot(p, a))


def test_reply_without_steps_is_rejected():
    s = FedNovaStrategy(make_cfg(method="fednova"))
    register_sizes(s, {2: 3})
    x = {"w": np.zeros(1, np.float32)}
    zero = RecordDict({"arrays": params_to_record(x), "metrics": MetricRecord({"num-examples": 3, "local-steps": 0})})
    updates, rejected = s.collect_updates(1, {2: SimpleNamespace(content=zero)}, x)
    assert updates == [] and "local-steps" in rejected[0].reason
