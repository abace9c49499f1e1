"""Checkpoint and client-state files in a safe format: torch.load(weights_only=True) never runs code.

Values are encoded to what the restricted unpickler accepts (dicts, lists, tuples, str, int, float, bool,
None, torch tensors): a numpy array becomes ``{"__ndarray__": tensor}`` and a numpy scalar a Python scalar.
Each file carries ``format`` and ``version``; a file of another kind or version is refused by name.
Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

VERSION = 2


class SafeFileError(ValueError):
    """A file is missing, unreadable, of another kind or of another format version."""


def encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError("object arrays cannot be stored safely")
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj).copy())}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(encode(v) for v in obj)
    return obj


def decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__ndarray__"}:
            return obj["__ndarray__"].numpy()
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(decode(v) for v in obj)
    return obj


def save(path: Path, kind: str, payload: dict[str, Any]) -> None:
    """Write ``payload`` as a ``kind`` file (e.g. "checkpoint", "client-state") atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save({"format": kind, "version": VERSION, "payload": encode(payload)}, tmp)
    tmp.replace(path)


def load(path: Path, kind: str) -> dict[str, Any]:
    """Read a ``kind`` file written by :func:`save`; SafeFileError names the file and what is wrong."""
    path = Path(path)
    if not path.exists():
        raise SafeFileError(f"{path} does not exist")
    try:
        blob = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - name the file and why
        raise SafeFileError(f"{path} is not a safe {kind} file this version can read "
                            f"(written by an older version, or not ours): {str(exc).splitlines()[0]}") from exc
    if not isinstance(blob, dict) or blob.get("format") != kind:
        found = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
        raise SafeFileError(f"{path} is not a {kind} file (format: {found!r})")
    if blob.get("version") != VERSION:
        raise SafeFileError(f"{path} has {kind} format version {blob.get('version')}, this version reads {VERSION}")
    return decode(blob["payload"])
