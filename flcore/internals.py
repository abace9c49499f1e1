"""The one module that touches private members of Flower (issue round-pipeline: public APIs only).

Flower's records, messages and metadata keep their state in ``__dict__`` entries (``_data``, ``_message_id``,
...). Flower itself writes them (its grids set ``metadata.__dict__["_message_id"]``, ``TypedDict.copy`` fills
``_data``), but they are not its public API. The engine writes them in a few places because the public way
costs per item or per message what the engine's in-process delivery is otherwise spared; every such place is
a function here, and every function has a public-API path that gives the same objects:

========================  ====================================  ========================================
function                  private path                          public path
========================  ====================================  ========================================
:func:`stamp`             the ids written into the message's    a new Message around a ``Metadata``
                          metadata (as Flower's grids do)       built by its constructor
:func:`typed_copy`        ``TypedDict.copy`` without its call   ``record.copy()``
:func:`copy_array`        a new Array sharing the bytes         ``Array(dtype=, shape=, stype=, data=)``
:func:`array_like`        a memoized Array's fields, new bytes  ``Array(dtype=, shape=, stype=, data=)``
:func:`copy_metadata`     the metadata's fields copied          ``Metadata(...)`` from its properties
:func:`message_like`      a Message without re-checking it      ``Message(content, metadata=)``
:func:`filled`            a record filled without per-item      ``cls(dict(values))`` (Flower's checks)
                          checks (the values provably pass)
========================  ====================================  ========================================

``PUBLIC_ONLY`` (the environment variable ``NONIID_FL_PUBLIC_ONLY=1`` when this module is imported) selects
the public path everywhere. One caveat: Flower has no public way to give a message ids of one's choosing (its
SuperLink does that). The public path builds the message with ``Message(content, metadata=...)``: the
``metadata`` keyword is in the constructor's signature, but not in its typed overloads, and Flower's source
calls it internal. It is the most public route flwr 1.42 offers. Results do not depend on it: tests/test_internals.py checks each pair and runs a
federation both ways (same digest); ``benchmarks/bench_public_api.py`` measures what the private paths save.
The deployment's patches of Flower's modules (deploy/tuned.py, deploy/node_guard.py) replace module
attributes and call only what Flower exports, except the SuperNode's pull function: that wrapper is
:func:`wrap_pull`, here too.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from flwr.app import Array, Message, Metadata

PUBLIC_ONLY = os.environ.get("NONIID_FL_PUBLIC_ONLY", "") == "1"


def stamp(msg: Message, message_id: str, src_node_id: int) -> Message:
    """``msg`` with the ids a SuperLink gives a pushed message (its id, the sender's node id). Private path:
    written into ``msg`` itself, as Flower's own grids do, and ``msg`` returned; public path: a new Message
    with the same content (or error) and a copy of the metadata built by ``Metadata``'s constructor, ``msg``
    left as it was. Callers use the returned message."""
    if not PUBLIC_ONLY:
        meta = msg.metadata.__dict__
        meta["_message_id"], meta["_src_node_id"] = message_id, src_node_id
        return msg
    new = _metadata(msg.metadata, message_id=message_id, src_node_id=src_node_id)
    if msg.has_error():
        return Message(msg.error, metadata=new)  # type: ignore[call-overload]  # (see PUBLIC_ONLY's note)
    return Message(msg.content, metadata=new)  # type: ignore[call-overload]


def copy_metadata(metadata: Metadata) -> Metadata:
    """A new Metadata with the same values."""
    if PUBLIC_ONLY:
        return _metadata(metadata)
    new = Metadata.__new__(Metadata)
    new.__dict__.update(metadata.__dict__)
    return new


def _metadata(m: Metadata, **changes: Any) -> Metadata:
    values = {"run_id": m.run_id, "message_id": m.message_id, "src_node_id": m.src_node_id,
              "dst_node_id": m.dst_node_id, "reply_to_message_id": m.reply_to_message_id, "group_id": m.group_id,
              "created_at": m.created_at, "ttl": m.ttl, "message_type": m.message_type,
              "src_task_id": m.src_task_id, "dst_task_id": m.dst_task_id, **changes}
    new = Metadata(**values)
    new.delivered_at = m.delivered_at
    return new


def message_like(msg: Message, metadata: Metadata, content: Any) -> Message:
    """A Message with ``metadata`` and ``content`` (a RecordDict) in place of ``msg``'s. Private path: ``msg``'s
    state with the two replaced, without the constructor's checks, which ``msg`` passed already."""
    if not PUBLIC_ONLY:
        state = msg.__dict__
        if state.get("_metadata") is msg.metadata and state.get("_content") is msg.content:
            new = Message.__new__(Message)
            new.__dict__.update(state)
            new.__dict__["_metadata"], new.__dict__["_content"] = metadata, content
            return new
    return Message(content, metadata=metadata)  # type: ignore[call-overload]


def typed_copy(obj: Any) -> Any:
    """``obj.copy()`` for a Flower record or RecordDict (``TypedDict.copy``: the same class, the same check
    functions, a copy of the item dict), without its per-call overhead on the private path."""
    if PUBLIC_ONLY:
        return obj.copy()
    old = obj.__dict__
    new = obj.__class__.__new__(obj.__class__)
    new.__dict__.update(_check_key_fn=old["_check_key_fn"], _check_value_fn=old["_check_value_fn"],
                        _data=old["_data"].copy())
    return new


def set_items(record: Any, items: Mapping[str, Any]) -> None:
    """``record[key] = value`` for every item, where each item provably passes the record's checks (the
    caller's guarantee); the private path skips the checks."""
    if PUBLIC_ONLY:
        for key, value in items.items():
            record[key] = value
        return
    record.__dict__["_data"].update(items)


def copy_array(arr: Array) -> Array:
    """A new Array with ``arr``'s values, sharing its (immutable) bytes."""
    if PUBLIC_ONLY:
        return Array(dtype=arr.dtype, shape=tuple(arr.shape), stype=arr.stype, data=arr.data)
    clone = Array.__new__(Array)
    clone.__dict__.update(arr.__dict__)
    return clone


def array_like(proto: Array, data: bytes) -> Array:
    """An Array with ``proto``'s dtype, shape and stype and the bytes ``data``. Private path: ``proto``'s
    fields copied without the constructor's validation (``proto`` passed it), Flower's object-id cache
    dropped, the bytes set through Array's own setter."""
    if PUBLIC_ONLY:
        return Array(dtype=proto.dtype, shape=tuple(proto.shape), stype=proto.stype, data=bytes(data))
    arr = Array.__new__(Array)
    arr.__dict__.update(proto.__dict__)
    arr.__dict__.pop("_object_id", None)
    arr.__dict__.pop("_chunks", None)
    arr.data = data
    return arr


def filled(cls: type, values: Mapping[str, Any]) -> Any:
    """``cls(dict(values))`` for a Flower record class, where every item provably passes its checks (the
    caller's guarantee): the private path fills the record without them."""
    if PUBLIC_ONLY:
        return cls(dict(values))
    record = cls()
    record.__dict__["_data"].update(values)
    return record


# --- the SuperNode's pull (deploy/node_guard.py) -----------------------------------------------------------
PULL_FUNCTION = "_pull_and_store_message"


def wrap_pull(loop_module: Any, after: Callable[[Any], None]) -> bool:
    """Make the SuperNode's polling loop call ``after(run_id)`` after every pull (``run_id`` None: nothing to
    run), by wrapping flwr's private ``_pull_and_store_message`` in ``loop_module``. Returns False, changing
    nothing, on the public path or when the installed flwr has no such function: the caller then reports
    liveness from what it can see publicly (deploy/node_guard.py)."""
    pull = getattr(loop_module, PULL_FUNCTION, None)
    if PUBLIC_ONLY or not callable(pull):
        return False

    def pulled(*args: Any, **kwargs: Any) -> Any:
        run_id = pull(*args, **kwargs)
        after(run_id)
        return run_id

    setattr(loop_module, PULL_FUNCTION, pulled)
    return True
