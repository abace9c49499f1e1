"""Copies of Flower messages, records and contexts at the engine's boundary.

Flower's simulation engine hands every ClientApp its own copy of the message and of the node's Context
(Ray pickles both on their way to an actor) and takes back a copy of the reply: nothing is shared
between the server's objects, the client's objects and the state that outlives a message. The
in-process engine gives the same guarantee more cheaply with *structural* copies: every container
(RecordDict, ArrayRecord, ConfigRecord, MetricRecord, Array, Metadata, Context) is a new object, while
the payload bytes of an Array are shared, which is safe because ``bytes`` are immutable. Lists inside
config and metric records are copied (they are mutable).
"""

from __future__ import annotations

from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.app.metadata import Metadata


def _typed_copy(obj: Any) -> Any:
    """``obj.copy()`` for a Flower record or RecordDict (``TypedDict.copy``: the same class, the same check
    functions, a copy of the item dict; nothing else carried over), without its per-call overhead."""
    old = obj.__dict__
    new = obj.__class__.__new__(obj.__class__)
    new.__dict__.update(_check_key_fn=old["_check_key_fn"], _check_value_fn=old["_check_value_fn"],
                        _data=old["_data"].copy())
    return new


def _copy_typed(record: Any) -> Any:
    """A new record object of the same class (no per-item type checks: the items were checked once)."""
    new = _typed_copy(record)
    data = new.__dict__["_data"]
    if isinstance(record, ArrayRecord):
        for key, arr in data.items():
            clone = Array.__new__(Array)
            clone.__dict__.update(arr.__dict__)
            data[key] = clone
    elif list in map(type, data.values()):  # (a C-level scan: config records have hundreds of scalars)
        for key, value in data.items():
            if isinstance(value, list):
                data[key] = list(value)
    return new


def copy_record_dict(content: RecordDict) -> RecordDict:
    """A RecordDict whose records are new objects (Array payload bytes shared, lists copied)."""
    new = _typed_copy(content)
    data = new.__dict__["_data"]
    for key, record in data.items():
        if not isinstance(record, (ArrayRecord, ConfigRecord, MetricRecord)):
            raise TypeError(f"record '{key}' is a {type(record).__name__}, not a Flower record")
        data[key] = _copy_typed(record)
    return new


def copy_metadata(metadata: Metadata) -> Metadata:
    new = Metadata.__new__(Metadata)
    new.__dict__.update(metadata.__dict__)
    return new


def copy_message(msg: Message) -> Message:
    """A message with its own metadata and content (or error) objects."""
    meta = copy_metadata(msg.metadata)
    if msg.has_error():
        err = msg.error
        return Message(Error(code=err.code, reason=err.reason), metadata=meta)
    content = copy_record_dict(msg.content)
    state = msg.__dict__
    if state.get("_metadata") is msg.metadata and state.get("_content") is msg.content:
        new = Message.__new__(Message)  # the constructor's checks passed for the original already
        new.__dict__.update(state)
        new.__dict__["_metadata"], new.__dict__["_content"] = meta, content
        return new
    return Message(content, metadata=meta)


def copy_context(context: Context) -> Context:
    """A Context with its own state RecordDict and config dicts (what an actor gets in Ray)."""
    return Context(run_id=context.run_id, node_id=context.node_id, node_config=dict(context.node_config),
                   state=copy_record_dict(context.state), run_config=dict(context.run_config),
                   series_id=getattr(context, "series_id", 0))
