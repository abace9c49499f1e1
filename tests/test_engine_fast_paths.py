"""The per-message shortcuts of the in-process engine's path (issue 17) give exactly what the long way gave:
records built without Flower's per-item checks equal the checked ones and fail the same way; the update
check computes each norm once and names the same problem as the check-by-check definition; the state
ledger's shared record equals a fresh one; message ids stay unique across processes."""

from __future__ import annotations

import os

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from engines.delivery import new_message_id
from flcore.records import config_to_record, metric_record, params_to_record, record_dict
from strategies.aggregation import deltas, flat_norm
from strategies.state_ledger import StateLedger
from strategies.update_screen import _check_in_order, as_float64, check_update, update_problem

CONFIGS = [{}, {"a": 1, "b": 2.5, "c": "x", "d": b"\x00", "e": True}, {"l": [1, 2], "m": ["a"], "n": []},
           {"np": np.float32(1.5), "arr": np.arange(3)}, {"mixed": [1, 2.0]}, {"bad": {"x": 1}}, {1: "int key"}]
METRICS = [{}, {"a": 1, "b": 2.5, "l": [1.0, 2.0]}, {"flag": True}, {"np": np.float64(1.0)}, {"s": "text"},
           {"mixed": [1, 2.0]}, {"sub": [True]}]


def _outcome(build, values):
    try:
        rec = build(values)
    except Exception as exc:  # noqa: BLE001 - the error is part of what must match
        return type(exc), str(exc)
    return type(rec), list(rec.items()), {k: type(v) for k, v in rec.items()}


@pytest.mark.parametrize("values", CONFIGS)
def test_config_records_equal_flowers_checked_ones(values):
    converted = {k: v.item() if isinstance(v, np.generic) else v.tolist() if isinstance(v, np.ndarray) else v
                 for k, v in values.items()}
    assert _outcome(config_to_record, values) == _outcome(ConfigRecord, converted)


@pytest.mark.parametrize("values", METRICS)
def test_metric_records_equal_flowers_checked_ones(values):
    assert _outcome(metric_record, values) == _outcome(MetricRecord, dict(values))


def test_record_dicts_equal_flowers_and_later_items_are_still_checked():
    parts = {"arrays": params_to_record({"w": np.ones(2, np.float32)}), "metrics": MetricRecord({"a": 1}),
             "config": ConfigRecord({"b": "x"})}
    ours, theirs = record_dict(parts), RecordDict(parts)
    assert list(ours.items()) == list(theirs.items())
    with pytest.raises(TypeError):
        ours["bad"] = {"not": "a record"}
    with pytest.raises(TypeError):
        metric_record({"a": 1})["b"] = "text"
    assert _outcome(record_dict, {"x": {"plain": "dict"}}) == _outcome(RecordDict, {"x": {"plain": "dict"}})


def _ref(rng, dtype=np.float32):
    return {"w": rng.standard_normal((30, 7)).astype(dtype), "b": rng.standard_normal(7).astype(dtype),
            "n": np.array(3, np.int64)}


@pytest.mark.parametrize("case", ["ok", "nan", "inf-first", "shape-after-nan", "dtype", "missing", "extra",
                                  "too-far", "float64-overflow", "list"])
def test_check_update_names_the_same_problem_and_norm_as_check_by_check(case):
    rng = np.random.default_rng(0)
    ref = _ref(rng)
    p = {k: (v + rng.standard_normal(v.shape).astype(v.dtype) * 0.1).astype(v.dtype) for k, v in ref.items()}
    if case == "nan":
        p["b"][3] = np.nan
    elif case == "inf-first":
        p["w"][0, 0], p["b"][0] = np.inf, np.nan
    elif case == "shape-after-nan":  # the in-order checks name the first tensor's NaN, not the later shape
        p["w"][1, 1] = np.nan
        p["b"] = np.ones(8, np.float32)
    elif case == "dtype":
        p["b"] = p["b"].astype(np.float64)
    elif case == "missing":
        del p["n"]
    elif case == "extra":
        p["z"] = np.ones(1, np.float32)
    elif case == "too-far":
        p["w"] = p["w"] + 500
    elif case == "float64-overflow":
        ref = {k: v.astype(np.float64) for k, v in ref.items() if k != "n"}
        p = {k: v + 1e300 for k, v in ref.items()}
    elif case == "list":
        p["b"] = p["b"].tolist()
    want = _check_in_order(p, ref, 1000.0)
    for reference64 in (None, as_float64(ref)):
        got = check_update(p, ref, 1000.0, reference64)
        assert got[0] == want[0] and got[0] == update_problem(p, ref, 1000.0)
        if want[1] is not None:  # the norm named in a reason, or kept for the relative screen: bit-identical
            assert got[1].exact() == want[1] == flat_norm(deltas(ref, p))
            assert got[1].lo <= want[1] <= got[1].hi
    assert (want[0] is None) == (case == "ok")


def test_the_norm_is_exactly_the_old_one_for_every_dtype():
    rng = np.random.default_rng(1)
    for dtype in (np.float16, np.float32, np.float64, np.int32):
        ref = {"a": (rng.standard_normal((64, 33)) * 10).astype(dtype), "b": (rng.standard_normal(5) * 10).astype(dtype)}
        p = {k: (v + rng.standard_normal(v.shape) * 3).astype(dtype) for k, v in ref.items()}
        problem, norm = check_update(p, ref, 1e9)
        assert problem is None and norm.exact() == flat_norm(deltas(ref, p))


@pytest.mark.parametrize("scale", [1e-30, 1e-22, 1e-6, 1.0, 1e6, 1e15])
def test_the_float32_bracket_holds_the_exact_norm_at_every_magnitude(scale):
    """lo <= exact <= hi for differences from subnormal-squared to near float32 overflow, sparse and dense,
    and the bracket is tight enough to decide (hi / lo < 1.2 for these sizes)."""
    rng = np.random.default_rng(int(-np.log10(scale) * 7) % 1000)
    for trial in range(20):
        ref = {"a": rng.standard_normal((64, 33)).astype(np.float32), "b": rng.standard_normal(200).astype(np.float32),
               "c": rng.standard_normal(()).astype(np.float32)}
        p = {}
        for k, v in ref.items():
            delta = rng.standard_normal(v.shape) * scale * 10 ** rng.uniform(-2, 2, v.shape)
            if trial % 3 == 0:
                delta = delta * (rng.random(v.shape) < 0.05)  # mostly unchanged entries
            p[k] = (v.astype(np.float64) + delta).astype(np.float32)
        problem, norm = check_update(p, ref, float("inf"))
        exact = flat_norm(deltas(ref, p))
        assert problem is None and norm.lo <= exact <= norm.hi and norm.exact() == exact
        if exact > 1e-30:
            assert norm.hi <= 1.2 * norm.lo


def test_the_relative_screen_decides_near_ties_with_exact_norms(tmp_path):
    """Updates at 1x, 1x and exactly factor x the median (not above it: kept) and a hair above (rejected, the
    reason naming the exact norms): the bracket cannot settle these, the exact path does, as before."""
    from flcore.config import RunConfig, resolve_run_config
    from server_app.runner import build_strategy
    from strategies.base import ClientUpdate

    cfg = RunConfig.from_dict(resolve_run_config({"update-norm-factor": 2.0, "out-dir": str(tmp_path)}))
    strategy = build_strategy(cfg)
    ref = {"w": np.zeros(4, np.float32)}

    def update(cid, length):
        return ClientUpdate(cid, {"w": np.array([length, 0, 0, 0], np.float32)}, 1, {}, {})

    for top, kept in ((2.0, [0, 1, 2, 3]), (np.nextafter(np.float32(2.0), np.float32(3.0)), [0, 1, 2])):
        ups = [update(0, 1.0), update(1, 1.0), update(2, 1.0), update(3, top)]
        norms = {u.cid: check_update(u.params, ref, 1e9)[1] for u in ups}
        got, rejected = strategy.checks.screen(1, ups, ref, [], "train", norms)
        want, want_rejected = strategy.checks.screen(1, ups, ref, [], "train")  # exact norms only
        assert [u.cid for u in got] == [u.cid for u in want] == kept
        assert [f.as_dict() for f in rejected] == [f.as_dict() for f in want_rejected]


def test_the_state_ledger_shares_one_record_per_binding_equal_to_a_fresh_one():
    ledger = StateLedger.fresh()
    first, again = ledger.record(3), ledger.record(3)
    assert first is again and first == ledger.binding(3).to_record()
    ledger.note_reply(3, 2, {"state-entries": 1})
    changed = ledger.record(3)
    assert changed is not first and changed == ledger.binding(3).to_record() and changed["state-round"] == 2
    ledger.checkpoint_round = 2
    assert ledger.record(3)["checkpoint-round"] == 2 and ledger.record(4)["state-round"] == 0
    copy = StateLedger(ledger.run, list(ledger.attempts), list(ledger.starts), ledger.checkpoint_round,
                       dict(ledger.rounds))
    assert copy == ledger and "_records" not in repr(ledger)  # the memo is not part of the ledger's value


def test_message_ids_are_unique_in_a_process_and_across_a_fork():
    ids = {new_message_id() for _ in range(10000)}
    assert len(ids) == 10000
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the ids it makes must differ from the parent's
        os.close(read)
        os.write(write, "\n".join(new_message_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    child = set(b"".join(chunks).decode().split("\n"))
    parent = {new_message_id() for _ in range(100)}
    assert len(child) == 100 and not child & (ids | parent)
