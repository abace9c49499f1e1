"""End to end through simulate() on the in-process engine (the default) and through `noniid-fl run --engine ray`
(Flower's Simulation Engine). `flwr run . local` end to end (the README's path, on a SuperLink of its own that is
stopped afterwards): tests/test_cli_runs.py, test_run_local_sh_exit_codes_and_cleanup."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.simulate import simulate
from flcore.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _check_fedavg_run(doc: dict, out: Path) -> None:
    rounds = doc["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert doc["final"]["global_accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert rounds[-1]["global_loss"] < rounds[0]["global_loss"]
    assert all(r["num_updates"] == 4 and r["failures"] == [] for r in rounds)
    assert 0 <= rounds[-1]["local_accuracy_worst"] <= rounds[-1]["local_accuracy"] <= rounds[-1]["local_accuracy_best"] <= 1
    assert rounds[-1]["min_data_client_accuracy"] is not None and rounds[-1]["bytes_sent"] > 0
    for name in ("results.json", "metrics.csv", "accuracy.png", "final_model.pt", "checkpoint.pt"):
        assert (out / name).exists(), name
    assert json.loads((out / "results.json").read_text())["run_config"]["method"] == "fedavg"


FEDAVG = {"dataset": "digits", "num-server-rounds": 3, "lr": 0.1, "batch-size": 16, "dirichlet-alpha": 1.0,
          "local-test-fraction": 0.25, "federated-eval-every": 1}


def test_fedavg_learns_and_writes_results_on_the_default_inprocess_engine(tmp_path):
    out = tmp_path / "run"
    doc = simulate({**FEDAVG, "out-dir": str(out)}, num_supernodes=4)
    assert doc["run_config"]["engine"] == "inprocess" and doc["run_config"]["engine-workers"] == 1
    _check_fedavg_run(doc, out)
    with pytest.raises(ConfigError, match="gpus_per_client apply to engine 'ray' only"):
        simulate({**FEDAVG, "out-dir": str(out)}, num_supernodes=4, gpus_per_client=0.5)


@pytest.mark.slow
def test_fedavg_learns_and_writes_results_on_ray_through_the_command_line(tmp_path):
    """`noniid-fl run --engine ray` in a process of its own (also the suite's check of the command line's Ray
    path, which was a Ray run of its own in tests/test_cli_runs.py)."""
    from tests.test_cli_runs import _env

    out = tmp_path / "run"
    values = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in FEDAVG.items())
    proc = subprocess.run([sys.executable, "-m", "cli", "run", "--nodes", "4", "--engine", "ray", "-c",
                           f"{values} out-dir='{out}'"], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["run_config"]["engine"] == "ray"
    _check_fedavg_run(doc, out)
