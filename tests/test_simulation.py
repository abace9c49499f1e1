"""End to end through simulate() on the in-process engine (the default). On Flower's Simulation Engine (Ray): the
same result files and federated evaluation are checked on tests/test_engine_equivalence.py's Ray run (which must
also give the in-process engine's numbers), and `noniid-fl run --engine ray` runs to exit codes 0, 1 and 143 in
tests/test_reliability_ray.py (this file's own Ray run was one Ray start-up more for nothing else). `flwr run .
local` end to end (the README's path, on a SuperLink of its own that is stopped afterwards): tests/test_cli_runs.py,
test_run_local_sh_exit_codes_and_cleanup."""

import json
from pathlib import Path

import pytest

from experiments.simulate import simulate
from flcore.config import ConfigError


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
