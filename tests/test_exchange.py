"""strategies/exchange.py: the push/pull wait loop (timing with a fake clock) and reply bookkeeping."""

from __future__ import annotations

from flwr.app import Error, Message, RecordDict

from engines.grid import InProcessGrid
from strategies.exchange import exchange, push_and_pull


class DelayedGrid(InProcessGrid):
    """Replies become pullable only after ``ready[i]`` seconds of the fake clock (None: never)."""

    def __init__(self, ready: list[float | None]) -> None:
        super().__init__(len(ready))
        self.ready = ready
        self.now = 0.0
        self.pulls: list[float] = []
        self._due: dict[str, tuple[float, Message]] = {}

    def push_messages(self, messages):
        ids = []
        for i, msg in enumerate(messages):
            msg_id = f"m{i}"
            msg.metadata.__dict__["_message_id"] = msg_id
            if self.ready[i] is not None:
                reply = Message(RecordDict(), reply_to=msg)
                reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
                self._due[msg_id] = (self.ready[i], reply)
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids):
        self.pulls.append(self.now)
        out = [r for i, (t, r) in list(self._due.items()) if i in set(message_ids) and t <= self.now]
        for r in out:
            del self._due[r.metadata.reply_to_message_id]
        return out

    def sleep(self, s: float) -> None:
        assert s > 0
        self.now += s


def _messages(grid: InProcessGrid, n: int) -> list[Message]:
    return [Message(RecordDict(), dst_node_id=grid.node_ids[i], message_type="query", group_id="0") for i in range(n)]


def test_fast_replies_are_collected_within_the_first_polls_not_after_a_fixed_3s():
    grid = DelayedGrid([0.0, 0.07])
    replies = push_and_pull(grid, _messages(grid, 2), timeout=60.0, poll=3.0, clock=lambda: grid.now, sleep=grid.sleep)
    assert len(replies) == 2
    assert grid.now < 0.2  # Flower's send_and_receive on the deployment grid would have slept 3 s


def test_waits_grow_geometrically_up_to_the_poll_interval():
    grid = DelayedGrid([10.0])
    push_and_pull(grid, _messages(grid, 1), timeout=60.0, poll=1.0, clock=lambda: grid.now, sleep=grid.sleep)
    gaps = [b - a for a, b in zip(grid.pulls, grid.pulls[1:])]
    assert abs(gaps[0] - 0.05) < 1e-12 and abs(gaps[1] - 0.075) < 1e-12
    assert max(gaps) <= 1.0 + 1e-12 and abs(gaps[-1] - 1.0) < 1e-12
    assert 10.0 <= grid.pulls[-1] < 11.0  # collected within one poll interval of being ready


def test_stops_at_the_timeout_and_returns_what_arrived():
    grid = DelayedGrid([0.0, None])
    replies = push_and_pull(grid, _messages(grid, 2), timeout=5.0, poll=0.5, clock=lambda: grid.now, sleep=grid.sleep)
    assert len(replies) == 1
    assert abs(grid.now - 5.0) < 1e-9  # the last sleep is cut to the deadline, never past it


def test_exchange_orders_replies_and_failures_by_client_whatever_the_arrival_order():
    class Reversed(InProcessGrid):
        def _deliver(self, msg):
            if msg.metadata.dst_node_id == self.node_ids[1]:
                return Message(Error(code=2, reason="boom"), reply_to=msg)
            reply = Message(RecordDict(), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
            return reply

        def pull_messages(self, message_ids):
            return list(reversed(super().pull_messages(message_ids)))

    grid = Reversed(4)
    sends = {cid: (grid.node_ids[cid], RecordDict()) for cid in (3, 0, 2, 1)}
    res = exchange(grid, sends, "query", timeout=1.0, server_round=0, poll=0.1)
    assert list(res.replies) == [0, 2, 3]
    assert [(f.cid, f.kind) for f in res.failures] == [(1, "error")]
