"""Per-client state that survives rounds: ``context.state`` plus optional on-disk persistence.

``context.state`` (a RecordDict) lives in the SuperNode's memory, so it is lost when a node or a
simulation restarts. When a state directory is configured (run-config ``client-state-dir`` in simulation,
node-config ``state-dir`` in deployments), the state is also written to ``<dir>/client_<cid>.pt`` after
every round and read back when memory is empty: a resumed run then continues with the same SCAFFOLD
variates, MOON previous models, etc.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from flcore import safe_files
from flcore.records import params_to_record, record_to_params


class ClientState:
    def __init__(self, record_dict: RecordDict, cid: int, state_dir: str = "") -> None:
        self._rd = record_dict
        self.cid = cid
        self._path = Path(state_dir) / f"client_{cid}.pt" if state_dir else None
        if self._path is not None and len(self._rd) == 0 and self._path.exists():
            self._load()

    # --- arrays ------------------------------------------------------------------------------
    def get_arrays(self, key: str) -> dict[str, np.ndarray] | None:
        if key not in self._rd:
            return None
        return dict(record_to_params(self._rd[key]))

    def put_arrays(self, key: str, params: dict[str, np.ndarray]) -> None:
        self._rd[key] = params_to_record(params)

    # --- scalars -----------------------------------------------------------------------------
    def get_config(self, key: str) -> dict | None:
        return dict(self._rd[key]) if key in self._rd else None

    def put_config(self, key: str, values: dict) -> None:
        self._rd[key] = ConfigRecord(values)

    def keys(self) -> list[str]:
        return list(self._rd.keys())

    # --- persistence -------------------------------------------------------------------------
    def save(self) -> None:
        if self._path is None:
            return
        blob = {}
        for key, rec in self._rd.items():
            if isinstance(rec, ConfigRecord):
                blob[key] = ("config", dict(rec))
            else:
                blob[key] = ("arrays", dict(record_to_params(rec)))
        self._path.parent.mkdir(parents=True, exist_ok=True)
        safe_files.save(self._path, "client-state", blob)

    def _load(self) -> None:
        assert self._path is not None
        try:
            blob = safe_files.load(self._path, "client-state")
        except safe_files.SafeFileError as exc:
            raise RuntimeError(f"client {self.cid}: cannot read its client state: {exc}") from exc
        for key, (kind, value) in blob.items():
            if kind == "config":
                self.put_config(key, value)
            else:
                self.put_arrays(key, value)
