"""deploy/link_guard.py: a reply is bounded as a whole (object count, stored bytes), and a refused one is removed.

The live attack (a participant assembling a 120 MiB reply from bodies each under the proxy's limit) is in
tests/test_hostile_fleet_nodes.py; these are the pure rules and the handler wrapping, on fakes."""

from __future__ import annotations

import importlib
import types
from typing import Any

import pytest

from deploy.body_limits import REPLY_BYTE_MARGIN, REPLY_OBJECT_MARGIN, limits_for, reply_layout
from deploy.link_guard import (DEFAULT_MAX_REPLY_BYTES, DEFAULT_MAX_REPLY_OBJECTS, HANDLERS_MODULE, ReplyBudget,
                               install, main, tree_size)


def _tree(depth: int, fan: int) -> Any:
    from flwr.proto.message_pb2 import ObjectTree

    node = ObjectTree(object_id="x")
    if depth:
        node.children.extend(_tree(depth - 1, fan) for _ in range(fan))
    return node


def test_tree_size_counts_every_id_without_recursion() -> None:
    assert tree_size(_tree(0, 3)) == 1
    assert tree_size(_tree(2, 3)) == 1 + 3 + 9
    from flwr.proto.message_pb2 import ObjectTree

    deep = root = ObjectTree(object_id="r")
    for _ in range(5000):        # deeper than Python's recursion limit
        child = deep.children.add()
        child.object_id = "c"
        deep = child
    assert tree_size(root) == 5001


def test_the_budget_refuses_large_trees_and_bytes_past_the_limit_then_the_whole_session() -> None:
    now = [0.0]
    b = ReplyBudget(max_objects=10, max_bytes=100, memory_s=60, clock=lambda: now[0])
    assert b.check_tree(10) is None
    assert "11 objects, more than the 10" in (b.check_tree(11) or "")
    b.open("s1", "ins-1", "rep-1")
    assert b.charge("s1", 60) is None and b.charge("s1", 40) is None       # exactly the limit is accepted
    reason = b.charge("s1", 1)
    assert reason and "101 bytes" in reason and "FLEET_MAX_REPLY_BYTES" in reason
    assert "already exceeded" in (b.charge("s1", 1) or "")                  # every later object of the session
    assert b.reply_of("s1") == ("ins-1", "rep-1")
    assert b.take_removal("s1") == ("ins-1", "rep-1") and b.take_removal("s1") is None   # handed out once
    b.open("s2")
    assert b.charge("s2", 100) is None                                     # budgets are per session
    assert b.take_removal("s2") is None                                    # not refused: nothing to remove
    assert "no session id" in (b.charge("", 1) or "")
    assert b.charge("unknown", 10**9) is None                              # not ours: Flower refuses it itself
    now[0] = 61.0
    b.open("s3")                                                           # opening forgets sessions idle > 60 s
    assert set(b.used) == {"s3"} and not b.refused and not b.removed and set(b.replies) == {"s3"}
    with pytest.raises(ValueError, match="must be positive"):
        ReplyBudget(max_objects=0)


class _State:
    def __init__(self) -> None:
        self.deleted: list[set[str]] = []
        self.object_store = types.SimpleNamespace(deleted=[])
        self.object_store.delete = self.object_store.deleted.append

    def delete_messages(self, message_ins_ids: set[str]) -> None:
        self.deleted.append(message_ins_ids)


def test_install_wraps_the_fleet_handlers_refuses_with_413_and_removes_a_refused_reply(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi import HTTPException
    from flwr.proto.fleet_pb2 import PushMessagesRequest, PushMessagesResponse
    from flwr.proto.message_pb2 import PushObjectRequest, PushObjectResponse

    handlers = importlib.import_module(HANDLERS_MODULE)
    calls: list[str] = []
    monkeypatch.setattr(handlers, "push_messages",
                        lambda request, state: calls.append("messages") or PushMessagesResponse(session_id="s"))
    monkeypatch.setattr(handlers, "push_object",
                        lambda request, state: calls.append("object") or PushObjectResponse(stored=True))
    budget = ReplyBudget(max_objects=13, max_bytes=100)
    undo = install(budget)
    state = _State()
    try:
        big = PushMessagesRequest(message_object_trees=[_tree(3, 3)])               # 40 ids
        with pytest.raises(HTTPException) as refused:
            handlers.push_messages(request=big, state=state)
        assert refused.value.status_code == 413 and "40 objects" in refused.value.detail and calls == []
        ok = PushMessagesRequest(message_object_trees=[_tree(2, 3)])                # 13 ids
        msg = ok.messages_list.add()
        msg.metadata.message_id, msg.metadata.reply_to_message_id = "reply", "instruction"
        assert handlers.push_messages(request=ok, state=state).session_id == "s"
        assert budget.reply_of("s") == ("instruction", "reply")
        obj = PushObjectRequest(session_id="s", object_id="a", object_content=b"\0" * 80)
        assert handlers.push_object(request=obj, state=state).stored and state.deleted == []
        with pytest.raises(HTTPException) as over:
            handlers.push_object(request=obj, state=state)                         # 160 > 100
        assert over.value.status_code == 413 and calls == ["messages", "object"]
        assert state.deleted == [{"instruction"}] and state.object_store.deleted == ["reply"]
        with pytest.raises(HTTPException):
            handlers.push_object(request=PushObjectRequest(session_id="s", object_content=b"x"), state=state)
        assert state.deleted == [{"instruction"}]                                  # removed once
    finally:
        undo()
    assert calls == ["messages", "object"]
    assert handlers.push_messages is not None and "guarded" not in handlers.push_messages.__name__


def test_a_flower_without_the_handlers_is_refused_at_start(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    handlers = importlib.import_module(HANDLERS_MODULE)
    monkeypatch.delattr(handlers, "push_object")
    with pytest.raises(RuntimeError, match="push_messages/push_object not found"):
        install(ReplyBudget())
    with pytest.raises(SystemExit) as exit_:
        main(["--max-reply-objects", "5", "--", "--insecure"])
    assert exit_.value.code == 2 and "not started" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:
        main(["--max-reply-bytes", "0"])
    assert bad.value.code == 2


def test_derived_reply_bounds_are_twice_the_legitimate_reply_plus_a_margin() -> None:
    import numpy as np

    arrays = {"w": np.zeros((64, 100), dtype=np.float32), "b": np.zeros(100, dtype=np.float32)}
    largest, tree, count, total = reply_layout(arrays, 2)
    assert count == 1 + 1 + 2 * (1 + 2 * 2)      # Message, RecordDict, 2 x (ArrayRecord + 2 x (Array + chunk))
    assert total > 2 * 4 * (64 * 100 + 100)      # the float data of both records, deflated with its headers
    lim = limits_for(arrays, 2).superlink()
    assert lim == {"FLEET_MAX_REPLY_OBJECTS": str(2 * count + REPLY_OBJECT_MARGIN),
                   "FLEET_MAX_REPLY_BYTES": str(2 * total + REPLY_BYTE_MARGIN)}
    assert limits_for(None).superlink() == {"FLEET_MAX_REPLY_OBJECTS": str(DEFAULT_MAX_REPLY_OBJECTS),
                                            "FLEET_MAX_REPLY_BYTES": str(DEFAULT_MAX_REPLY_BYTES)}
