"""What happens to one message at a node: Flower's simulation-engine semantics, in one function.

:func:`handle` runs the ClientApp on a copy of the message with a working copy of the node's Context,
and returns the reply and the Context to keep:

- success: the reply (its own objects) and the updated Context (the working copy);
- the ClientApp raises: an error reply with code 2 (``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``, what
  Flower's engine sends) naming the exception, and ``None``: the node keeps the Context it had before
  the message, exactly as in Ray simulation, where a failed actor call never writes its Context back.

Nothing here knows about processes: the sequential grid calls it in the driver process, the worker
pool calls it in its worker processes.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import time
import traceback
from typing import Callable

from flwr.app import Context, Error, Message
from flwr.common.constant import ErrorCode

from flcore import internals
from engines.copying import copy_context, copy_message

log = logging.getLogger("noniid_fl.engine")

ClientAppFn = Callable[[Message, Context], Message]


def _id_source() -> tuple[str, "itertools.count[int]"]:
    return f"{secrets.token_hex(8)}-{os.getpid():x}-", itertools.count(1)


_ID_PREFIX, _ID_COUNTER = _id_source()
os.register_at_fork(after_in_child=lambda: globals().update(zip(("_ID_PREFIX", "_ID_COUNTER"), _id_source())))


def new_message_id() -> str:
    """A message id unique across the run's processes (a random per-process prefix and a counter): what the
    SuperLink gives a pushed message or a reply, without the cost of a UUID per message."""
    return _ID_PREFIX + str(next(_ID_COUNTER))


def error_reply(msg: Message, code: int, reason: str) -> Message:
    """An error reply to ``msg``, as if sent by the node it was addressed to."""
    return stamp_reply(Message(Error(code=code, reason=reason), reply_to=msg), msg)


def stamp_reply(reply: Message, msg: Message) -> Message:
    """``reply`` with what the SuperLink sets on a reply: its own message id and the answering node's id."""
    return internals.stamp(reply, new_message_id(), msg.metadata.dst_node_id)


def handle(app: ClientAppFn, msg: Message, context: Context, copy_reply: bool = True
           ) -> tuple[Message, Context | None, float]:
    """Run ``app`` on ``msg`` for the node whose Context is ``context``.

    Returns (reply, context to keep or None to keep the old one, seconds spent). ``copy_reply`` copies
    the reply so the client keeps no reference into it (the worker pool pickles it instead)."""
    t0 = time.perf_counter()
    inbound = copy_message(msg)
    work = copy_context(context)
    try:
        reply = app(inbound, work)
        if not isinstance(reply, Message):
            raise TypeError(f"the ClientApp returned {type(reply).__name__}, not a Message")
        if reply.metadata.reply_to_message_id != msg.metadata.message_id:
            raise ValueError("the ClientApp's reply does not answer the message it was given "
                             "(build it with Message(content, reply_to=msg))")
    except Exception as exc:  # noqa: BLE001 - a ClientApp error becomes an error reply, as in Flower
        log.error("ClientApp raised on a '%s' message for node %s:\n%s", msg.metadata.message_type,
                  msg.metadata.dst_node_id, traceback.format_exc())
        reason = f"{type(exc).__name__}: {exc}"
        return error_reply(msg, ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason), None, time.perf_counter() - t0
    reply = stamp_reply(reply, msg)
    if work.run_config == context.run_config:  # keep sharing one run-config dict between a run's Contexts
        work.run_config = context.run_config
    if copy_reply:
        reply = copy_message(reply)
    return reply, work, time.perf_counter() - t0
