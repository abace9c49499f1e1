"""Checkpoint after every round; resume with run-config ``resume-from``.

A checkpoint holds the round, the global model, the strategy's full state (its ``state_dict()``: RNG,
per-client lambdas / control variates / memory vectors / accuracies ...), the result rows so far and the
run's client-state ledger (strategies/state_ledger.py: the run token the clients' state is bound to, the
attempts that made its history, after which round each client kept state), so that a resumed run's
clients load the state versions of the checkpoint's round (client_app/state.py).
Written atomically (temp file + rename), so a run killed mid-write leaves the previous checkpoint intact,
in a safe format (flcore/safe_files.py: loading never runs code) with a format version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flcore import safe_files

# Keys that may differ between the interrupted run and its continuation.
RESUMABLE_DIFFERENCES = {"num-server-rounds", "out-dir", "overwrite", "resume-from", "round-timeout", "round-retries",
                         "checkpoint", "device", "client-state-dir",
                         "engine", "engine-workers"}  # same numbers on every engine (tests/test_engine_equivalence.py)


class CheckpointError(ValueError):
    pass


def save_checkpoint(path: Path, *, server_round: int, params: dict, strategy_state: dict,
                    rounds: list[dict[str, Any]], run_config: dict[str, Any],
                    client_state: dict[str, Any] | None = None) -> None:
    """Write the checkpoint of ``server_round`` atomically; ``client_state``: ``StateLedger.to_dict()``."""
    safe_files.save(path, "checkpoint", {"round": server_round, "params": dict(params),
                                         "strategy": strategy_state, "rounds": rounds, "run_config": run_config,
                                         "client_state": client_state})


def load_checkpoint(resume_from: str, run_config: dict[str, Any]) -> dict[str, Any]:
    path = Path(resume_from)
    if path.is_dir():
        path = path / "checkpoint.pt"
    if not path.exists():
        raise CheckpointError(f"run-config 'resume-from': no checkpoint at {path}")
    try:
        ckpt = safe_files.load(path, "checkpoint")
    except safe_files.SafeFileError as exc:
        raise CheckpointError(f"run-config 'resume-from': {exc}") from exc
    missing = [k for k in ("round", "params", "strategy", "rounds", "run_config") if k not in ckpt]
    if missing:
        raise CheckpointError(f"run-config 'resume-from': checkpoint {path} lacks {', '.join(missing)}")
    old = ckpt["run_config"]
    diff = sorted(k for k in set(old) | set(run_config)
                  if k not in RESUMABLE_DIFFERENCES and old.get(k) != run_config.get(k))
    if diff:
        details = ", ".join(f"{k}: {old.get(k)!r} -> {run_config.get(k)!r}" for k in diff[:5])
        raise CheckpointError(f"checkpoint {path} was written with a different run config ({details}); "
                              "a resumed run must use the same settings")
    return ckpt
