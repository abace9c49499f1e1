"""A Flower ``Grid`` whose nodes live in this process: the in-process engine's sequential mode.

The ServerApp's strategies talk to it exactly as to Flower's grids (``get_node_ids``, ``push_messages``,
``pull_messages``, ``send_and_receive``), with real Flower ``Message``s; each node is a Flower ``Context``
(``partition-id`` / ``num-partitions`` node config, the run config, a ``state`` RecordDict that persists
for the run) and each message is handled by the real ClientApp (:func:`engines.delivery.handle`: copies
in and out, error reply on an exception, the Context kept only on success - Flower's engine semantics).

Sequential mode handles each message when it is pushed, one after another, so a pull right after the
push finds every reply: no polling, no threads, no processes. (Consequence: a ClientApp that hangs hangs
the run, and ``round-timeout`` cannot interrupt it; the worker pool, :mod:`engines.pool`, can time out.)

``_deliver(msg)`` is the one hook a subclass overrides (tests use it to make clients misbehave).
"""

from __future__ import annotations

import importlib
import secrets
from typing import Any, ClassVar, Iterable, Mapping, cast

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from flcore import internals
from engines.delivery import ClientAppFn, handle, new_message_id

DEFAULT_CLIENT_APP = "client_app.app:app"
SERVER_NODE_ID = 0  # src_node_id of instruction messages (the ServerApp's Context node id in Flower)


def load_client_app(ref: str | ClientAppFn) -> ClientAppFn:
    """``"module:attribute"`` -> the ClientApp object (an object is returned as it is)."""
    if not isinstance(ref, str):
        return ref
    return cast(ClientAppFn, load_reference(ref))  # what the reference names is the app (unchecked, as in Flower)


def load_reference(ref: str) -> object:
    """The object ``"module:attribute"`` names (``attribute`` may be dotted)."""
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"client app reference must look like 'package.module:attribute', got {ref!r}")
    obj: object = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def new_node_ids(num_nodes: int, first_node_id: int | None = None) -> list[int]:
    """``num_nodes`` distinct node ids: random 63-bit numbers, like Flower's (fixed for the run), or
    ``first_node_id, first_node_id + 1, ...``. 0 and 1 are never used (the server and the SuperLink)."""
    if num_nodes < 1:
        raise ValueError(f"the in-process engine needs at least 1 node, got {num_nodes}")
    if first_node_id is not None:
        if first_node_id < 2:
            raise ValueError(f"first_node_id must be >= 2 (0 and 1 are the server and the SuperLink), got {first_node_id}")
        return [first_node_id + i for i in range(num_nodes)]
    ids: list[int] = []
    seen: set[int] = set()
    while len(ids) < num_nodes:
        nid = secrets.randbits(63)
        if nid > 1 and nid not in seen:
            seen.add(nid)
            ids.append(nid)
    return ids


def node_context(node_ids: list[int], node: int, run_config: dict[str, Any], run_id: int) -> Context:
    """A node's fresh Context, as Flower's simulation registers it: partition-id i of len(node_ids), an
    empty state. ``run_config`` is shared, not copied (every ClientApp call gets its own copy)."""
    return Context(run_id=run_id, node_id=node,
                   node_config={"partition-id": node_ids.index(node), "num-partitions": len(node_ids)},
                   state=RecordDict(), run_config=run_config)


def node_contexts(node_ids: list[int], run_config: dict[str, Any], run_id: int) -> dict[int, Context]:
    """One fresh Context per node (one run-config dict shared by all: memory does not grow with it)."""
    n = len(node_ids)
    return {nid: Context(run_id=run_id, node_id=nid, node_config={"partition-id": i, "num-partitions": n},
                         state=RecordDict(), run_config=run_config) for i, nid in enumerate(node_ids)}


class InProcessGrid(Grid):
    """Nodes in this process; each pushed message is handled at once, in push order.

    ``run_config`` is every node's ``context.run_config`` (what ``flwr run`` gives a ClientApp).
    ``record_sent`` keeps every pushed message in ``sent`` (for tests; off by default: it grows).
    """

    #: every node is made with the grid (none registers later): the server counts them without waiting
    nodes_fixed_at_start: ClassVar[bool] = True

    def __init__(self, num_nodes: int, first_node_id: int | None = 1000, *, run_config: Mapping[str, Any] | None = None,
                 client_app: str | ClientAppFn = DEFAULT_CLIENT_APP, run_id: int = 1, record_sent: bool = False) -> None:
        self.node_ids = new_node_ids(num_nodes, first_node_id)
        self._node_set = set(self.node_ids)
        self.run_id = run_id
        self.run_config = dict(run_config or {})
        self.contexts = node_contexts(self.node_ids, self.run_config, run_id)
        self.client_app = load_client_app(client_app)
        self.messages = 0
        self.record_sent = record_sent
        self.sent: list[Message] = []
        self._replies: dict[str, Message] = {}
        if TaskIdentity._run_id is None:  # what Flower sets in the ServerApp's process before main() runs
            TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = run_id, 1, SERVER_NODE_ID

    # --- the Grid API the strategies use ---------------------------------------------------------------
    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            self._check(msg)
            msg_id = new_message_id()
            msg = internals.stamp(msg, msg_id, SERVER_NODE_ID)
            self.messages += 1
            if self.record_sent:
                self.sent.append(msg)
            self._dispatch(msg_id, msg)
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    def close(self) -> None:
        """Release what the grid holds (nothing in sequential mode; the pool stops its workers)."""

    def __enter__(self) -> "InProcessGrid":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- delivery ----------------------------------------------------------------------------------
    def _check(self, msg: Message) -> None:
        nid = msg.metadata.dst_node_id
        if nid not in self._node_set:
            raise ValueError(f"message '{msg.metadata.message_type}' is addressed to node {nid}, "
                             f"which is not one of this grid's {len(self.node_ids)} nodes")
        if msg.metadata.reply_to_message_id:
            raise ValueError("cannot push a reply message (reply_to_message_id is set)")

    def _dispatch(self, msg_id: str, msg: Message) -> None:
        reply = self._deliver(msg)
        if reply is not None:
            self._replies[msg_id] = reply

    def _deliver(self, msg: Message) -> Message | None:
        """Handle ``msg`` at its node now; the reply, or None for no reply (the hook tests override)."""
        nid = msg.metadata.dst_node_id
        reply, context, _ = handle(self.client_app, msg, self.contexts[nid])
        if context is not None:
            self.contexts[nid] = context
        return reply

    # --- parts of the abstract Grid the project does not use ---------------------------------------
    def set_run(self, run: Run | int) -> None:  # Grid's takes a Run; this grid has only its id (an int works too)
        self.run_id = run if isinstance(run, int) else run.run_id

    @property
    def run(self):  # noqa: ANN201 - Flower's Run object does not exist without a SuperLink
        return None

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id,
                       ttl=ttl)

    def get_nodes(self):  # noqa: ANN201
        return []
