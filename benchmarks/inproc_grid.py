"""A Flower ``Grid`` that runs this project's ClientApp in this process, one message after another.

It removes Ray, the simulated SuperLink and the polling from a run while keeping everything else of the
real path: the strategies build the same messages, ``client_app.app`` (the real ClientApp object, with
Flower's message-type routing) handles them with one ``Context`` per node, and replies come back as
Flower messages. The method-cost benchmark uses it so that a method's extra client compute, server work
and message bytes are measured without the simulation engine's start-up and scheduling noise.
Messages are pickled on the way in and out, like the simulation engine does for its Ray actors, so
nothing is shared between server and client objects.
"""

from __future__ import annotations

import pickle
import uuid
from typing import Iterable

from flwr.app import Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from client_app.app import app as client_app


class InProcessGrid(Grid):
    """Delivers each pushed message at once (in push order) and keeps the reply until it is pulled.

    ``_deliver`` is the one hook: it takes a message and returns the reply, or None for no reply
    (the test grid uses it to make clients misbehave)."""

    def __init__(self, num_nodes: int, first_node_id: int = 1000) -> None:
        self.node_ids = [first_node_id + i for i in range(num_nodes)]
        self.contexts = {nid: Context(run_id=1, node_id=nid, node_config={"partition-id": i, "num-partitions": num_nodes},
                                      state=RecordDict(), run_config={}) for i, nid in enumerate(self.node_ids)}
        self.messages = 0
        self.sent: list[Message] = []
        self._replies: dict[str, Message] = {}
        if TaskIdentity._run_id is None:  # what the ServerApp process has set before main() runs
            TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, 0

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg_id = str(uuid.uuid4())
            msg.metadata.__dict__["_message_id"] = msg_id
            msg.metadata.__dict__["_src_node_id"] = 0
            self.messages += 1
            self.sent.append(msg)
            reply = self._deliver(msg)
            if reply is not None:
                self._replies[msg_id] = reply
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    def _deliver(self, msg: Message) -> Message | None:
        inbound = pickle.loads(pickle.dumps(msg))
        try:
            reply = client_app(inbound, self.contexts[msg.metadata.dst_node_id])
        except Exception as exc:  # noqa: BLE001 - what the simulation engine does: an error reply
            reply = Message(Error(code=2, reason=repr(exc)), reply_to=inbound)
        reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
        return pickle.loads(pickle.dumps(reply))

    # --- parts of the abstract Grid the project does not use --------------------------------------------
    def set_run(self, run_id: int) -> None:
        pass

    @property
    def run(self):
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_nodes(self):
        return []
