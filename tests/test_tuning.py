"""The tuning protocol (experiments/tuning.py): equal budgets, selection on validation data only, the reported
runs use the choice on all training data."""

from __future__ import annotations

import json
import math

import pytest

import experiments.run as run_mod
import experiments.tune as tune_mod
from experiments.tuning import choose, parse_plan, score
from flcore.config import ConfigError

CONFIG = """
[experiment]
name = "tiny-tuning"
title = "t"
description = "d"
seeds = [0]
num-supernodes = 3
[base]
dataset = "digits"
model = "logistic"
num-server-rounds = 2
max-local-steps = 3
[runs.fedavg]
method = "fedavg"
[runs.fedprox]
method = "fedprox"
[tuning]
seed = 100
validation-fraction = 0.2
lr = [0.01, 0.3]
last-rounds = 2
[tuning.knobs.fedavg]
weight-decay = [0.0, 5e-4]
[tuning.knobs.fedprox]
"fedprox.mu" = [0.01, 1.0]
"""


def test_plan_gives_every_run_the_same_grid_and_refuses_unequal_budgets():
    plan = parse_plan({"lr": [0.01, 0.1], "knobs": {"a": {"weight-decay": [0.0, 1e-4]}, "b": {"fedprox": {"mu": [0.1, 1]}}}},
                      ["a", "b"], "cfg")
    assert plan.trials("a") == [{"lr": 0.01, "weight-decay": 0.0}, {"lr": 0.01, "weight-decay": 1e-4},
                                {"lr": 0.1, "weight-decay": 0.0}, {"lr": 0.1, "weight-decay": 1e-4}]
    assert [t["fedprox.mu"] for t in plan.trials("b")] == [0.1, 1.0, 0.1, 1.0]
    with pytest.raises(ConfigError, match="unequal tuning budgets"):
        parse_plan({"lr": [0.01], "knobs": {"a": {"weight-decay": [0.0, 1e-4]}}}, ["a", "b"], "cfg")
    with pytest.raises(ConfigError, match="may not tune 'lr'"):
        parse_plan({"lr": [0.01], "knobs": {"a": {"lr": [0.1]}}}, ["a"], "cfg")
    with pytest.raises(ConfigError, match=r"names no run"):
        parse_plan({"lr": [0.01], "knobs": {"zz": {"weight-decay": [0.0]}}}, ["a"], "cfg")
    with pytest.raises(ConfigError, match="fedprox.mu"):
        parse_plan({"lr": [0.01], "knobs": {"a": {"fedprox.mu": [-1.0]}}}, ["a"], "cfg")


def test_selection_uses_the_mean_validation_accuracy_ties_go_first_and_nan_loses():
    doc = {"rounds": [{"val_accuracy": 0.2}, {"val_accuracy": 0.5}, {"val_accuracy": 0.7}]}
    assert score(doc, 2) == pytest.approx(0.6)
    assert math.isnan(score({"rounds": [{"val_accuracy": None}]}, 1))
    assert choose([({"lr": 1}, float("nan")), ({"lr": 2}, 0.5), ({"lr": 3}, 0.5), ({"lr": 4}, 0.4)]) == ({"lr": 2}, 0.5)
    with pytest.raises(ConfigError, match="diverged"):
        choose([({"lr": 1}, float("nan"))])


def test_tune_then_run_end_to_end_never_looks_at_test_accuracy(tmp_path, monkeypatch):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(CONFIG)
    monkeypatch.setattr(run_mod, "RESULTS_ROOT", tmp_path / "results")
    monkeypatch.setattr(tune_mod, "RESULTS_ROOT", tmp_path / "results")
    with pytest.raises(ConfigError, match="run `python -m experiments.tune"):
        run_mod.main([str(cfg)])  # the reported runs need the tuning's choices first
    assert tune_mod.main([str(cfg)]) == 0
    root = tmp_path / "results" / "tiny-tuning"
    summary = json.loads((root / "tuning.json").read_text())
    for label, knob in (("fedavg", "weight-decay"), ("fedprox", "fedprox.mu")):
        entry = summary["runs"][label]
        assert entry["budget"] == 4 and len(entry["trials"]) == 4
        for trial in entry["trials"]:  # each trial: a validation split, no test evaluation at all
            name = "-".join(f"{k}={v}" for k, v in trial["values"].items())
            doc = json.loads((root / "tuning" / label / name / "results.json").read_text())
            assert doc["run_config"]["validation-fraction"] == 0.2 and doc["run_config"]["seed"] == 100
            assert doc["run_config"]["test-evaluation"] is False
            assert all(r["global_accuracy"] is None and r["val_accuracy"] is not None for r in doc["rounds"])
            assert trial["val_score"] == pytest.approx(score(doc, 2))
        best = max(entry["trials"], key=lambda t: t["val_score"])
        assert entry["chosen"] == best["values"] and knob in entry["chosen"]
    assert run_mod.main([str(cfg)]) == 0
    for label in ("fedavg", "fedprox"):
        rc = json.loads((root / label / "seed0" / "results.json").read_text())["run_config"]
        chosen = summary["runs"][label]["chosen"]
        assert all(rc[k] == v for k, v in chosen.items())
        assert rc["validation-fraction"] == 0.0 and rc["test-evaluation"] is True and rc["seed"] == 0
