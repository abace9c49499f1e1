#!/usr/bin/env python
"""A SuperLink whose Fleet API bounds each reply message as a whole, not only each request body (issue 42 item 3).

    python deploy/link_guard.py [--max-reply-objects N] [--max-reply-bytes B] -- <flower-superlink args>

Why: flwr 1.42 takes a reply in pieces. ``push-messages`` carries the message and its object tree (ids only), and
the SuperLink then accepts one ``push-object`` per id of that tree. The proxy bounds every body
(``deploy/body_limits.py``), but nothing bounds the tree: a participant holding one legitimate key assembled a
120 MiB reply from 760 bodies that were each under the limit. It was stored whole (SuperLink memory, database
and ServerApp) before the ServerApp's shape check could refuse it.

This launcher runs Flower's own ``flower-superlink`` after wrapping two Fleet handlers, by their public names in
``flwr.superlink.servicer.fleet.fleet_handlers``. The HTTP router and the gRPC servicer both call them through that
module:

- ``push-messages``: a reply whose object tree has more than ``max_reply_objects`` ids is refused with 413 before
  Flower stores anything (no message, no preregistered object, no push session);
- ``push-object``: every push session (one per accepted ``push-messages``) may store at most ``max_reply_bytes``
  of object content in total. The object that would cross the limit is refused with 413, and so is every later
  object of that session. At the first refusal the reply is removed, through the LinkState's and ObjectStore's
  public methods: ``delete_messages`` (the instruction and this reply) and ``object_store.delete`` (the reply's
  stored objects, reference-counted). The ServerApp is then told, at once, that the reply is unavailable
  (Flower's MESSAGE_UNAVAILABLE: "objects are unavailable" if its pull had begun, "could not be found" if not) and
  records a failure for that node (tests/test_hostile_fleet_nodes.py). Left alone,
  Flower would hand it the incomplete reply, and its pull would wait for the missing objects until the push
  session expired: ``OBJECT_PUSH_SESSION_TTL_SECONDS``, 180 s after the last stored object. A ``push-object`` without a session id
  is refused too: Flower's legacy path would look the session up by object id, and its bytes could not be
  charged to a reply. flwr 1.42 SuperNodes always send one.

So an accepted reply holds at most ``max_reply_bytes`` of objects in the SuperLink's store. The defaults below are
model-independent (no reply of a model this project ships comes near them);
``python -m deploy.body_limits -c "<run config>"`` prints the limits derived for a run's model
(``FLEET_MAX_REPLY_OBJECTS``, ``FLEET_MAX_REPLY_BYTES``: twice the largest legitimate reply plus a margin).
``deploy/superlink.sh`` starts the SuperLink through this launcher and reads those two variables.
A Flower whose handler module lacks these names is refused at start, naming the module: the guard never
quietly turns itself off.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

DEFAULT_MAX_REPLY_OBJECTS = 65536
DEFAULT_MAX_REPLY_BYTES = 1 << 30          # 1 GiB: ResNet-18 with SCAFFOLD's two records is ~90 MB
SESSION_MEMORY_S = 2 * 180.0               # twice Flower's push-session TTL: after that Flower has dropped it too
HANDLERS_MODULE = "flwr.superlink.servicer.fleet.fleet_handlers"


def tree_size(tree: Any) -> int:
    """Number of object ids in an ObjectTree (its root and every descendant); iterative, so a deep tree
    cannot exhaust the stack."""
    count, stack = 0, [tree]
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node.children)
    return count


@dataclass
class ReplyBudget:
    """What each push session of the Fleet API may still store: pure bookkeeping, thread-safe.

    :meth:`check_tree` judges a ``push-messages`` request's tree, :meth:`open` starts a session's budget,
    :meth:`charge` takes one ``push-object``'s bytes. Each method returns ``None`` to accept, or the refusal's
    reason."""

    max_objects: int = DEFAULT_MAX_REPLY_OBJECTS
    max_bytes: int = DEFAULT_MAX_REPLY_BYTES
    memory_s: float = SESSION_MEMORY_S
    clock: Callable[[], float] = time.monotonic
    used: dict[str, int] = field(default_factory=dict)
    replies: dict[str, tuple[str, str]] = field(default_factory=dict)   # session -> (instruction id, reply id)
    refused: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)     # refused sessions whose reply was handed out for removal
    seen: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.max_objects < 1 or self.max_bytes < 1:
            raise ValueError(f"max-reply-objects and max-reply-bytes must be positive, got {self.max_objects} "
                             f"and {self.max_bytes}")

    def check_tree(self, objects: int) -> str | None:
        if objects > self.max_objects:
            return (f"reply refused: its object tree has {objects} objects, more than the {self.max_objects} a reply "
                    "may carry (FLEET_MAX_REPLY_OBJECTS)")
        return None

    def open(self, session_id: str, instruction_id: str = "", reply_id: str = "") -> None:
        with self._lock:
            self._forget_old()
            self.used[session_id] = 0
            self.replies[session_id] = (instruction_id, reply_id)
            self.seen[session_id] = self.clock()

    def reply_of(self, session_id: str) -> tuple[str, str]:
        """(instruction id, reply id) of a session :meth:`open` was told about; ("", "") otherwise."""
        with self._lock:
            return self.replies.get(session_id, ("", ""))

    def take_removal(self, session_id: str) -> tuple[str, str] | None:
        """The (instruction id, reply id) to remove once a session was refused: returned to one caller only,
        however many of that session's objects arrive at once; None otherwise."""
        with self._lock:
            if session_id not in self.refused or session_id in self.removed:
                return None
            self.removed.add(session_id)
            return self.replies.get(session_id, ("", ""))

    def charge(self, session_id: str, nbytes: int) -> str | None:
        if not session_id:
            return "push-object refused: no session id (each reply's objects are charged to its push session)"
        with self._lock:
            if session_id not in self.used:
                return None        # not a session this Fleet API opened: Flower refuses its objects itself
            self.seen[session_id] = self.clock()
            if session_id in self.refused:
                return f"push-object refused: session {session_id} already exceeded its reply budget"
            total = self.used[session_id] + nbytes
            if total > self.max_bytes:
                self.refused.add(session_id)
                return (f"push-object refused: the reply of session {session_id} would hold {total} bytes of "
                        f"objects, more than {self.max_bytes} (FLEET_MAX_REPLY_BYTES)")
            self.used[session_id] = total
            return None

    def _forget_old(self) -> None:
        cutoff = self.clock() - self.memory_s
        for sid in [s for s, t in self.seen.items() if t < cutoff]:
            self.seen.pop(sid, None)
            self.used.pop(sid, None)
            self.replies.pop(sid, None)
            self.refused.discard(sid)
            self.removed.discard(sid)


def remove_reply(state: Any, instruction_id: str, reply_id: str) -> None:
    """Drop a refused reply: the instruction and its reply from the LinkState, the reply's objects from the
    ObjectStore (both public methods of Flower's state classes)."""
    if instruction_id:
        state.delete_messages(message_ins_ids={instruction_id})
    if reply_id:
        state.object_store.delete(reply_id)


def install(budget: ReplyBudget) -> Callable[[], None]:
    """Wrap Flower's push-messages and push-object Fleet handlers with ``budget``; returns an undo function.

    Raises RuntimeError naming the module when this Flower's handlers are not where flwr 1.42 has them."""
    import importlib

    from fastapi import HTTPException

    try:
        handlers: Any = importlib.import_module(HANDLERS_MODULE)
        push_messages, push_object = handlers.push_messages, handlers.push_object
    except (ImportError, AttributeError) as exc:
        raise RuntimeError(f"link_guard: {HANDLERS_MODULE}.push_messages/push_object not found in this Flower "
                           f"({exc}); the reply bounds cannot be enforced, so the SuperLink is not started") from None

    def guarded_push_messages(request: Any, state: Any) -> Any:
        for tree in request.message_object_trees:
            reason = budget.check_tree(tree_size(tree))
            if reason:
                raise HTTPException(status_code=413, detail=reason)
        response = push_messages(request=request, state=state)
        if response.session_id and request.messages_list:
            meta = request.messages_list[0].metadata
            budget.open(response.session_id, meta.reply_to_message_id, meta.message_id)
        return response

    def guarded_push_object(request: Any, state: Any) -> Any:
        reason = budget.charge(request.session_id, len(request.object_content))
        if reason:
            ids = budget.take_removal(request.session_id)
            if ids is not None:
                remove_reply(state, *ids)
            raise HTTPException(status_code=413, detail=reason)
        return push_object(request=request, state=state)

    handlers.push_messages, handlers.push_object = guarded_push_messages, guarded_push_object

    def undo() -> None:
        handlers.push_messages, handlers.push_object = push_messages, push_object

    return undo


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    ours, rest = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
    parser = argparse.ArgumentParser(prog="link_guard.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-reply-objects", type=int, default=DEFAULT_MAX_REPLY_OBJECTS)
    parser.add_argument("--max-reply-bytes", type=int, default=DEFAULT_MAX_REPLY_BYTES)
    ns = parser.parse_args(ours)
    try:
        budget = ReplyBudget(ns.max_reply_objects, ns.max_reply_bytes)
        install(budget)
    except (ValueError, RuntimeError) as exc:
        print(f"link_guard.py: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"link_guard.py: a reply may carry at most {budget.max_objects} objects and {budget.max_bytes} bytes "
          "of them", file=sys.stderr)
    from flwr.superlink.cli import flower_superlink

    sys.argv = ["flower-superlink", *rest]
    flower_superlink()


if __name__ == "__main__":
    main()
