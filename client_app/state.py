"""Per-client state that survives rounds: ``context.state``, persisted per run and round when a directory is set.

``context.state`` (a RecordDict) lives in the node's memory for one Flower run: a resumed run (a new Flower
run) or a restarted node starts with it empty. With a state directory (run-config ``client-state-dir`` in
simulation, node-config ``state-dir`` on a SuperNode) every training of a client that keeps state writes a
*version* of it::

    <dir>/run-<run>/client-<cid>/r<round:06d>-<attempt>.pt

written atomically (flcore/safe_files.py), keyed by the run the server bound the state to and versioned by
round and by the server attempt that wrote it (flcore/state_binding.py). When the memory is empty the client
loads the newest version of the run's kept history; versions of a stretch of history the server threw away
(written after its last checkpoint by a run that was then killed) are never loaded and are deleted. A client
keeps the two newest versions and, however old, the newest one at or before the server's last checkpoint,
the one a resume from that checkpoint loads.

A client whose memory is empty while the server saw it keep state (``state-round`` > 0) and that finds no
version at least that new refuses to train (:class:`ClientStateError`, an error reply naming what is
missing): a stateful method resumed without its client state, or on another state directory, never silently
restarts its state from zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from flcore import safe_files
from flcore.protocol import STATE_MISSING
from flcore.records import params_to_record, record_to_params
from flcore.state_binding import StateBinding

VERSION_NAME = re.compile(r"^r(\d{6,})-([0-9a-z][0-9a-z-]*)\.pt$")
KIND = "client-state"


class ClientStateError(RuntimeError):
    """This client's state is missing or unreadable: it refuses to train rather than restart from zero."""


@dataclass(frozen=True, order=True)
class Version:
    round: int
    attempt: str
    path: Path

    @classmethod
    def parse(cls, path: Path) -> "Version | None":
        m = VERSION_NAME.match(path.name)
        return cls(int(m.group(1)), m.group(2), path) if m else None


class ClientState:
    """Typed access to ``context.state`` and its on-disk versions (see the module docstring).

    ``binding`` (required with ``state_dir``): which run the state belongs to and which versions are valid;
    ``server_round``: the round being trained (versions of later rounds are not loaded); ``what``: how the
    state is named in a refusal (e.g. "scaffold client state (scaffold-c-i)").
    """

    def __init__(self, record_dict: RecordDict, cid: int, state_dir: str = "", binding: StateBinding | None = None,
                 server_round: int = 0, what: str = "client state") -> None:
        self._rd = record_dict
        self.cid = cid
        self.binding = binding
        self.what = what
        self.server_round = server_round
        if state_dir and binding is None:
            raise ValueError("ClientState: a state directory needs the run's StateBinding")
        self.dir = Path(state_dir) / f"run-{binding.run}" / f"client-{cid}" if state_dir and binding else None
        self.loaded: Version | None = None
        if binding is not None and len(self._rd) == 0:
            self._restore()

    def _bound(self) -> StateBinding:
        """The run's StateBinding, which every state kept on disk has (__init__ refuses a directory without)."""
        if self.binding is None:
            raise ClientStateError(f"client {self.cid}: its {self.what} has no StateBinding")
        return self.binding

    # --- arrays ------------------------------------------------------------------------------
    def get_arrays(self, key: str) -> dict[str, np.ndarray] | None:
        if key not in self._rd:
            return None
        rec = self._rd[key]
        if not isinstance(rec, ArrayRecord):
            raise ClientStateError(f"client {self.cid}: state entry {key!r} holds a {type(rec).__name__}, "
                                   "not arrays")
        return dict(record_to_params(rec))

    def put_arrays(self, key: str, params: dict[str, np.ndarray]) -> None:
        self._rd[key] = params_to_record(params)

    # --- scalars -----------------------------------------------------------------------------
    def get_config(self, key: str) -> dict | None:
        return dict(self._rd[key]) if key in self._rd else None

    def put_config(self, key: str, values: dict) -> None:
        self._rd[key] = ConfigRecord(values)

    def keys(self) -> list[str]:
        return list(self._rd.keys())

    # --- versions on disk --------------------------------------------------------------------
    def versions(self) -> tuple[list[Version], list[Version]]:
        """(valid versions, oldest first; versions of thrown-away history) in this client's directory."""
        valid: list[Version] = []
        dead: list[Version] = []
        if self.dir is None or not self.dir.is_dir():
            return valid, dead
        for path in self.dir.iterdir():
            v = Version.parse(path)
            if v is not None:
                (valid if self._bound().owns(v.round, v.attempt) else dead).append(v)
        return sorted(valid), sorted(dead)

    def _restore(self) -> None:
        """Memory is empty: load the newest valid version (at most this round), or refuse when the server
        saw this client keep state that cannot be found."""
        b = self._bound()
        valid = [v for v in self.versions()[0] if not self.server_round or v.round <= self.server_round]
        newest = valid[-1] if valid else None
        need = b.state_round
        if need and (newest is None or newest.round < need):
            where = (f"its state directory {self.dir} holds " + (
                "no version of it for this run" if newest is None else
                f"only versions of rounds {', '.join(str(v.round) for v in valid)}")) if self.dir else (
                "this node keeps no client state on disk (set run-config 'client-state-dir' in simulation, "
                "node-config 'state-dir' on a SuperNode, to where the run kept it)")
            raise ClientStateError(
                f"{STATE_MISSING}: client {self.cid}: run {b.run} continues from this client's {self.what} as of round {need}, "
                f"but its memory holds none (a resumed run, or a restarted node) and {where}; refusing to "
                "restart that state from zero")
        if newest is not None:
            self._load(newest)

    def _load(self, version: Version) -> None:
        try:
            blob = safe_files.load(version.path, KIND)
        except safe_files.SafeFileError as exc:
            raise ClientStateError(f"client {self.cid}: cannot read its {self.what}: {exc}") from exc
        expect = {"run": self._bound().run, "cid": self.cid, "round": version.round, "attempt": version.attempt}
        got = {k: blob.get(k) for k in expect}
        if got != expect:
            raise ClientStateError(f"client {self.cid}: {version.path} is not this client's state of that round "
                                   f"(it says {got}, expected {expect})")
        for key, (kind, value) in blob["entries"].items():
            if kind == "config":
                self.put_config(key, value)
            else:
                self.put_arrays(key, value)
        self.loaded = version

    def save(self, server_round: int) -> Version | None:
        """Write the state after round ``server_round`` (when there is a directory and state, or versions
        already: an emptied state is a version too), then drop the versions no resume can need."""
        if self.dir is None or (len(self._rd) == 0 and not self.dir.is_dir()):
            return None
        entries: dict[str, tuple[str, dict]] = {}
        for key, rec in self._rd.items():
            if isinstance(rec, ConfigRecord):
                entries[key] = ("config", dict(rec))
            elif isinstance(rec, ArrayRecord):
                entries[key] = ("arrays", dict(record_to_params(rec)))
            else:
                raise ClientStateError(f"client {self.cid}: state entry {key!r} holds a {type(rec).__name__} "
                                       "(only configs and arrays are kept)")
        self.dir.mkdir(parents=True, exist_ok=True)
        b = self._bound()
        path = self.dir / f"r{server_round:06d}-{b.attempt}.pt"
        safe_files.save(path, KIND, {"run": b.run, "cid": self.cid, "round": server_round, "attempt": b.attempt,
                                     "entries": entries})
        self.prune()
        return Version(server_round, b.attempt, path)

    def prune(self) -> list[Path]:
        """Keep the two newest valid versions and the newest one at or before the server's last checkpoint
        (the one a resume from it loads; a later checkpoint is of a later round than any version but the
        newest); delete the rest, versions of thrown-away history and left-over temporary files. Returns what
        went."""
        if self.dir is None:
            return []
        valid, dead = self.versions()
        keep = set(valid[-2:])
        checkpoint_round = self._bound().checkpoint_round
        at_checkpoint = [v for v in valid if v.round <= checkpoint_round]
        if checkpoint_round and at_checkpoint:
            keep.add(at_checkpoint[-1])
        gone = [v.path for v in valid + dead if v not in keep]
        gone += [p for p in self.dir.iterdir() if ".pt.tmp" in p.name]
        for path in gone:
            path.unlink(missing_ok=True)
        return gone
