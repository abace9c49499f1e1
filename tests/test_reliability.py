"""Issue 11: failures, bad updates, bad config, checkpoint/resume, reproducibility.

Runs the real round driver and ClientApp handlers through tests/fakegrid.py (no Ray: fast and exact).
"""

import json
import re

import numpy as np
import pytest
import torch

from flcore.config import ConfigError, RunConfig, resolve_run_config
from server_app.checkpoint import CheckpointError
import server_app.runner as runner
from server_app.runner import run_federation, wait_for_nodes_to_settle
from strategies.base import RoundFailed
from tests.fakegrid import FakeGrid


def cfg(tmp_path, name="run", **over):
    values = {"dataset": "digits", "num-server-rounds": 2, "out-dir": str(tmp_path / name), "batch-size": 16,
              "lr": 0.1, "federated-eval-every": 1, "local-test-fraction": 0.25, **over}
    return RunConfig.from_dict(resolve_run_config(values))


def final_params(out_dir):
    return torch.load(out_dir / "final_model.pt")


def test_federation_survives_misbehaving_clients_and_records_them(tmp_path):
    grid = FakeGrid(6, {1: "raise", 2: "nan", 3: "shape", 4: "silent", 5: "dead"})
    # FakeGrid answers every other message while they are pushed, before the round's wait starts: the wait
    # is for the silent client alone (each round), so a short round-timeout is as exact as a long one
    doc = run_federation(grid, cfg(tmp_path, **{"round-timeout": 0.5}))
    first = doc["rounds"][0]
    kinds = {(f["cid"], f["kind"]) for f in first["failures"]}
    assert {(1, "error"), (2, "rejected"), (3, "rejected"), (4, "timeout"), (5, "node-lost")} <= kinds
    reasons = {f["cid"]: f["reason"] for f in first["failures"]}
    assert "crashed on purpose" in reasons[1] and "NaN" in reasons[2] and "shape" in reasons[3]
    assert first["num_updates"] == 1 and first["sampled"] == [0, 1, 2, 3, 4, 5]
    # the dead node is forgotten and not sampled again until it re-registers
    assert 5 not in doc["rounds"][1]["sampled"]
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["final"]["total_failures"] >= 5
    # only client 0 contributed: the global model equals what client 0 alone produced (FedAvg of one)
    assert doc["final"]["global_accuracy"] is not None


def test_round_fails_loudly_when_too_few_updates(tmp_path):
    grid = FakeGrid(3, {0: "raise", 1: "raise", 2: "nan"})
    with pytest.raises(RoundFailed, match="fewer than min-train-replies=1 usable updates after 2 attempt"):
        run_federation(grid, cfg(tmp_path, **{"round-retries": 1}))


def test_min_train_replies_is_respected(tmp_path):
    grid = FakeGrid(4, {0: "raise"})
    with pytest.raises(RoundFailed, match="min-train-replies=4"):
        run_federation(grid, cfg(tmp_path, **{"min-train-replies": 4, "round-retries": 0}))


def test_fedavg_round_equals_weighted_mean_of_client_models(tmp_path):
    """One round through the real handlers: the new global model is the n_k-weighted mean."""
    from strategies.aggregation import weighted_average
    from strategies.methods.fedavg import FedAvgStrategy
    from flcore.records import model_params
    from models import build_model

    c = cfg(tmp_path, **{"num-server-rounds": 1})
    grid = FakeGrid(3)
    strat = FedAvgStrategy(c)
    params = model_params(build_model(c, (1, 8, 8), 10))
    outcome = strat.train_round(grid, 1, params)
    expect = weighted_average([u.params for u in outcome.updates], [u.num_examples for u in outcome.updates])
    assert [u.num_examples for u in outcome.updates] == [strat.clients[u.cid].num_examples for u in outcome.updates]
    for k in expect:
        assert np.allclose(outcome.params[k], expect[k])
        assert not np.allclose(outcome.params[k], params[k]) or k.startswith("head.weight") is False


@pytest.mark.parametrize("method", ["fedavg", "scaffold", "fedbc"])
def test_kill_and_resume_gives_identical_final_model(tmp_path, method):
    over = {"method": method, "num-server-rounds": 4, "fraction-train": 0.5, "min-train-nodes": 2,
            "client-state-dir": str(tmp_path / f"{method}-state-full")}
    run_federation(FakeGrid(4), cfg(tmp_path, "full", **over))
    # "killed" after round 2: a run configured for 2 rounds, then a fresh federation resumes it
    part = {**over, "client-state-dir": str(tmp_path / f"{method}-state-part")}
    run_federation(FakeGrid(4), cfg(tmp_path, "part", **{**part, "num-server-rounds": 2}))
    run_federation(FakeGrid(4), cfg(tmp_path, "part", **{**part, "resume-from": str(tmp_path / "part")}))
    a, b = final_params(tmp_path / "full"), final_params(tmp_path / "part")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{method}: tensor {k} differs after resume"
    full = json.loads((tmp_path / "full" / "results.json").read_text())["rounds"]
    resumed = json.loads((tmp_path / "part" / "results.json").read_text())["rounds"]
    assert [r["sampled"] for r in full] == [r["sampled"] for r in resumed]
    assert [r["global_accuracy"] for r in full] == [r["global_accuracy"] for r in resumed]


def test_resume_with_different_settings_is_refused(tmp_path):
    run_federation(FakeGrid(3), cfg(tmp_path, "a"))
    with pytest.raises(CheckpointError, match="lr: 0.1 -> 0.2"):
        run_federation(FakeGrid(3), cfg(tmp_path, "a", lr=0.2, **{"resume-from": str(tmp_path / "a")}))
    with pytest.raises(CheckpointError, match="no checkpoint"):
        run_federation(FakeGrid(3), cfg(tmp_path, "b", **{"resume-from": str(tmp_path / "nowhere")}))


def test_same_seed_same_results_different_seed_different(tmp_path):
    docs = [run_federation(FakeGrid(4), cfg(tmp_path, f"r{i}", seed=s)) for i, s in enumerate((3, 3, 4))]
    strip = lambda d: [{k: v for k, v in r.items() if k != "wall_time_s"} for r in d["rounds"]]  # noqa: E731
    assert strip(docs[0]) == strip(docs[1])
    assert strip(docs[0]) != strip(docs[2])


@pytest.mark.parametrize("over,match", [
    ({"method": "fedfoo"}, "'method' got 'fedfoo'; allowed: one of "),
    ({"dataset": "svhn"}, "'dataset' got 'svhn'; allowed: one of mnist, fmnist"),
    ({"partition": "zipf"}, "'partition' got 'zipf'; allowed: one of iid, dirichlet"),
    ({"lr": 0}, "'lr' got 0.0; allowed: > 0, finite"),
    ({"fraction-train": 0}, "'fraction-train' got 0.0; allowed: > 0, <= 1"),
])
def test_bad_config_fails_before_round_one(tmp_path, over, match):
    """The message names the key, the bad value and what is allowed (the declared bounds)."""
    with pytest.raises(ConfigError, match=re.escape(match)):
        cfg(tmp_path, **over)


def test_impossible_partition_names_the_setting(tmp_path):
    c = cfg(tmp_path, partition="classes", **{"classes-per-client": 2, "samples-per-class": 500})
    with pytest.raises(RoundFailed, match="samples-per-class"):
        run_federation(FakeGrid(4), c)


def test_federated_eval_clients_evaluates_a_fixed_seeded_sample(tmp_path):
    grid = FakeGrid(6)
    doc = run_federation(grid, cfg(tmp_path, **{"federated-eval-clients": 3, "num-server-rounds": 3}))
    evaluated = [sorted(int(c) for c in r["per_client"]) for r in doc["rounds"]]
    assert all(len(e) == 3 and r["num_evaluated"] == 3 for e, r in zip(evaluated, doc["rounds"]))
    assert evaluated[0] == evaluated[1] == evaluated[2]  # the same clients at every evaluation
    sent_to = {grid.node_ids.index(m.metadata.dst_node_id) for m in grid.sent if m.metadata.message_type == "evaluate"}
    assert sent_to == set(evaluated[0])  # the others were never asked


def test_federated_eval_sample_is_stable_as_clients_join_and_depends_on_the_seed():
    from strategies.base import ClientInfo, FLStrategy

    def pick(seed, n, m):
        s = FLStrategy(RunConfig.from_dict(resolve_run_config({"seed": seed, "federated-eval-clients": m})))
        for c in range(n):
            s.clients[c] = ClientInfo(c, 1000 + c, 10, [1] * 10)
        return s.registry.eval_cids()

    assert pick(0, 50, 0) == list(range(50)) and pick(0, 5, 10) == list(range(5))  # 0 or M >= N: everyone
    small, grown = pick(0, 50, 10), pick(0, 60, 10)
    assert len(small) == 10 and small == sorted(small)
    # a joining client only enters the sample by displacing one: at most 10 new clients among 10
    assert len(set(grown) - set(small)) <= len(set(grown) - set(range(50)))
    assert pick(1, 50, 10) != small


def test_a_node_that_cannot_register_is_recorded_and_asked_again_with_back_off(tmp_path):
    grid = FakeGrid(4, {3: "raise"}, behaviour_phases=("query",))  # its ClientApp fails at registration
    doc = run_federation(grid, cfg(tmp_path, **{"num-server-rounds": 4}))
    queries = [m.metadata.group_id for m in grid.sent
               if m.metadata.message_type == "query" and m.metadata.dst_node_id == grid.node_ids[3]]
    assert queries == ["0", "1", "3"]  # start-up, then after 1 and 2 more rounds (not every round)
    reg = {r["round"]: [f for f in r["failures"] if f["phase"] == "register"] for r in doc["rounds"]}
    assert [len(reg[r]) for r in (1, 2, 3, 4)] == [2, 0, 1, 0]  # start-up + round 1 reported in round 1
    assert "crashed on purpose" in reg[1][0]["reason"] and f"node {grid.node_ids[3]}" in reg[1][0]["reason"]
    assert all(3 not in r["sampled"] for r in doc["rounds"])  # the other three clients carry on
    assert doc["final"]["global_accuracy"] is not None


class GrowingGrid(FakeGrid):
    """Nodes appear a few at a time, as Flower's Ray simulation registers them while the ServerApp runs."""

    nodes_fixed_at_start = False

    def __init__(self, num_nodes: int, per_look: int) -> None:
        super().__init__(num_nodes)
        self.visible, self.per_look = 0, per_look

    def get_node_ids(self):
        self.visible = min(len(self.node_ids), self.visible + self.per_look)
        return self.node_ids[:self.visible]


def test_a_grid_whose_nodes_are_fixed_is_counted_without_polling(monkeypatch):
    """The in-process grids make every node with the grid: counted at the first look, no poll interval waited
    (a growing grid still polls until its count is stable, the test below)."""
    def no_sleep(seconds):
        raise AssertionError(f"waited {seconds} s for a grid whose nodes cannot change")

    monkeypatch.setattr(runner.time, "sleep", no_sleep)
    assert wait_for_nodes_to_settle(FakeGrid(5), timeout=30.0) == 5
    with pytest.raises(AssertionError, match="waited"):
        wait_for_nodes_to_settle(GrowingGrid(6, per_look=2), timeout=30.0)


def test_the_federation_is_counted_once_every_node_has_registered(tmp_path):
    grid = GrowingGrid(6, per_look=2)
    doc = run_federation(grid, cfg(tmp_path, **{"num-server-rounds": 1}))
    assert doc["final"]["num_clients"] == 6 and doc["rounds"][0]["sampled"] == [0, 1, 2, 3, 4, 5]
