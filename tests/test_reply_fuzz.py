"""Issue 42, item 1: no reply a participant sends can crash the ServerApp. Every method's real training replies
(each phase: FedUFO's prior and posterior, SphereFed's calibration) are rewritten by a hostile client 0 — each key
missing, a list where a scalar belongs, a fraction where a count belongs, negative, NaN, huge, an extra key, an
extra record, a record of the wrong kind — and the federation must finish every round with the other clients,
client 0's reply recorded as ``rejected`` naming the key. Registration and evaluation replies likewise.

The schema itself (strategies/reply_schema.py) is pure: its values are tested first."""

from __future__ import annotations

import math

import pytest
from flwr.app import ConfigRecord, Message, MetricRecord

from flcore import protocol
from flcore.config import RunConfig, resolve_run_config
from flcore.registry import methods
from server_app.runner import run_federation
from strategies import reply_schema as rs
from tests.fakegrid import FakeGrid

NODES = 5
TINY = {"dataset": "digits", "batch-size": 16, "max-local-steps": 2, "model": "mlp", "checkpoint": False,
        "fedufo.num-clients": NODES, "min-train-nodes": NODES, "local-test-fraction": 0.25}
NAN_OK = {"train_loss", "local-accuracy", "local-loss", "global-model-local-accuracy", "global-model-local-loss"}


# ------------------------------------------------------------------------------ the schema's values
def test_counts_fractions_and_numbers_are_checked_by_type_and_bound():
    assert rs.count(3) is None and rs.count(0) is None
    assert "integer" in rs.count(2.5) and "integer" in rs.count(True) and "integer" in rs.count([1])
    assert "[0, 2^53]" in rs.count(-1) and "[0, 2^53]" in rs.count(2**60)
    assert rs.fraction_or_nan(math.nan) is None and rs.fraction_or_nan(1.0) is None
    assert "[0, 1]" in rs.fraction_or_nan(1.5) and "[0, 1]" in rs.fraction(math.nan)
    assert rs.finite_or_nan(-3.0) is None and "finite" in rs.finite_or_nan(math.inf)
    assert rs.nonneg_or_nan(math.nan) is None and ">= 0" in rs.nonneg_or_nan(-1e-3)


def test_metrics_are_refused_by_key_with_the_reason():
    base, req = rs.TRAIN_METRICS, rs.REQUIRED_TRAIN
    good = {"cid": 2, "num-examples": 10, "train_loss": 0.5, "state-entries": 0, "my-metric": 0.1}
    assert rs.metrics_problem(good, base, req, ("my-metric",), cid=2) is None
    assert rs.metrics_problem({**good, "num-examples": [1, 2]}, base, req, ("my-metric",)) == \
        "metric 'num-examples' must be an integer, got list [1, 2]"
    assert rs.metrics_problem({**good, "state-entries": [3]}, base, req, ("my-metric",)).startswith(
        "metric 'state-entries' must be an integer")
    assert rs.metrics_problem(good, base, req, ()) == \
        "metric 'my-metric' is not in the protocol nor declared by the method"
    assert rs.metrics_problem({"cid": 2}, base, req, ()) == "metric 'num-examples' missing"
    assert rs.metrics_problem(good, base, req, ("my-metric",), cid=3) == \
        "metric 'cid' is 2, but the message went to client 3"
    assert rs.metrics_problem({**good, "fedufo.x": 1.0}, base, req, ("my-metric", "fedufo.")) is None  # a prefix


def test_a_registration_is_refused_unless_every_key_is_there_and_the_counts_add_up():
    ok = {"cid": 1, "num-examples": 5, "class-counts": [2, 3]}
    assert rs.info_problem(ok) is None
    assert rs.info_problem(None).startswith("record 'info' missing")
    assert rs.info_problem({"cid": 1, "num-examples": 5}) == "info 'class-counts' missing"
    assert rs.info_problem({**ok, "num-examples": "5"}).startswith("info 'num-examples' must be an integer")
    assert rs.info_problem({**ok, "class-counts": [2, -3]}).startswith("info 'class-counts' must be")
    assert rs.info_problem({**ok, "num-examples": 10**9}).startswith("info 'class-counts' add up to 5")
    assert rs.info_problem({**ok, "extra": 1}) == "info has undeclared key(s) 'extra'"
    # what the registry keeps: the checked values, typed; or the same first problem
    assert rs.parse_info(ok) == rs.RegistrationInfo(cid=1, num_examples=5, class_counts=[2, 3])
    assert rs.parse_info({**ok, "extra": 1}) == "info has undeclared key(s) 'extra'"


# ------------------------------------------------------------------------------ hostile replies, whole rounds
def _metric_mutations(metrics: MetricRecord) -> list[tuple[str, str, object]]:
    """(key, kind, new value or None for 'missing') for every metric of an honest reply."""
    out = []
    for key, value in metrics.items():
        out += [(key, "missing", None), (key, "list", [1.0, 2.0]), (key, "nan", math.nan), (key, "huge", 1e300),
                (key, "negative", -1.0 if isinstance(value, float) else -1)]
        if isinstance(value, int):
            out.append((key, "fractional", 2.5))
    return out + [("not-a-key", "extra", 1.0)]


def _record_mutations() -> list[tuple[str, str]]:
    return [("arrays", "missing"), ("metrics", "missing"), ("metrics", "wrong-kind"), ("extra-record", "extra")]


def _apply(content, mutation) -> None:
    target, kind = mutation[0], mutation[1]
    if len(mutation) == 3:  # a metric (a multi-phase method's phases may report different ones)
        metrics = content["metrics"]
        if kind == "missing":
            if target in metrics:
                del metrics[target]
        else:
            metrics[target] = mutation[2]
    elif kind == "missing":
        del content[target]
    elif kind == "wrong-kind":
        content[target] = ConfigRecord({"num-examples": "a string"})
    else:
        content[target] = ConfigRecord({"x": 1})


HOSTILE = 3  # clients 0, 1, 2 rewrite their replies, each with its own mutation every round; 3 and 4 are honest


class HostileClient:
    """Client ``which``'s behaviour: in round r it rewrites its training reply(ies) (every phase) with mutation
    HOSTILE * (r - 1) + which."""

    def __init__(self, mutations: list[tuple], which: int) -> None:
        self.mutations, self.which = mutations, which

    def __call__(self, msg: Message, reply: Message) -> Message:
        i = HOSTILE * (int(msg.metadata.group_id or 0) - 1) + self.which
        if msg.metadata.message_type.startswith(protocol.TRAIN) and 0 <= i < len(self.mutations):
            _apply(reply.content, self.mutations[i])
        return reply


def _must_reject(mutation: tuple, required: tuple[str, ...]) -> bool:
    """Whether the schema alone must refuse this mutation (others may still be refused by the method)."""
    if len(mutation) == 2:
        return True
    key, kind, _ = mutation
    if kind == "missing":
        return key in required
    if kind == "nan":
        return key not in NAN_OK and key in rs.TRAIN_METRICS
    if kind == "negative":
        return key in rs.TRAIN_METRICS and key not in ("train_loss",)
    return kind in ("list", "extra") or key in rs.TRAIN_METRICS and kind in ("huge", "fractional") and \
        rs.TRAIN_METRICS[key] is rs.count


def _honest_metrics(method: str, tmp_path) -> MetricRecord:
    """The metrics of client 0's honest training replies of ``method``, every phase (a one-round run)."""
    seen: dict[str, object] = {}

    def keep(msg, reply):
        if msg.metadata.message_type.startswith(protocol.TRAIN):
            seen.update(dict(reply.content["metrics"]))
        return reply

    cfg = RunConfig.from_dict(resolve_run_config({**TINY, "method": method, "num-server-rounds": 1,
                                                  "out-dir": str(tmp_path / "honest")}))
    run_federation(FakeGrid(NODES, {0: keep}), cfg)
    assert seen, f"{method}: no training reply seen"
    return MetricRecord(seen)


@pytest.mark.parametrize("method", [m if m == "fedavg" else pytest.param(m, marks=pytest.mark.slow)
                                    for m in sorted(methods())])
def test_every_mutation_of_a_training_reply_is_survived_and_rejected_by_name(method, tmp_path):
    mutations = [*_metric_mutations(_honest_metrics(method, tmp_path)), *_record_mutations()]
    rounds = -(-len(mutations) // HOSTILE)
    cfg = RunConfig.from_dict(resolve_run_config({**TINY, "method": method, "num-server-rounds": rounds,
                                                  "out-dir": str(tmp_path / "run")}))
    grid = FakeGrid(NODES, {c: HostileClient(mutations, c) for c in range(HOSTILE)})
    doc = run_federation(grid, cfg)
    assert len(doc["rounds"]) == rounds  # every round finished, with (at least) the honest clients 3 and 4
    for i, mutation in enumerate(mutations):
        row, cid = doc["rounds"][i // HOSTILE], i % HOSTILE
        assert row["num_updates"] >= NODES - HOSTILE, (mutation, row["failures"])
        mine = [f for f in row["failures"] if f["cid"] == cid and f["kind"] == "rejected"]
        if _must_reject(mutation, rs.REQUIRED_TRAIN):
            assert mine, f"{method}: {mutation} was accepted"
            assert any(f"'{mutation[0]}'" in f["reason"] for f in mine), (mutation, mine)


def test_a_malformed_registration_is_refused_and_the_others_train(tmp_path):
    def bad_info(msg, reply):
        if msg.metadata.message_type == protocol.QUERY:
            reply.content["info"] = ConfigRecord({"cid": 0, "num-examples": 10**9, "class-counts": [1, 2]})
        return reply

    cfg = RunConfig.from_dict(resolve_run_config({**TINY, "min-train-nodes": 2, "num-server-rounds": 2,
                                                  "out-dir": str(tmp_path / "run")}))
    doc = run_federation(FakeGrid(3, {0: bad_info}, behaviour_phases=("query",)), cfg)
    assert [r["sampled"] for r in doc["rounds"]] == [[1, 2], [1, 2]]
    reasons = [f["reason"] for r in doc["rounds"] for f in r["failures"] if f["phase"] == "register"]
    assert any("malformed registration: info 'class-counts' add up to 3, but 'num-examples' is 1000000000" in s
               for s in reasons), reasons


def test_a_malformed_evaluation_reply_is_a_rejected_failure_not_a_crash(tmp_path):
    def bad_eval(msg, reply):
        if msg.metadata.message_type == protocol.EVALUATE:
            reply.content["metrics"]["num-test"] = [5, 5]
        return reply

    cfg = RunConfig.from_dict(resolve_run_config({**TINY, "num-server-rounds": 2, "federated-eval-every": 1,
                                                  "out-dir": str(tmp_path / "run")}))
    doc = run_federation(FakeGrid(NODES, {0: bad_eval}, behaviour_phases=("evaluate",)), cfg)
    assert len(doc["rounds"]) == 2
    bad = [f for r in doc["rounds"] for f in r["failures"] if f["phase"] == "evaluate"]
    assert bad and all(f["cid"] == 0 and f["kind"] == "rejected" and "'num-test'" in f["reason"] for f in bad)
