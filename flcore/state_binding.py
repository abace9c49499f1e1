"""Which client state a train message continues from: the ``client-state`` record (docs/PROTOCOL.md).

Client state is bound to a *run*: ``run`` is a random token the ServerApp draws when a run starts fresh and
keeps in its checkpoint, so a resumed run finds the state of the run it continues, and a new run on the
same state directory never reads another run's state (Flower's run id cannot serve: a resumed run is a new
Flower run, and the in-process engine numbers every run 1).

Each start of the ServerApp (the first, then every resume) is an *attempt* with a token of its own; a
state version is written as (round, attempt). ``attempts`` / ``starts`` list the attempts that make up
the run's history: attempt i owns rounds ``starts[i]`` .. ``starts[i+1] - 1`` (the last one every round
from its start). A version written by an attempt for a round it does not own belongs to a stretch of
history that was thrown away (a run killed after its last checkpoint, then resumed from that checkpoint),
and is never loaded.

``checkpoint-round`` (the newest round with a checkpoint on the server's disk) tells a client which
version a future resume may need, so it keeps that one however many rounds later it trains.
``state-round`` is the round after which the server last saw this client keep non-empty state (its
``state-entries`` reply metric); a client whose memory is empty then must find a version at least that
new, or refuse (a resume without the client state, a node restarted without its state directory).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Mapping

from flwr.app import ConfigRecord

from flcore.protocol import CLIENT_STATE as RECORD, CLIENT_STATE_KEYS as KEYS
from flcore.protocol import STATE_ENTRIES as ENTRIES_METRIC  # noqa: F401 - re-exported for client_app and strategies

TOKEN = re.compile(r"^[0-9a-z][0-9a-z-]{0,63}$")  # tokens become directory and file names


_LAST: dict[type, tuple[tuple, "StateBinding"]] = {}  # the last record's values (kept alive) and its binding


def _same_objects(values: tuple, kept: tuple) -> bool:
    """The scalars, and the items of the two lists, are the very objects of ``kept`` (a copied record shares
    them; its lists are new)."""
    return (values[0] is kept[0] and values[3] is kept[3] and values[4] is kept[4]
            and len(values[1]) == len(kept[1]) and all(map(operator.is_, values[1], kept[1]))
            and len(values[2]) == len(kept[2]) and all(map(operator.is_, values[2], kept[2])))


class BindingError(ValueError):
    """A ``client-state`` record that is malformed (names the key)."""


@dataclass(frozen=True)
class StateBinding:
    run: str
    attempts: tuple[str, ...]
    starts: tuple[int, ...]
    checkpoint_round: int = 0
    state_round: int = 0

    def __post_init__(self) -> None:
        for name, token in [("run", self.run), *(("attempts", a) for a in self.attempts)]:
            if not isinstance(token, str) or not TOKEN.match(token):
                raise BindingError(f"'{RECORD}' record: '{name}' must be a token of [0-9a-z-], got {token!r}")
        if not self.attempts or len(self.attempts) != len(self.starts):
            raise BindingError(f"'{RECORD}' record: 'attempts' and 'starts' must be non-empty and of one length, "
                               f"got {len(self.attempts)} and {len(self.starts)}")
        if list(self.starts) != sorted(set(self.starts)):
            raise BindingError(f"'{RECORD}' record: 'starts' must increase, got {list(self.starts)}")
        if self.checkpoint_round < 0 or self.state_round < 0:
            raise BindingError(f"'{RECORD}' record: rounds must be >= 0")

    @property
    def attempt(self) -> str:
        """The attempt now running (the one that writes)."""
        return self.attempts[-1]

    def owns(self, server_round: int, attempt: str) -> bool:
        """True when ``attempt`` wrote round ``server_round`` of the run's kept history."""
        for i, (name, start) in enumerate(zip(self.attempts, self.starts)):
            if name == attempt:
                end = self.starts[i + 1] if i + 1 < len(self.starts) else None
                return (i == 0 or server_round >= start) and (end is None or server_round < end)
        return False

    def with_state_round(self, state_round: int) -> "StateBinding":
        return StateBinding(self.run, self.attempts, self.starts, self.checkpoint_round, state_round)

    def to_record(self) -> ConfigRecord:
        return ConfigRecord({"run": self.run, "attempts": list(self.attempts), "starts": list(self.starts),
                             "checkpoint-round": self.checkpoint_round, "state-round": self.state_round})

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "StateBinding":
        missing = [k for k in KEYS if k not in record]
        if missing:
            raise BindingError(f"'{RECORD}' record lacks {', '.join(missing)} (docs/PROTOCOL.md)")
        try:
            values = (record["run"], record["attempts"], record["starts"], record["checkpoint-round"],
                      record["state-round"])
            last = _LAST.get(cls)
            if last is not None and _same_objects(values, last[0]):
                return last[1]  # the very objects checked last time (every message of a round carries them)
            binding = cls(str(values[0]), tuple(str(a) for a in values[1]), tuple(int(s) for s in values[2]),
                          int(values[3]), int(values[4]))
            _LAST[cls] = ((values[0], list(values[1]), list(values[2]), values[3], values[4]), binding)
            return binding
        except (TypeError, ValueError) as exc:
            if isinstance(exc, BindingError):
                raise
            raise BindingError(f"'{RECORD}' record is malformed: {exc}") from exc

    @classmethod
    def flower_run(cls, run_id: int) -> "StateBinding":
        """The binding of a message without a ``client-state`` record (another Strategy drives the ClientApp):
        Flower's run, one attempt, nothing known about checkpoints or earlier state."""
        return cls(f"flower-{int(run_id)}", ("flower",), (0,))
