"""A small offline learning job for the comparison baselines (issue 41): digits, Dirichlet(0.1) over 8 clients,
in-process through the real round driver and ClientApp (tests/fakegrid.py). Returns the per-round records."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

from flcore.config import RunConfig, resolve_run_config

NODES = 8
JOB: dict[str, Any] = {"dataset": "digits", "partition": "dirichlet", "dirichlet-alpha": 0.1, "seed": 1,
                       "num-server-rounds": 12, "batch-size": 32, "lr": 0.05, "momentum": 0.9,
                       "local-epochs": 1, "model": "mlp", "fraction-train": 1.0, "federated-eval-every": 0,
                       "checkpoint": False, "local-test-fraction": 0.0}


def run_digits(out_dir: Path, **overrides: Any) -> list[dict[str, Any]]:
    """The job's rounds (``global_accuracy`` on the central test set) with ``overrides`` (run-config keys)."""
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    values = resolve_run_config({**JOB, **overrides})
    values["out-dir"] = str(out_dir)
    doc = run_federation(FakeGrid(NODES), RunConfig.from_dict(values))
    return doc["rounds"]


def best_accuracy(rounds: list[dict[str, Any]]) -> float:
    """The best global accuracy over the rounds (the seed papers report the max over rounds)."""
    return max(float(r["global_accuracy"]) for r in rounds)


@functools.lru_cache(maxsize=None)
def fedavg_best_accuracy() -> float:
    """FedAvg's best accuracy on the job, run once per test process and shared by the tests that compare a method
    with it (the run is deterministic: each test gets the number its own FedAvg run would give)."""
    with tempfile.TemporaryDirectory() as tmp:
        return best_accuracy(run_digits(Path(tmp), method="fedavg"))
