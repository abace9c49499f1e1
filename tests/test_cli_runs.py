"""Exit codes and outputs of real runs (issue 18): `noniid-fl run` in a subprocess (in-process engine; on Ray:
tests/test_reliability_ray.py runs `noniid-fl run --engine ray` to exits 0, 1 and 143, and
tests/test_engine_equivalence.py checks a Ray run's outputs) and `scripts/run_local.sh`
(`flwr run <app> local` on its own SuperLink, stopped by pid). `flwr run` refusing a bad config in the ServerApp
before round 1 with the key in the streamed log: tests/test_deployment.py (the same ServerApp on the loopback
federation, without the Ray start/stop that a simulation run pays even after the refusal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.run_local_util import superlink_gone

ROOT = Path(__file__).resolve().parent.parent
JOB = "dataset='digits' num-server-rounds=2 batch-size=16 federated-eval-every=0"
FAIL = "max-update-norm=1e-9 round-retries=0"  # every client's update is rejected: round 1 fails
pytestmark = pytest.mark.slow


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
            "FLWR_HOME": str(tmp_path / "flwr"), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", "run", "--nodes", "3", *args], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=600)


def test_noniid_fl_run_outputs_and_exit_codes(tmp_path):
    first = cli(tmp_path, "-c", JOB)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    latest = tmp_path / "runs" / "latest"
    run_a = latest.resolve()
    assert latest.is_symlink() and run_a.name.startswith("fedavg-") and run_a.parent == tmp_path / "runs"
    doc = json.loads((run_a / "results.json").read_text())
    assert len(doc["rounds"]) == 2 and doc["run_config"]["engine"] == "inprocess"
    assert "[round 2/2]" in first.stdout and "ETA 0.0s" in first.stdout and "noniid-fl: run complete" in first.stdout
    assert "[round 2/2]" in (run_a / "run.log").read_text()

    again = cli(tmp_path, "-c", f"{JOB} out-dir='{run_a}'")  # another run into a finished run's directory
    assert again.returncode == 2 and "'out-dir'" in again.stderr and "--overwrite" in again.stderr
    mtime = (run_a / "results.json").stat().st_mtime
    over = cli(tmp_path, "--overwrite", "-c", f"{JOB} out-dir='{run_a}' lr=0.2")
    assert over.returncode == 0, over.stderr[-2000:]
    redo = json.loads((run_a / "results.json").read_text())
    assert redo["run_config"]["lr"] == 0.2 and (run_a / "results.json").stat().st_mtime > mtime

    failed = cli(tmp_path, "-c", f"{JOB} {FAIL}")
    assert failed.returncode == 1
    run_b = latest.resolve()
    assert run_b != run_a  # runs/latest follows the newest run
    tail = failed.stdout.strip().splitlines()[-2:]
    assert tail[0].startswith("noniid-fl: run failed") and "RoundFailed" in tail[0]
    assert tail[1] == f"traceback in {run_b / 'run.log'}" and "Traceback" not in failed.stdout + failed.stderr
    assert "Traceback" in (run_b / "run.log").read_text()


def run_local_sh(tmp_path: Path, overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "scripts" / "run_local.sh"), "3", overrides], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=600)


def test_run_local_sh_exit_codes_and_cleanup(tmp_path):
    bad = run_local_sh(tmp_path, "lr=inf")
    # refused by the config check, before any SuperLink starts (how fast is a benchmark's figure, not a test's)
    assert bad.returncode == 2 and "'lr' got inf" in bad.stderr and "SuperLink pid" not in bad.stdout
    ok = run_local_sh(tmp_path, f"{JOB} out-dir='{tmp_path / 'ok'}'")
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    doc = json.loads((tmp_path / "ok" / "results.json").read_text())  # `flwr run . local` end to end (README)
    assert len(doc["rounds"]) == 2 and doc["final"]["num_clients"] == 3 and doc["final"]["global_accuracy"] > 0.1
    assert superlink_gone(ok.stdout)  # its SuperLink (and children) stopped
    # A run that fails (exit 1, its SuperLink stopped too): tests/test_reliability_ray.py's run_local.sh run, whose
    # ServerApp stops at a dead Ray worker (a run of its own here cost ~20 s for the same exit path).
