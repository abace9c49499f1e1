"""``--workers N`` (experiments/parallel.py): tuning trials and reported runs in N processes give exactly the
numbers, files and choices of the same jobs run one after another in this process."""

from __future__ import annotations

import functools
import json

import pytest

import experiments.run as run_mod
import experiments.tune as tune_mod
from experiments.parallel import run_jobs
from experiments.run import run_one
from tests.test_tuning import CONFIG


def _numbers(path):
    """A run's per-round records and final figures, without the wall-clock fields."""
    doc = json.loads(path.read_text())
    return [{k: v for k, v in row.items() if "time" not in k} for row in [*doc["rounds"], doc["final"]]]


@pytest.mark.slow  # spawns worker processes (each imports torch): about a minute on 2 cores
def test_workers_give_the_numbers_and_choices_of_one_process(tmp_path, monkeypatch):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(CONFIG)
    roots = {}
    for workers in (1, 3):
        root = tmp_path / f"results-{workers}"
        monkeypatch.setattr(run_mod, "RESULTS_ROOT", root)
        monkeypatch.setattr(tune_mod, "RESULTS_ROOT", root)
        assert tune_mod.main([str(cfg), "--workers", str(workers)]) == 0
        assert run_mod.main([str(cfg), "--workers", str(workers)]) == 0
        roots[workers] = root / "tiny-tuning"
    one, many = roots[1], roots[3]
    a, b = (json.loads((r / "tuning.json").read_text()) for r in (one, many))
    assert a["runs"] == b["runs"]   # every trial's score, the choices, the budgets
    files = sorted(p.relative_to(one) for p in one.rglob("results.json"))
    assert len(files) == sum(len(e["trials"]) for e in a["runs"].values()) + 2   # trials + fedavg/fedprox seed 0
    for rel in files:
        assert _numbers(one / rel) == _numbers(many / rel), rel
        assert (one / rel).with_name("client_split.json").read_text() == (many / rel).with_name(
            "client_split.json").read_text()


@pytest.mark.slow  # spawns two worker processes
def test_a_failing_job_is_reported_and_the_others_finish(tmp_path):
    good = {"method": "fedavg", "dataset": "digits", "model": "logistic", "num-server-rounds": 1,
            "max-local-steps": 2, "out-dir": str(tmp_path / "good")}
    bad = {**good, "dataset": "no-such-dataset", "out-dir": str(tmp_path / "bad")}
    out = dict(run_jobs([("good", good), ("bad", bad)], functools.partial(run_one, num_partitions=3), workers=2))
    assert out["good"][0] == "ok" and len(out["good"][2]["rounds"]) == 1
    assert out["bad"][0] == "failed" and "no-such-dataset" in out["bad"][1]
    with pytest.raises(ValueError, match="workers must be >= 1"):
        list(run_jobs([("good", good)], functools.partial(run_one, num_partitions=3), workers=0))
