"""Copies of Flower messages, records and contexts at the engine's boundary.

Flower's simulation engine hands every ClientApp its own copy of the message and of the node's Context
(Ray pickles both on their way to an actor) and takes back a copy of the reply: nothing is shared
between the server's objects, the client's objects and the state that outlives a message. The
in-process engine gives the same guarantee more cheaply with *structural* copies: every container
(RecordDict, ArrayRecord, ConfigRecord, MetricRecord, Array, Metadata, Context) is a new object, while
the payload bytes of an Array are shared, which is safe because ``bytes`` are immutable. Lists inside
config and metric records are copied (they are mutable). The copies' fast paths are flcore/internals.py's.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, Metadata, MetricRecord, RecordDict

from flcore import internals


class _MessageWithMetadata(Protocol):
    def __call__(self, body: RecordDict | Error, /, *, metadata: Metadata) -> Message: ...


# Message's constructor called with a content or an error and a ``metadata``: the keyword is in its signature but
# not in its typed overloads (flcore/internals.py's PUBLIC_ONLY note); the same class, typed for that call.
message_with_metadata = cast(_MessageWithMetadata, Message)


def _copy_typed(record: Any) -> Any:
    """A new record object of the same class (no per-item type checks: the items were checked once)."""
    new = internals.typed_copy(record)
    if isinstance(record, ArrayRecord):
        internals.set_items(new, {key: internals.copy_array(arr) for key, arr in record.items()})
    elif list in map(type, record.values()):  # (a C-level scan: config records have hundreds of scalars)
        internals.set_items(new, {key: list(value) for key, value in record.items() if isinstance(value, list)})
    return new


def copy_record_dict(content: RecordDict) -> RecordDict:
    """A RecordDict whose records are new objects (Array payload bytes shared, lists copied)."""
    for key, record in content.items():
        if not isinstance(record, (ArrayRecord, ConfigRecord, MetricRecord)):
            raise TypeError(f"record '{key}' is a {type(record).__name__}, not a Flower record")
    new = internals.typed_copy(content)
    internals.set_items(new, {key: _copy_typed(record) for key, record in content.items()})
    return new


def copy_message(msg: Message) -> Message:
    """A message with its own metadata and content (or error) objects."""
    meta = internals.copy_metadata(msg.metadata)
    if msg.has_error():
        err = msg.error
        return message_with_metadata(Error(code=err.code, reason=err.reason), metadata=meta)
    return internals.message_like(msg, meta, copy_record_dict(msg.content))


def copy_context(context: Context) -> Context:
    """A Context with its own state RecordDict and config dicts (what an actor gets in Ray)."""
    return Context(run_id=context.run_id, node_id=context.node_id, node_config=dict(context.node_config),
                   state=copy_record_dict(context.state), run_config=dict(context.run_config),
                   series_id=getattr(context, "series_id", 0))
