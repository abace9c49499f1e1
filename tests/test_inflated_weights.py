"""Issue 42, item 2: one participant cannot take over the global model by the size it claims.

The attack (measured on a live federation in the issue): register with num-examples = 10^9, then reply with
-3 x the global model. Under node bindings (a deployment), a bound client's weight is its claim capped at
``examples-cap-ratio`` x the median claim, or the size the operator declared, and its screen is at most the
median client's, so the claim neither outweighs the others nor widens the update screen, which then rejects
the update. No max-local-steps: the claimed 10^9 samples would otherwise allow 6 x 10^7 local steps. Runs the real ServerApp
round and ClientApp through tests/fakegrid.py."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord

from flcore import node_bindings as nb
from flcore import protocol
from flcore.config import RunConfig, resolve_run_config
from flcore.records import params_to_record, record_to_params
from server_app.runner import run_federation
from strategies.client_registry import ClientInfo, ClientRegistry
from tests.fakegrid import FakeGrid

HUGE = 10**9
JOB = {"dataset": "digits", "num-server-rounds": 3, "batch-size": 16, "lr": 0.05, "max-local-steps": 0,
       "model": "mlp", "checkpoint": False, "seed": 3, "min-train-nodes": 4}
KEY = "ecdsa-sha2-nistp384 AAAA"


def inflate(msg, reply):
    """Client 0: claims 10^9 samples at registration and in every reply, and replies -3 x the global model."""
    mtype = msg.metadata.message_type
    if mtype == protocol.QUERY:
        info = dict(reply.content["info"])
        counts = [HUGE] + [0] * (len(info["class-counts"]) - 1)
        reply.content["info"] = ConfigRecord({**info, "num-examples": HUGE, "class-counts": counts})
    elif mtype == protocol.TRAIN:
        sent = record_to_params(msg.content["arrays"])
        reply.content["arrays"] = params_to_record(OrderedDict((k, -3 * v) for k, v in sent.items()))
        reply.content["metrics"]["num-examples"] = HUGE
    return reply


def run(tmp_path, name, behaviours, bindings=None, monkeypatch=None, **over):
    phases = ("query", "train") if any(callable(b) for b in behaviours.values()) else ("train",)
    grid = FakeGrid(4, behaviours, behaviour_phases=phases)
    if bindings is not None:
        table = tmp_path / f"{name}-bindings.json"
        nb.write(table, [nb.Binding(n, i, KEY + chr(65 + i), bindings.get(i)) for i, n in enumerate(grid.node_ids)])
        monkeypatch.setenv(nb.ENV, str(table))
    cfg = RunConfig.from_dict(resolve_run_config({**JOB, **over, "out-dir": str(tmp_path / name)}))
    doc = run_federation(grid, cfg)
    monkeypatch.delenv(nb.ENV, raising=False) if monkeypatch is not None else None
    return doc, torch.load(tmp_path / name / "final_model.pt")


def test_a_claim_of_a_billion_samples_neither_weighs_nor_widens_the_screen_under_bindings(tmp_path, monkeypatch):
    attacked, params = run(tmp_path, "attacked", {0: inflate}, bindings={}, monkeypatch=monkeypatch)
    rejected, ref = run(tmp_path, "rejected", {0: "nan"}, bindings={}, monkeypatch=monkeypatch)
    for row in attacked["rounds"]:
        mine = [f for f in row["failures"] if f["cid"] == 0]
        assert mine and mine[0]["kind"] == "rejected" and "update norm" in mine[0]["reason"], row["failures"]
        assert row["num_updates"] == 3
    # client 0 rejected every round: the global model is the one of a run whose client 0 sends NaN, bit for bit
    assert all(torch.equal(params[k], ref[k]) for k in ref)
    assert attacked["final"]["global_accuracy"] == rejected["final"]["global_accuracy"]


def test_without_bindings_the_claim_is_trusted_and_the_attack_works(tmp_path, monkeypatch):
    """Simulation (no NODE_BINDINGS): the server's own partition, claims used as they are — which is why a
    deployment must bind node keys (docs/DEPLOYMENT.md). Measured here so the difference is not an assumption."""
    monkeypatch.delenv(nb.ENV, raising=False)
    honest, _ = run(tmp_path, "honest", {})
    attacked, _ = run(tmp_path, "open", {0: inflate})
    assert attacked["rounds"][0]["num_updates"] == 4  # accepted: its weight ~ 1
    assert attacked["final"]["global_accuracy"] < honest["final"]["global_accuracy"] - 0.3


def test_a_bound_client_claiming_more_than_its_declared_size_is_refused(tmp_path, monkeypatch):
    doc, _ = run(tmp_path, "declared", {0: inflate}, bindings={0: 300}, monkeypatch=monkeypatch,
                 **{"min-train-nodes": 3})
    assert all(0 not in row["sampled"] for row in doc["rounds"])
    reasons = [f["reason"] for row in doc["rounds"] for f in row["failures"] if f["kind"] == "examples-mismatch"]
    assert reasons and f"claims {HUGE} training samples, but the operator declared 300" in reasons[0]


def _registry(cfg_over, claims, declared):
    cfg = RunConfig.from_dict(resolve_run_config(cfg_over))
    reg = ClientRegistry(cfg, query=lambda: None)
    reg.clients = {c: ClientInfo(c, 100 + c, n, [n]) for c, n in claims.items()}
    return reg, declared


def test_the_weight_is_the_claim_capped_at_the_ratio_times_the_median_claim(tmp_path, monkeypatch):
    table = tmp_path / "b.json"
    nb.write(table, [nb.Binding(100 + c, c, KEY + chr(65 + c), 50 if c == 3 else None) for c in range(4)])
    monkeypatch.setenv(nb.ENV, str(table))
    reg, _ = _registry({"examples-cap-ratio": 4.0}, {0: HUGE, 1: 100, 2: 300, 3: 50}, None)
    assert reg._node_owners() == {100: 0, 101: 1, 102: 2, 103: 3}
    median = float(np.median([HUGE, 100, 300, 50]))  # 200
    assert [reg.weight_samples(c) for c in range(4)] == [int(4 * median), 100, 300, 50]
    assert [reg.screen_samples(c) for c in range(4)] == [int(median), 100, int(median), 50]  # 3 is declared
    assert reg.registered_samples(0) == HUGE  # replies are still checked against the claim
    monkeypatch.delenv(nb.ENV)
    plain, _ = _registry({}, {0: HUGE, 1: 100}, None)
    assert plain.weight_samples(0) == HUGE  # no bindings: the claim


def test_bindings_parse_the_declared_size_and_refuse_a_bad_one(tmp_path):
    table = tmp_path / "b.json"
    nb.write(table, [nb.Binding(7, 0, KEY + "A", 600), nb.Binding(8, 1, KEY + "B")])
    loaded = nb.load(table)
    assert nb.declared_examples(loaded) == {0: 600} and loaded[1].examples is None
    with pytest.raises(ValueError, match="entry 0: examples must be an integer"):
        nb.parse({"version": 1, "nodes": [{"node_id": 7, "client_id": 0, "public_key": KEY, "examples": 0}]})
    with pytest.raises(ValueError, match="entry 0 must have node_id"):
        nb.parse({"version": 1, "nodes": [{"node_id": 7, "client_id": 0, "public_key": KEY, "size": 3}]})
