"""The small offline learning job of issue 41's baselines (helper F): digits, 10 clients, Dirichlet(0.1), 15 rounds
of one local epoch, batch 16, lr 0.05 without momentum or weight decay, a 25 % local test split for P-FL."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

JOB: dict[str, Any] = {"dataset": "digits", "partition": "dirichlet", "dirichlet-alpha": 0.1, "seed": 0,
                       "num-server-rounds": 15, "local-epochs": 1, "batch-size": 16, "lr": 0.05, "momentum": 0.0,
                       "weight-decay": 0.0, "model": "mlp", "local-test-fraction": 0.25, "federated-eval-every": 1,
                       "checkpoint": False, "fraction-train": 1.0}


def run(tmp_path: Path, method: str, **extra: Any) -> dict:
    from experiments.simulate import simulate
    name = "-".join([method, *(f"{k}={v}" for k, v in extra.items())])
    return simulate({**JOB, "method": method, **extra, "out-dir": str(tmp_path / name)}, num_supernodes=10)


@functools.lru_cache(maxsize=None)
def _fedavg_json() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return json.dumps(run(Path(tmp), "fedavg"))


def fedavg_doc() -> dict:
    """FedAvg's run of the job (``run(tmp_path, "fedavg")``), run once per test process and shared by the tests
    that compare a method with it (the run is deterministic: each test gets the numbers its own run would give);
    a fresh copy on every call."""
    return json.loads(_fedavg_json())


def final(doc: dict, key: str) -> float:
    """The mean of the last three rounds' ``key`` (less noisy than the last round alone)."""
    values = [r[key] for r in doc["rounds"][-3:]]
    return sum(values) / len(values)
