"""Issue 20 items 2, 3 and 6: aggregation weights come from registration, updates are screened relative to
the round, and checkpoints / client-state files load without running code."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import Message

from flcore import safe_files
from flcore.config import RunConfig, resolve_run_config
from flcore.records import params_to_record, record_to_params
from server_app.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from server_app.runner import run_federation
from strategies.aggregation import weighted_average
from tests.fakegrid import FakeGrid

BASE = {"dataset": "digits", "num-server-rounds": 1, "batch-size": 16, "max-local-steps": 2, "model": "mlp",
        "checkpoint": False, "min-train-nodes": 4}


class CheatingGrid(FakeGrid):
    """Client 1 claims a billion samples; client 2 returns a model 900 away from the global one."""

    def __init__(self) -> None:
        super().__init__(4)
        self.train_replies: dict[int, Message] = {}

    def _deliver(self, msg: Message) -> Message | None:
        reply = super()._deliver(msg)
        if msg.metadata.message_type != "train":
            return reply
        cid = self.node_ids.index(msg.metadata.dst_node_id)
        if cid == 1:
            reply.content["metrics"]["num-examples"] = 10**9
        if cid == 2:
            sent = record_to_params(msg.content["arrays"])
            key = next(k for k, v in sent.items() if v.dtype == np.float32 and v.size > 100)
            params = OrderedDict(record_to_params(reply.content["arrays"]))
            direction = np.ones_like(params[key]) / np.sqrt(params[key].size)
            params[key] = (sent[key] + 900.0 * direction).astype(np.float32)
            reply.content["arrays"] = params_to_record(params)
        self.train_replies[cid] = reply
        return reply


def test_claimed_sample_counts_and_outlier_updates_are_rejected(tmp_path):
    grid = CheatingGrid()
    cfg = RunConfig.from_dict(resolve_run_config({**BASE, "out-dir": str(tmp_path / "r")}))
    doc = run_federation(grid, cfg)
    row = doc["rounds"][0]
    reasons = {f["cid"]: f["reason"] for f in row["failures"]}
    assert "claims num-examples=1000000000" in reasons[1] and "registered" in reasons[1]
    assert "update-norm-factor" in reasons[2] and "median update norm" in reasons[2]
    assert row["num_updates"] == 2 and cfg.max_update_norm == 1000.0  # 900 < the absolute bound: caught relatively
    # the global model is the registered-count weighted mean of the two honest clients
    honest = [0, 3]
    sizes = [int(grid.train_replies[c].content["metrics"]["num-examples"]) for c in honest]  # = registered
    expected = weighted_average([record_to_params(grid.train_replies[c].content["arrays"]) for c in honest], sizes)
    final = torch.load(tmp_path / "r" / "final_model.pt")
    for k, v in expected.items():
        np.testing.assert_allclose(final[k].numpy(), v, rtol=1e-6, atol=1e-7)


def test_update_norm_factor_zero_turns_the_relative_screen_off(tmp_path):
    cfg = RunConfig.from_dict(resolve_run_config({**BASE, "update-norm-factor": 0.0, "out-dir": str(tmp_path / "r")}))
    doc = run_federation(CheatingGrid(), cfg)
    assert {f["cid"] for f in doc["rounds"][0]["failures"]} == {1}  # only the count liar


def _ckpt(tmp_path, **over):
    state = {"rng": np.random.default_rng(0).bit_generator.state, "c": OrderedDict(w=np.arange(3.0)),
             "lam": {3: np.float64(0.5)}, "pair": (1, "a")}
    save_checkpoint(tmp_path / "checkpoint.pt", server_round=2, params={"w": np.ones(2, np.float32)},
                    strategy_state=state, rounds=[{"round": 1}], run_config={"method": "fedavg", **over})
    return state


def test_checkpoints_round_trip_in_the_safe_format(tmp_path):
    state = _ckpt(tmp_path)
    back = load_checkpoint(str(tmp_path), {"method": "fedavg"})
    assert back["round"] == 2 and back["rounds"] == [{"round": 1}]
    np.testing.assert_array_equal(back["params"]["w"], np.ones(2, np.float32))
    np.testing.assert_array_equal(back["strategy"]["c"]["w"], state["c"]["w"])
    assert back["strategy"]["lam"] == {3: 0.5} and back["strategy"]["pair"] == (1, "a")
    assert back["strategy"]["rng"] == state["rng"]


class Boom:
    def __reduce__(self):
        return (print, ("code ran while loading",))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path, capsys):
    torch.save({"format": "checkpoint", "version": safe_files.VERSION, "payload": {"x": Boom()}},
               tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="not a safe checkpoint file"):
        load_checkpoint(str(tmp_path), {})
    assert "code ran" not in capsys.readouterr().out


def test_other_kinds_versions_and_incomplete_checkpoints_are_refused_by_name(tmp_path):
    safe_files.save(tmp_path / "checkpoint.pt", "client-state", {"a": 1})
    with pytest.raises(CheckpointError, match="is not a checkpoint file .*client-state"):
        load_checkpoint(str(tmp_path), {})
    torch.save({"format": "checkpoint", "version": 1, "payload": {}}, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="format version 1"):
        load_checkpoint(str(tmp_path), {})
    safe_files.save(tmp_path / "checkpoint.pt", "checkpoint", {"round": 1, "params": {}})
    with pytest.raises(CheckpointError, match="lacks strategy, rounds, run_config"):
        load_checkpoint(str(tmp_path), {})
    _ckpt(tmp_path, method="scaffold")
    with pytest.raises(CheckpointError, match="different run config .*method: 'scaffold' -> 'fedavg'"):
        load_checkpoint(str(tmp_path), {"method": "fedavg"})
