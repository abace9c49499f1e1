"""Guards for the method structure (issue 16): the contract every registered method keeps, the import seam
between the server and client sides, a method registered from outside the project, and the registry's
refusal of a duplicate client id."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Message

from client_app.trainers.base import Trainer
from client_app.training import LossTerm
from flcore import protocol
from flcore.config import PROJECT_ROOT, RunConfig, resolve_run_config
from flcore.registry import MethodDecl, Payload, get_method, methods, register, unregister
from server_app.checkpoint import load_checkpoint, save_checkpoint
from server_app.runner import build_strategy, run_federation
from strategies.base import FLStrategy
from tests.fakegrid import FakeGrid

TINY = {"dataset": "digits", "num-server-rounds": 1, "batch-size": 16, "max-local-steps": 2, "model": "mlp",
        "checkpoint": False, "fedufo.num-clients": 3, "min-train-nodes": 3}


class RecordingGrid(FakeGrid):
    """FakeGrid that also keeps every reply, to check what the two sides exchanged."""

    def __init__(self, num_nodes: int, **kw) -> None:
        super().__init__(num_nodes, **kw)
        self.replies: list[tuple[str, Message]] = []

    def _deliver(self, msg: Message) -> Message | None:
        reply = super()._deliver(msg)
        if reply is not None:
            self.replies.append((msg.metadata.message_type, reply))
        return reply


def _declared(names, declared: tuple[str, ...]) -> set[str]:
    """Names not covered by ``declared`` (an entry ending in '.' is a prefix)."""
    return {n for n in names if not any(n == d or (d.endswith(".") and n.startswith(d)) for d in declared)}


@pytest.mark.parametrize("method", sorted(methods()))
def test_every_method_keeps_the_contract(method, tmp_path):
    decl = get_method(method)
    pay = decl.payload
    cfg = RunConfig.from_dict(resolve_run_config({**TINY, "method": method, "out-dir": str(tmp_path / "run")}))
    grid = RecordingGrid(3)
    doc = run_federation(grid, cfg)
    row = doc["rounds"][0]
    assert math.isfinite(row["global_accuracy"]) and 0.0 <= row["global_accuracy"] <= 1.0
    assert row["num_updates"] == 3 and row["num_failures"] == 0, row["failures"]
    # only declared names travel, each way
    for msg in grid.sent:
        mtype = msg.metadata.message_type
        assert mtype in (protocol.QUERY, protocol.EVALUATE, *pay.actions), f"undeclared action {mtype}"
        assert not _declared(msg.content.keys(), protocol.SERVER_RECORDS + pay.records), mtype
        if protocol.CONFIG in msg.content:
            assert not _declared(msg.content[protocol.CONFIG].keys(), protocol.CONFIG_KEYS + pay.config), mtype
    for mtype, reply in grid.replies:
        keys = set(reply.content.keys())
        if mtype == protocol.QUERY:
            assert keys == {protocol.INFO}
            assert set(reply.content[protocol.INFO].keys()) == set(protocol.QUERY_INFO_KEYS)
            continue
        metrics = set(reply.content[protocol.METRICS].keys())
        if mtype == protocol.EVALUATE:
            assert metrics == set(protocol.EVAL_METRICS)
            continue
        assert not _declared(keys, protocol.REPLY_RECORDS + pay.reply_records), mtype
        assert set(protocol.TRAIN_METRICS) <= metrics
        assert not _declared(metrics, protocol.TRAIN_METRICS + pay.metrics), mtype
    # client state: only declared entries; a stateful method's entries are there after a round
    for ctx in grid.contexts.values():
        assert not _declared(ctx.state.keys(), pay.state), method
    if method in ("scaffold", "moon", "feddyn"):  # state used at their defaults (FedBR's only with RSM)
        assert all(ctx.state.keys() for ctx in grid.contexts.values()), f"{method} kept no client state"
    # server state: checkpointed and restored exactly
    strategy = build_strategy(cfg)
    strategy.refresh_clients(grid)
    strategy.train_round(grid, 1, _initial_params(cfg))
    state = strategy.state_dict()
    (tmp_path / "ckpt").mkdir()
    save_checkpoint(tmp_path / "ckpt" / "checkpoint.pt", server_round=1, params=_initial_params(cfg),
                    strategy_state=state, rounds=[], run_config=cfg.to_dict())
    back = load_checkpoint(str(tmp_path / "ckpt"), cfg.to_dict())
    fresh = build_strategy(cfg)
    fresh.load_state_dict(back["strategy"])
    assert _same(fresh.state_dict(), state)


def _initial_params(cfg: RunConfig):
    from data_partitioning.datasets import dataset_shape
    from flcore.records import model_params
    from models import build_model

    shape, classes = dataset_shape(cfg.dataset)
    return model_params(build_model(cfg, shape, classes))


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and set(map(str, a)) == set(map(str, b)) and all(
            _same(a[k], b[k] if k in b else b[str(k)]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


# ------------------------------------------------------------------------------------------ the seam
def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("side, forbidden", [
    ("server_app", {"client_app"}), ("strategies", {"client_app", "server_app"}),
    ("client_app", {"strategies", "server_app"}),
    ("flcore", {"client_app", "strategies", "server_app"}), ("models", {"client_app", "strategies", "server_app"}),
    ("data_partitioning", {"client_app", "strategies", "server_app"})])
def test_server_and_client_sides_never_import_each_other(side, forbidden):
    bad = {str(p.relative_to(PROJECT_ROOT)): sorted(_imports(p) & forbidden)
           for p in (PROJECT_ROOT / side).rglob("*.py") if _imports(p) & forbidden}
    assert not bad, f"imports across the seam: {bad}"


def test_registry_strings_point_to_the_right_side():
    for decl in methods().values():
        assert decl.strategy.startswith("strategies.") and decl.trainer.startswith("client_app."), decl.name
        assert decl.model_hook is None or decl.model_hook.startswith("models."), decl.name


# ------------------------------------------------------------------------------- a method from outside
class ShrinkTerm(LossTerm):
    """Toy loss term: pulls every weight towards 0 with strength 10 (so its effect is unmistakable)."""

    def loss(self, model, step):
        return 10.0 * sum(p.pow(2).sum() for p in model.parameters() if p.requires_grad)


class ToyTrainer(Trainer):
    def terms(self):
        return [ShrinkTerm()]

    def extra_metrics(self, stats):
        return {"toy-norm": float(sum(p.detach().pow(2).sum() for p in self.job.model.parameters()))}


class ToyStrategy(FLStrategy):
    """Unweighted mean of the client models, and it counts its rounds (server state)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.rounds = 0

    def aggregate(self, server_round, params, updates):
        self.rounds += 1
        return {k: np.mean([u.params[k] for u in updates], axis=0).astype(params[k].dtype) for k in params}

    def state_dict(self):
        return {**super().state_dict(), "rounds": self.rounds}


def test_a_method_registered_from_a_test_file_runs_without_editing_the_project(tmp_path):
    decl = MethodDecl("toy-shrink", "a test's toy method", f"{__name__}:ToyStrategy", f"{__name__}:ToyTrainer",
                      payload=Payload(metrics=("toy-norm",)))
    register(decl)
    try:
        assert "toy-shrink" in methods()
        with pytest.raises(ValueError, match="already registered"):
            register(decl)
        base = {**TINY, "num-server-rounds": 2, "max-local-steps": 5, "lr": 0.05}
        toy = run_federation(FakeGrid(3), RunConfig.from_dict(resolve_run_config(
            {**base, "method": "toy-shrink", "out-dir": str(tmp_path / "toy")})))
        run_federation(FakeGrid(3), RunConfig.from_dict(resolve_run_config(
            {**base, "method": "fedavg", "out-dir": str(tmp_path / "avg")})))
        norm = lambda d: sum(float(v.pow(2).sum()) for v in torch.load(d / "final_model.pt").values())  # noqa: E731
        assert norm(tmp_path / "toy") < 0.5 * norm(tmp_path / "avg")  # the toy term shrank the weights
        assert toy["rounds"][-1]["num_updates"] == 3
    finally:
        unregister("toy-shrink")
    assert "toy-shrink" not in methods()


# ----------------------------------------------------------------------------- duplicate client ids
class DuplicateIdGrid(FakeGrid):
    """Node 3 is configured with partition-id 1, which node 1 already holds."""

    def __init__(self) -> None:
        super().__init__(4)
        self.contexts[self.node_ids[3]].node_config["partition-id"] = 1


def test_a_second_node_claiming_a_held_client_id_is_refused(tmp_path):
    grid = DuplicateIdGrid()
    cfg = RunConfig.from_dict(resolve_run_config({**TINY, "num-server-rounds": 2, "out-dir": str(tmp_path / "r")}))
    doc = run_federation(grid, cfg)
    dup = [f for f in doc["rounds"][0]["failures"] if f["kind"] == "duplicate-id"]
    assert dup and all(f["cid"] == 1 for f in dup)  # refused, and refused again when re-asked (back-off)
    assert all(f"node {grid.node_ids[3]} claims client id 1, already held by live node {grid.node_ids[1]}"
               in f["reason"] for f in dup)
    assert doc["rounds"][0]["sampled"] == [0, 1, 2] and doc["rounds"][1]["sampled"] == [0, 1, 2]
    # the holder kept its slot: every message for client 1 went to node 1, none to the impostor
    to_impostor = [m for m in grid.sent if m.metadata.dst_node_id == grid.node_ids[3]
                   and m.metadata.message_type != protocol.QUERY]
    assert to_impostor == []
