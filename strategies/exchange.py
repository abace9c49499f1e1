"""One message exchange with a set of clients: send, wait (with a timeout), sort out what came back.

Every exchange of every strategy goes through :func:`exchange`, so failures are handled in one place:
- an error reply from the ClientApp (it raised) -> failure kind "error";
- an error reply sent by the SuperLink for a dead node (src_node_id = 1, mapped back through
  ``reply_to_message_id``) -> failure kind "node-lost";
- no reply before the timeout -> failure kind "timeout".

Replies are collected with Flower's ``Grid.push_messages`` / ``Grid.pull_messages`` and our own wait
loop (:func:`push_and_pull`) instead of ``Grid.send_and_receive``, whose deployment grid (flwr 1.42,
``http_grid``) sleeps a hard-coded 3 s between pulls: an exchange that is answered in 0.2 s still took
3 s. Here the wait starts at 50 ms and grows by half each pull up to ``reply-poll-interval``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

from flwr.app import ArrayRecord, Message, RecordDict
from flwr.serverapp import Grid

log = logging.getLogger("noniid_fl")


@dataclass
class Failure:
    cid: int
    phase: str
    kind: str
    reason: str

    def as_dict(self) -> dict:
        return {"cid": self.cid, "phase": self.phase, "kind": self.kind, "reason": self.reason}


@dataclass
class ExchangeResult:
    replies: dict[int, Message] = field(default_factory=dict)  # cid -> reply content message
    failures: list[Failure] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0


def record_dict_nbytes(content: RecordDict) -> int:
    total = 0
    for rec in content.values():
        if isinstance(rec, ArrayRecord):
            total += sum(len(arr.data) for arr in rec.values())
    return total


@dataclass(frozen=True)
class ExchangeRecord:
    """What an exchange observer sees of one exchange (:func:`observe_exchanges`)."""

    phase: str
    message_type: str
    server_round: int
    messages: int
    replies: int
    bytes_sent: int
    bytes_received: int
    start: float      # time.time() when it began
    seconds: float


_OBSERVERS: list[Callable[[ExchangeRecord], None]] = []


@contextlib.contextmanager
def observe_exchanges(observer: Callable[[ExchangeRecord], None]) -> Iterator[None]:
    """Call ``observer`` after every exchange of every strategy while the block runs (benchmarks time the
    exchanges this way, instead of replacing :func:`exchange` in the modules that call it)."""
    _OBSERVERS.append(observer)
    try:
        yield
    finally:
        _OBSERVERS.remove(observer)


def exchange_observers() -> int:
    """How many observers are attached (0 outside :func:`observe_exchanges` blocks)."""
    return len(_OBSERVERS)


FIRST_POLL = 0.05


def push_and_pull(grid: Grid, messages: list[Message], timeout: float, poll: float,
                  clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
                  ) -> list[Message]:
    """Push ``messages``, then pull replies until every message is answered or ``timeout`` s have passed.

    The pause between pulls starts at min(50 ms, poll) and grows 1.5x per pull up to ``poll``, so fast
    rounds are collected within tens of milliseconds and long ones cost one small request per ``poll``.
    Always pulls at least once. Returns the replies in arrival order (error replies included).
    """
    pending = set(grid.push_messages(messages))
    end = clock() + timeout
    replies: list[Message] = []
    wait = min(FIRST_POLL, poll)
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        now = clock()
        if not pending or now >= end:
            break
        sleep(min(wait, end - now))
        wait = min(wait * 1.5, poll)
    return replies


def exchange(grid: Grid, sends: dict[int, tuple[int, RecordDict]], message_type: str, timeout: float,
             server_round: int, phase: str | None = None, poll: float = 0.1) -> ExchangeResult:
    """Send ``sends[cid] = (node_id, content)`` and collect replies keyed by client id (wait loop:
    :func:`push_and_pull`, pausing at most ``poll`` s between pulls)."""
    phase = phase or message_type
    t0 = time.time()
    result = ExchangeResult()
    if not sends:
        return result
    messages: list[tuple[int, Message]] = []
    for cid, (node_id, content) in sends.items():
        result.bytes_sent += record_dict_nbytes(content)
        messages.append((cid, Message(content=content, dst_node_id=node_id, message_type=message_type,
                                      group_id=str(server_round))))
    replies = push_and_pull(grid, [m for _, m in messages], timeout, poll)
    sorted_out = sort_replies(messages, replies, phase, server_round, f"no reply within {timeout:.0f}s")
    sorted_out.bytes_sent = result.bytes_sent
    if _OBSERVERS:
        record = ExchangeRecord(phase, message_type, server_round, len(sends), len(sorted_out.replies),
                                sorted_out.bytes_sent, sorted_out.bytes_received, t0, time.time() - t0)
        for observer in list(_OBSERVERS):
            observer(record)
    return sorted_out


def sort_replies(sent: Sequence[tuple[int, Message]], replies: Iterable[Message], phase: str, server_round: int,
                 missing: str) -> ExchangeResult:
    """The replies to the messages ``sent`` (client id, message) by client id, and the failures: an error reply
    ("error", or "node-lost" when the SuperLink answers for a dead node), no reply (``missing`` is the reason
    given: "timeout"); a reply from a node nobody was sent to is ignored. The one classification of replies,
    shared by :func:`exchange` and the Flower ``Strategy.start()`` face (strategies/flower_api.py), whose
    replies Flower collected."""
    result = ExchangeResult()
    node_to_cid = {m.metadata.dst_node_id: cid for cid, m in sent}
    msgid_to_cid = {m.metadata.message_id: cid for cid, m in sent if m.metadata.message_id}
    answered: set[int] = set()
    for reply in replies:
        cid = msgid_to_cid.get(reply.metadata.reply_to_message_id)
        if cid is None:
            cid = node_to_cid.get(reply.metadata.src_node_id)
        if cid is None:
            log.warning("round %s %s: reply from unknown node %s ignored", server_round, phase,
                        reply.metadata.src_node_id)
            continue
        answered.add(cid)
        if reply.has_error():
            err = reply.error
            kind = "node-lost" if reply.metadata.src_node_id == 1 or err.code == 5 else "error"
            result.failures.append(Failure(cid, phase, kind, f"code {err.code}: {err.reason}"))
            log.warning("round %s %s: client %s failed (%s): %s", server_round, phase, cid, kind, err.reason)
            continue
        result.bytes_received += record_dict_nbytes(reply.content)
        result.replies[cid] = reply
    for cid, _ in sent:
        if cid not in answered:
            result.failures.append(Failure(cid, phase, "timeout", missing))
            log.warning("round %s %s: client %s: %s", server_round, phase, cid, missing)
    # replies arrive in whatever order the clients finish: order them by client id so that everything
    # computed from them (sums of floats included) is the same for the same seed
    result.replies = dict(sorted(result.replies.items()))
    result.failures.sort(key=lambda f: f.cid)
    return result
