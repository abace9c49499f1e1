"""The server's side of run-bound client state: what each train message's ``client-state`` record says.

A part of the strategy: ``strategy.begin_run()`` makes the strategy's ledger (``strategy.ledger``) at the
start of a run: :meth:`StateLedger.fresh` draws a new run token; :meth:`StateLedger.resumed` continues the
run of a checkpoint with a new attempt whose history starts after the checkpoint's round
(flcore/state_binding.py). The strategy puts :meth:`record` in every train message and passes every train
reply's metrics to :meth:`note_reply`, which remembers after which round each client kept non-empty state
(its ``state-entries`` metric). The runner stores :meth:`to_dict` in each checkpoint and calls
:meth:`checkpoint_written` once the checkpoint is on disk.

A client that cannot find the state it kept before the checkpoint a run resumed from refuses to train
(client_app/state.py); :meth:`check_refusals` turns that into the end of the run
(:class:`ClientStateMissing`, naming each client and what is missing): resuming without the clients' state
would silently drop the history of every client that trained before. A client that lost state it kept in
this attempt (a node restarted without its state directory) is an ordinary failure of that client.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping

from flwr.app import ConfigRecord

from flcore.protocol import STATE_ENTRIES, STATE_MISSING
from flcore.registry import get_method
from flcore.state_binding import StateBinding
from strategies.client_registry import RoundFailed
from strategies.exchange import Failure


class ClientStateMissing(RoundFailed):
    """A resumed run whose clients cannot find the state they kept before its checkpoint."""


def _token(nbytes: int) -> str:
    return secrets.token_hex(nbytes)


@dataclass
class StateLedger:
    run: str
    attempts: list[str]
    starts: list[int]
    checkpoint_round: int = 0
    rounds: dict[int, int] = field(default_factory=dict)  # cid -> round after which it kept non-empty state
    _records: dict[tuple, ConfigRecord] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def fresh(cls) -> "StateLedger":
        return cls(_token(8), [_token(4)], [1])

    @classmethod
    def resumed(cls, saved: Mapping[str, Any] | None, after_round: int, method: str) -> "StateLedger":
        """The ledger of a run resumed from the checkpoint of round ``after_round`` that stored ``saved``.
        A checkpoint without one (written by ``save_checkpoint`` without ``client_state``) cannot say where
        its clients' state is: refused for a method that keeps client state, a new run token otherwise."""
        if saved is None:
            keys = get_method(method).payload.state
            if keys:
                raise ClientStateMissing(
                    f"the checkpoint of round {after_round} does not say which run its clients' state belongs to "
                    f"(no 'client_state'); {method} keeps client state ({', '.join(keys)}), which a run resumed "
                    "from it could not find")
            return cls(_token(8), [_token(4)], [after_round + 1], after_round)
        kept = [(str(a), int(s)) for a, s in zip(saved["attempts"], saved["starts"]) if int(s) <= after_round]
        return cls(str(saved["run"]), [a for a, _ in kept] + [_token(4)], [s for _, s in kept] + [after_round + 1],
                   after_round, {int(c): int(r) for c, r in saved["rounds"].items() if int(r) <= after_round})

    def binding(self, cid: int) -> StateBinding:
        return StateBinding(self.run, tuple(self.attempts), tuple(self.starts), self.checkpoint_round,
                            self.rounds.get(cid, 0))

    def record(self, cid: int) -> ConfigRecord:
        """The ``client-state`` record of ``cid``'s next train message. Built once per distinct binding and
        shared by the messages that carry it (records in outgoing messages are only read)."""
        key = (self.run, tuple(self.attempts), tuple(self.starts), self.checkpoint_round, self.rounds.get(cid, 0))
        memo = self._records
        hit = memo.get(key)
        if hit is None:
            if len(memo) >= 64:  # one entry per (checkpoint round, state round) pair in use: keep it small
                memo.clear()
            hit = memo[key] = self.binding(cid).to_record()
        return hit

    def note_reply(self, cid: int, server_round: int, metrics: Mapping[str, Any]) -> None:
        """A train reply of ``cid`` in ``server_round``: its state is now non-empty (or empty) as of that round."""
        entries = metrics.get(STATE_ENTRIES)
        if entries is None:  # a ClientApp that does not report it: nothing learned
            return
        if int(entries) > 0:
            self.rounds[cid] = server_round
        else:
            self.rounds.pop(cid, None)

    def check_refusals(self, failures: list[Failure]) -> None:
        """Raise :class:`ClientStateMissing` when a client refused to train for want of the state it kept
        before this attempt started (the resume's checkpoint round or earlier)."""
        resumed_after = self.starts[-1] - 1
        bad = [f for f in failures if STATE_MISSING in f.reason and 0 < self.rounds.get(f.cid, 0) <= resumed_after]
        if bad:
            raise ClientStateMissing(
                f"the run resumed after round {resumed_after} without its clients' state ({len(bad)} client(s) "
                "refused to train); " + "; ".join(f.reason for f in bad[:3]))

    def checkpoint_written(self, server_round: int) -> None:
        """The checkpoint of ``server_round`` is on disk: clients keep the state versions a resume from it needs."""
        self.checkpoint_round = server_round

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "attempts": list(self.attempts), "starts": list(self.starts),
                "rounds": {int(c): int(r) for c, r in sorted(self.rounds.items())}}
