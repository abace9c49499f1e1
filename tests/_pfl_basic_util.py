"""Helpers of the basic P-FL baselines' tests (tests/test_local.py, test_ditto.py, test_fedper.py,
test_fedbabu.py, test_fedrod.py): the known-output federation run in-process, and its parts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.known_outputs import COMMON, JobOutput, run_job


def job(tmp_path: Path, name: str, **extra: Any) -> tuple[JobOutput, dict]:
    """The known-output federation (4 clients on digits, COMMON) with ``extra`` keys: (its output, results.json)."""
    from flcore.config import resolve_run_config

    values = resolve_run_config({**COMMON, **extra})
    values.pop("out-dir")
    out = run_job(values, tmp_path / name)
    return out, json.loads((tmp_path / name / "results.json").read_text())


def params_digest(out: JobOutput) -> str:
    """The final parameters' part of a job digest (without the metrics')."""
    return out.digest.split(":")[0]


def column(doc: dict, key: str) -> list:
    """One metric per round from a results.json document."""
    return [row[key] for row in doc["rounds"]]
