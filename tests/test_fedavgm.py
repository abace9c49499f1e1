"""FedAvgM (issue 39 item 4): two server steps by hand, the same steps as Flower's own FedAvgM, beta = 0 and
eta_s = 1 being FedAvg bit for bit on the known-output federation, the momentum buffer surviving a checkpoint
(a resumed run equals the uninterrupted one bit for bit, and does not without the buffer), and the bounds."""

import json
import math

import numpy as np
import pytest
import torch

from flcore.config import ConfigError, RunConfig, resolve_run_config
from server_app.runner import run_federation
from strategies.base import ClientUpdate
from strategies.methods.fedavgm import FedAvgMStrategy, fedavgm_step
from tests._baselines_util import bound_error, make_cfg
from tests.fakegrid import FakeGrid
from tests.known_outputs import COMMON, NUM_NODES, run_job

W0 = {"w": np.array([1.0, -2.0], np.float32), "n": np.array([10], np.int64)}  # "n": an integer buffer


def updates(*models):
    return [ClientUpdate(i, {"w": np.asarray(w, np.float32), "n": np.asarray([c], np.int64)}, size, {}, {})
            for i, (w, c, size) in enumerate(models)]


def strategy(beta, lr):
    return FedAvgMStrategy(make_cfg(method="fedavgm", **{"fedavgm.server-momentum": beta, "fedavgm.server-lr": lr}))


def test_two_server_steps_by_hand():
    # dyadic values, so every step below is exact in float32 and float64
    s = strategy(0.5, 2.0)
    # round 1: a_1 = (1 * [3, -4] + 3 * [2, -3]) / 4 = [2.25, -3.25]; Delta_1 = w_0 - a_1 = [-1.25, 1.25]
    # v_1 = 0.5 * 0 + Delta_1; w_1 = w_0 - 2 v_1 = [3.5, -4.5]; n: FedAvg's rounded mean rint(0.25 * 12 + 0.75 * 16)
    w1 = s.aggregate(1, W0, updates(([3.0, -4.0], 12, 1), ([2.0, -3.0], 16, 3)))
    np.testing.assert_array_equal(w1["w"], np.array([3.5, -4.5], np.float32))
    np.testing.assert_array_equal(s.momentum["w"], [-1.25, 1.25])
    assert w1["w"].dtype == np.float32 and w1["n"].dtype == np.int64 and w1["n"].tolist() == [15]
    assert list(s.momentum) == ["w"]  # no momentum for the integer buffer
    # round 2: a_2 = [4, -5]; Delta_2 = [-0.5, 0.5]; v_2 = 0.5 * v_1 + Delta_2 = [-1.125, 1.125]
    # w_2 = w_1 - 2 v_2 = [5.75, -6.75]: FedAvg would stop at a_2, momentum carries round 1's direction on
    w2 = s.aggregate(2, w1, updates(([4.0, -5.0], 20, 5)))
    np.testing.assert_array_equal(w2["w"], np.array([5.75, -6.75], np.float32))
    np.testing.assert_array_equal(s.momentum["w"], [-1.125, 1.125])
    assert w2["n"].tolist() == [20]
    metrics = s.round_metrics()
    assert metrics["fedavgm-momentum-norm"] == pytest.approx(1.125 * math.sqrt(2), rel=1e-15)
    assert metrics["fedavgm-pseudo-gradient-norm"] == pytest.approx(0.5 * math.sqrt(2), rel=1e-15)


def test_the_step_is_w_minus_eta_v_in_its_exact_rewriting():
    """fedavgm_step computes w - eta v as a + ((1 - eta) Delta - eta beta v_prev): equal to rounding on random
    values, and with beta = 0, eta = 1 exactly FedAvg's mean a (bit for bit, where w - (w - a) is not)."""
    rng = np.random.default_rng(0)
    w, a, v = ({"x": rng.standard_normal(1000)} for _ in range(3))
    new_w, new_v = fedavgm_step(w, a, v, 0.7, 1.3)
    np.testing.assert_allclose(new_v["x"], 0.7 * v["x"] + (w["x"] - a["x"]), rtol=0, atol=0)
    np.testing.assert_allclose(new_w["x"], w["x"] - 1.3 * new_v["x"], rtol=1e-12, atol=1e-12)
    fedavg_w, _ = fedavgm_step(w, a, v, 0.0, 1.0)
    np.testing.assert_array_equal(fedavg_w["x"], a["x"])
    assert not np.array_equal(w["x"] - (w["x"] - a["x"]), a["x"])  # why the rewriting


def test_matches_flowers_fedavgm_over_three_rounds():
    """Flower's own FedAvgM (flwr.serverapp.strategy.FedAvgM.aggregate_train) on the same replies: the same models
    to float32 rounding (Flower averages and steps in float32, we in float64)."""
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import FedAvgM

    FakeGrid(1)  # sets the server's task identity (as Flower does in a ServerApp's process): Messages need it
    rng = np.random.default_rng(1)
    ours, flower = strategy(0.9, 0.7), FedAvgM(server_momentum=0.9, server_learning_rate=0.7)
    w = {"w": rng.standard_normal((3, 4)).astype(np.float32)}
    flower.current_arrays = ArrayRecord({"w": Array(w["w"].copy())})
    for rnd in (1, 2, 3):
        models = [(w["w"] + rng.standard_normal((3, 4)).astype(np.float32), int(n)) for n in rng.integers(5, 50, 3)]
        contents = [RecordDict({"arrays": ArrayRecord({"w": Array(m)}), "metrics": MetricRecord({"num-examples": n})})
                    for m, n in models]
        replies = [Message(c, dst_node_id=1, message_type="train") for c in contents]
        theirs, _ = flower.aggregate_train(rnd, replies)
        w = ours.aggregate(rnd, w, [ClientUpdate(i, {"w": m}, n, {}, {}) for i, (m, n) in enumerate(models)])
        np.testing.assert_allclose(w["w"], theirs["w"].numpy(), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(ours.momentum["w"], flower.momentum_vector[0], rtol=1e-5, atol=1e-5)


def tiny(**extra):
    values = resolve_run_config({**COMMON, **extra})
    values.pop("out-dir")
    return values


def test_beta_zero_and_unit_server_lr_is_fedavg_bit_for_bit(tmp_path):
    """The known-output federation (4 digits clients, 2 rounds): beta = 0, eta_s = 1 ends with FedAvg's parameters
    and metrics exactly; the default beta = 0.9 moves the second round's model (round 1: v_1 = Delta_1, so
    w_1 = FedAvg's at eta_s = 1)."""
    fedavg = run_job(tiny(method="fedavg"), tmp_path / "fedavg")
    off = run_job(tiny(method="fedavgm", **{"fedavgm.server-momentum": 0.0, "fedavgm.server-lr": 1.0}),
                  tmp_path / "off")
    default = run_job(tiny(method="fedavgm"), tmp_path / "default")
    assert off.digest == fedavg.digest
    assert default.metrics[0] == fedavg.metrics[0] and default.metrics[1] != fedavg.metrics[1]
    assert default.digest.split(":")[0] != fedavg.digest.split(":")[0]


def _federation(out, rounds, **extra):
    cfg = RunConfig.from_dict(resolve_run_config({**COMMON, "method": "fedavgm", "checkpoint": True,
                                                  "num-server-rounds": rounds, "out-dir": str(out), **extra}))
    run_federation(FakeGrid(NUM_NODES), cfg)
    return torch.load(out / "final_model.pt"), json.loads((out / "results.json").read_text())["rounds"]


def test_the_momentum_buffer_survives_a_checkpoint(tmp_path, monkeypatch):
    """4 rounds uninterrupted == 2 rounds, then resumed from that checkpoint for 2 more, bit for bit (final model,
    every round's accuracy and momentum norm); resumed without the buffer (v reset to zero), the run differs."""
    full, full_rows = _federation(tmp_path / "full", 4)
    _federation(tmp_path / "part", 2)
    part, part_rows = _federation(tmp_path / "part", 4, **{"resume-from": str(tmp_path / "part")})
    assert full.keys() == part.keys() and all(torch.equal(full[k], part[k]) for k in full)
    assert [r["global_accuracy"] for r in part_rows] == [r["global_accuracy"] for r in full_rows]
    assert [r["strategy"] for r in part_rows] == [r["strategy"] for r in full_rows]
    assert full_rows[2]["strategy"]["fedavgm-momentum-norm"] > 0

    from strategies.base import FLStrategy

    monkeypatch.setattr(FedAvgMStrategy, "load_state_dict", FLStrategy.load_state_dict)  # forget v on resume
    _federation(tmp_path / "lost", 2)
    lost, _ = _federation(tmp_path / "lost", 4, **{"resume-from": str(tmp_path / "lost")})
    assert not all(torch.equal(full[k], lost[k]) for k in full)


def test_state_dict_round_trip_gives_the_same_next_step():
    a = strategy(0.9, 1.0)
    w1 = a.aggregate(1, W0, updates(([3.0, -4.0], 12, 1)))
    b = strategy(0.9, 1.0)
    b.load_state_dict(a.state_dict())
    ups = updates((w1["w"] + 1.0, 12, 1))
    np.testing.assert_array_equal(a.aggregate(2, w1, ups)["w"], b.aggregate(2, w1, ups)["w"])
    np.testing.assert_array_equal(a.momentum["w"], b.momentum["w"])


def test_defaults_and_bounds_name_the_key():
    flat = make_cfg(method="fedavgm").to_dict()
    assert (flat["fedavgm.server-momentum"], flat["fedavgm.server-lr"]) == (0.9, 1.0)
    for key, value, allowed in [("fedavgm.server-momentum", 1.0, ">= 0, < 1, finite"),
                                ("fedavgm.server-momentum", -0.1, ">= 0, < 1, finite"),
                                ("fedavgm.server-momentum", math.nan, ">= 0, < 1, finite"),
                                ("fedavgm.server-lr", 0.0, "> 0, finite"),
                                ("fedavgm.server-lr", math.inf, "> 0, finite")]:
        with pytest.raises(ConfigError, match=bound_error(key, value, allowed)):
            make_cfg(method="fedavgm", **{key: value})
