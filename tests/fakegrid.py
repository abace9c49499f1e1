"""An in-process Grid for tests: the in-process engine's sequential grid (engines.grid.InProcessGrid: this
project's real ClientApp, one Context per partition, messages and Contexts copied at the boundary as in
Flower's engine) with optional misbehaviour per client, and every pushed message kept in ``sent``.

Behaviours: "raise" (the ClientApp raises -> error reply, code 2), "nan" (returns NaN parameters),
"shape" (returns a wrongly shaped tensor), "silent" (never answers -> timeout), "dead" (the SuperLink
answers for a lost node: error code 5 from node 1), or a callable ``fn(msg, reply) -> reply`` that rewrites the
real ClientApp's reply (a hostile participant: tests/test_reply_fuzz.py).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
from flwr.app import Context, Error, Message

from engines.delivery import handle
from engines.grid import InProcessGrid
from flcore.records import params_to_record, record_to_params


class FakeGrid(InProcessGrid):
    def __init__(self, num_nodes: int, behaviours: dict[int, Any] | None = None,
                 behaviour_phases: tuple[str, ...] = ("train",)) -> None:
        super().__init__(num_nodes, record_sent=True)
        self.behaviours = behaviours or {}
        self.behaviour_phases = behaviour_phases
        self.lost: set[int] = set()  # a dead node leaves the SuperLink's node list, as in Flower

    def get_node_ids(self):
        return [n for n in self.node_ids if n not in self.lost]

    def _deliver(self, msg: Message) -> Message | None:
        nid = msg.metadata.dst_node_id
        cid = self.node_ids.index(nid)
        mtype = msg.metadata.message_type
        behaviour = self.behaviours.get(cid) if mtype.split(".")[0] in self.behaviour_phases else None
        if behaviour == "silent":
            return None
        if behaviour == "dead":
            reply = Message(Error(code=5, reason="node lost (missed heartbeats)"), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = 1
            self.lost.add(nid)
            return reply
        if behaviour == "raise":  # the engine's own handling of a ClientApp that raises
            def crash(_msg: Message, _ctx: Context) -> Message:
                raise RuntimeError(f"client {cid} crashed on purpose")

            return handle(crash, msg, self.contexts[nid])[0]
        reply = super()._deliver(msg)
        if callable(behaviour) and reply is not None and not reply.has_error():
            return behaviour(msg, reply)
        if behaviour in ("nan", "shape") and not reply.has_error():
            params = record_to_params(reply.content["arrays"])
            bad = OrderedDict(params)
            key = next(iter(bad))
            bad[key] = np.full_like(bad[key], np.nan) if behaviour == "nan" else np.zeros(3, bad[key].dtype)
            reply.content["arrays"] = params_to_record(bad)
        return reply
