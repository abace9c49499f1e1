"""flcore/internals.py: the one module touching Flower's private members (issue round-pipeline item 3).

Each function's private path gives the same objects as its public path; federations give the same numbers
both ways (``NONIID_FL_PUBLIC_ONLY=1`` in a subprocess); and no other library module touches a private member
of Flower or torch (a scan of the source)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from flcore import internals
from flcore.records import params_to_record, record_to_params

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("client_app", "server_app", "strategies", "engines", "flcore", "models", "data_partitioning", "deploy",
           "cli", "experiments")


@pytest.fixture(params=[False, True], ids=["private", "public"])
def path(request, monkeypatch):
    monkeypatch.setattr(internals, "PUBLIC_ONLY", request.param)
    return request.param


@pytest.fixture(autouse=True)
def _task_identity():
    """What Flower (or engines/grid.py) sets in a ServerApp process before messages are made."""
    from flwr.supercore.task_identity import TaskIdentity

    if TaskIdentity._run_id is None:
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 1


def _message() -> Message:
    content = RecordDict({"arrays": params_to_record({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}),
                          "config": ConfigRecord({"server-round": 3, "names": ["a", "b"]}),
                          "metrics": MetricRecord({"loss": 0.5})})
    return Message(content, dst_node_id=7, message_type="train", group_id="3")


def _meta(m) -> dict:
    return {k: getattr(m, k) for k in ("run_id", "message_id", "src_node_id", "dst_node_id", "reply_to_message_id",
                                       "group_id", "created_at", "ttl", "message_type", "src_task_id",
                                       "dst_task_id", "delivered_at")}


def test_stamp_gives_the_ids_and_keeps_everything_else(path):
    msg = _message()
    before = _meta(msg.metadata)
    out = internals.stamp(msg, "m-1", 1)
    assert out.metadata.message_id == "m-1" and out.metadata.src_node_id == 1
    assert {k: v for k, v in _meta(out.metadata).items() if k not in ("message_id", "src_node_id")} == \
        {k: v for k, v in before.items() if k not in ("message_id", "src_node_id")}
    assert out.content is msg.content
    # private: stamped in place, as Flower's grids do; public: the caller's message is left as it was
    assert (out is msg) is (not path)
    assert (msg.metadata.message_id == "m-1") is (not path)
    err = Message(Error(code=3, reason="x"), reply_to=msg)
    stamped = internals.stamp(err, "m-2", 7)
    assert stamped.has_error() and stamped.error.reason == "x" and stamped.metadata.message_id == "m-2"


def test_metadata_copy_and_message_like(path):
    msg = internals.stamp(_message(), "m-1", 1)
    meta = internals.copy_metadata(msg.metadata)
    assert meta is not msg.metadata and _meta(meta) == _meta(msg.metadata)
    content = RecordDict({"metrics": MetricRecord({"x": 1.0})})
    new = internals.message_like(msg, meta, content)
    assert new.metadata is meta and new.content is content and not new.has_error()


def test_record_copies_are_new_objects_with_the_same_items(path):
    record = params_to_record({"a": np.ones((2, 2), np.float32), "b": np.zeros(3, np.int64)})
    copy = internals.typed_copy(record)
    assert type(copy) is ArrayRecord and copy is not record and list(copy) == list(record)
    internals.set_items(copy, {k: internals.copy_array(v) for k, v in record.items()})
    for k in record:
        assert copy[k] is not record[k] and copy[k].data == record[k].data
        assert (copy[k].dtype, copy[k].shape, copy[k].stype) == (record[k].dtype, record[k].shape, record[k].stype)
    assert all(np.array_equal(record_to_params(copy)[k], record_to_params(record)[k]) for k in record)


def test_array_like_and_filled_equal_flowers_constructors(path):
    proto = Array(np.arange(4, dtype=np.float32))
    data = proto.data[:-16] + np.arange(4, 8, dtype=np.float32).tobytes()
    arr = internals.array_like(proto, data)
    assert np.array_equal(arr.numpy(), np.arange(4, 8, dtype=np.float32))
    assert arr.object_id == Array(dtype=proto.dtype, shape=tuple(proto.shape), stype=proto.stype,
                                  data=data).object_id
    for cls, values in ((ConfigRecord, {"a": 1, "b": "x", "c": [1.0, 2.0]}), (MetricRecord, {"m": 0.25}),
                        (RecordDict, {"r": MetricRecord({"m": 1.0})})):
        got = internals.filled(cls, values)
        assert type(got) is cls and dict(got) == dict(cls(dict(values)))


def test_the_public_path_checks_what_the_private_one_skips(monkeypatch):
    """The public path is Flower's constructors, with their checks: a value the private path's callers rule
    out (flcore/records.py only passes values of plain types) is refused there."""
    monkeypatch.setattr(internals, "PUBLIC_ONLY", True)
    with pytest.raises(TypeError):
        internals.filled(MetricRecord, {"m": "not a number"})


def test_wrap_pull_calls_back_after_every_pull_and_steps_aside_on_the_public_path(monkeypatch):
    class Loop:
        @staticmethod
        def _pull_and_store_message(x):
            return None if x == 0 else 42

    seen = []
    assert internals.wrap_pull(Loop, seen.append)
    assert Loop._pull_and_store_message(0) is None and Loop._pull_and_store_message(1) == 42
    assert seen == [None, 42]
    monkeypatch.setattr(internals, "PUBLIC_ONLY", True)

    class Other:
        _pull_and_store_message = staticmethod(lambda: None)

    original = Other._pull_and_store_message
    assert not internals.wrap_pull(Other, seen.append) and Other._pull_and_store_message is original


_DIGESTS = """
import json, sys, tempfile
from pathlib import Path
from tests.known_outputs import load, run_job
from flcore import internals
jobs = load()["jobs"]
out = {"public": internals.PUBLIC_ONLY}
for name in sys.argv[1:]:
    with tempfile.TemporaryDirectory() as d:
        out[name] = run_job(jobs[name]["run_config"], Path(d)).digest
print(json.dumps(out))
"""


@pytest.mark.slow
def test_federations_give_the_same_numbers_on_the_public_path():
    """Known-output jobs (one exchange; FedUFO's two-phase relay; SCAFFOLD's records; FedRANE) run in a fresh
    process with NONIID_FL_PUBLIC_ONLY=1 and without it: the same digests (final model and every metric)."""
    jobs = ["fedavg", "fedufo", "scaffold", "fedrane"]
    got = {}
    for public in ("0", "1"):
        env = {**os.environ, "NONIID_FL_PUBLIC_ONLY": public, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-c", _DIGESTS, *jobs], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got[public] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["0"].pop("public") is False and got["1"].pop("public") is True
    assert got["0"] == got["1"]


# --- nothing else touches private members ------------------------------------------------------------------
_PRIVATE_TORCH = {"_parameters", "_buffers", "_modules", "_version", "_forward_hooks", "_backward_hooks",
                  "_forward_pre_hooks", "_load_from_state_dict", "_non_persistent_buffers_set"}


def _violations(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr == "__dict__" and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"line {node.lineno}: .__dict__")
            elif node.attr in _PRIVATE_TORCH or node.attr == "getrefcount":
                found.append(f"line {node.lineno}: .{node.attr}")
            elif node.attr == "_pull_and_store_message":
                found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getsource":
            found.append(f"line {node.lineno}: inspect.getsource")
    return sorted(found, key=lambda v: int(v.split(":")[0].split()[1]))


def test_no_library_module_but_flcore_internals_touches_private_members():
    """Issue round-pipeline item 3: no reads of torch's private module state, no reference-count guards, no
    patching a library by reading its source, no writes into a Flower object's ``__dict__``, outside
    flcore/internals.py (an object's own ``self.__dict__`` is its own business)."""
    bad = {}
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "flcore/internals.py":
                continue
            found = _violations(ast.parse(path.read_text(), rel))
            if found:
                bad[rel] = found
    assert not bad, f"private members touched outside flcore/internals.py: {bad}"


def test_the_scan_finds_what_it_looks_for():
    src = ("m.metadata.__dict__['_message_id'] = 1\nsys.getrefcount(x)\nt._version\n"
           "inspect.getsource(mod)\nself.__dict__.update(a)\n")
    assert [v.split(": ")[1] for v in _violations(ast.parse(src))] == \
        [".__dict__", ".getrefcount", "._version", "inspect.getsource"]
