"""Tuning a personalized method on P-FL validation data (issue 43 items 3 and 6): ``pfl-eval-split = 'validation'``
points a client's own evaluation at its validation split, every tuning trial runs with it (no local test sample is
evaluated while tuning), a run's ``[tuning] metric`` may be ``local_accuracy``, and a ledger claim may score P-FL."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import experiments.run as run_mod
import experiments.tune as tune_mod
from client_app.app import _cached_data
from data_partitioning.federated import client_arrays
from experiments.claims import final_by_seed, load_claims
from experiments.tuning import parse_plan, score
from flcore.config import ConfigError, RunConfig, resolve_run_config
from tests.test_tuning import CONFIG as TINY


def cfg(**values) -> RunConfig:
    return RunConfig.from_dict(resolve_run_config({"method": "fedavg", "dataset": "digits", **values}))


def test_validation_as_the_pfl_split_needs_one_and_reads_exactly_it():
    with pytest.raises(ConfigError, match="pfl-eval-split.*validation-fraction"):
        cfg(**{"pfl-eval-split": "validation"})
    with pytest.raises(ConfigError, match="pfl-eval-split"):
        cfg(**{"pfl-eval-split": "train"})
    split = {"local-test-fraction": 0.25, "validation-fraction": 0.2, "seed": 3}
    arr = client_arrays(cfg(**split), 1, 4)
    assert len(arr.x_val) and len(arr.x_test)
    on_val = _cached_data(1, 4, "", cfg(**split, **{"pfl-eval-split": "validation"}), torch.device("cpu"))
    on_test = _cached_data(1, 4, "", cfg(**split), torch.device("cpu"))
    assert np.array_equal(on_val.x_test.numpy(), arr.x_val) and np.array_equal(on_val.y_test.numpy(), arr.y_val)
    assert np.array_equal(on_test.x_test.numpy(), arr.x_test)
    assert np.array_equal(on_val.x_train.numpy(), on_test.x_train.numpy())  # the training data does not move


def test_a_run_may_be_scored_on_pfl_validation_and_the_metric_is_checked():
    plan = parse_plan({"lr": [0.01], "metric": {"b": "local_accuracy"}}, ["a", "b"], "cfg")
    assert plan.metric("a") == "val_accuracy" and plan.metric("b") == "local_accuracy"
    assert parse_plan({"lr": [0.01], "metric": "local_accuracy"}, ["a"], "cfg").metric("a") == "local_accuracy"
    with pytest.raises(ConfigError, match=r"\[tuning.metric\] names no run 'zz'"):
        parse_plan({"lr": [0.01], "metric": {"zz": "local_accuracy"}}, ["a"], "cfg")
    with pytest.raises(ConfigError, match="metric 'global_accuracy' of run 'a'"):
        parse_plan({"lr": [0.01], "metric": "global_accuracy"}, ["a"], "cfg")  # a test metric never selects
    doc = {"rounds": [{"val_accuracy": 0.9, "local_accuracy": 0.2}, {"val_accuracy": 0.7, "local_accuracy": 0.4}]}
    assert score(doc, 2) == pytest.approx(0.8) and score(doc, 2, "local_accuracy") == pytest.approx(0.3)
    assert math.isnan(score({"rounds": [{"val_accuracy": 0.5}]}, 1, "local_accuracy"))


# test_tuning's tiny experiment with Ditto in FedProx's place and no knobs: Ditto scored on P-FL validation data
CONFIG = (TINY.split("[tuning.knobs.fedavg]")[0].replace('name = "tiny-tuning"', 'name = "tiny-pfl-tuning"')
          .replace('[runs.fedprox]\nmethod = "fedprox"', '[runs.ditto]\nmethod = "ditto"')
          + '[tuning.metric]\nditto = "local_accuracy"\n')


def test_a_personalized_run_is_chosen_on_its_clients_validation_splits(tmp_path, monkeypatch):
    path = tmp_path / "tiny.toml"
    path.write_text(CONFIG)  # no local test split at all: a trial's P-FL figures can only be validation ones
    monkeypatch.setattr(run_mod, "RESULTS_ROOT", tmp_path / "results")
    monkeypatch.setattr(tune_mod, "RESULTS_ROOT", tmp_path / "results")
    assert tune_mod.main([str(path)]) == 0
    root = tmp_path / "results" / "tiny-pfl-tuning"
    summary = json.loads((root / "tuning.json").read_text())
    assert summary["runs"]["ditto"]["metric"] == "local_accuracy" and summary["runs"]["fedavg"]["metric"] == "val_accuracy"
    for label, metric in (("fedavg", "val_accuracy"), ("ditto", "local_accuracy")):
        entry = summary["runs"][label]
        for trial in entry["trials"]:
            name = "-".join(f"{k}={v}" for k, v in trial["values"].items())
            doc = json.loads((root / "tuning" / label / name / "results.json").read_text())
            assert doc["run_config"]["pfl-eval-split"] == "validation" and doc["run_config"]["local-test-fraction"] == 0
            assert all(r["local_accuracy"] is not None for r in doc["rounds"])
            assert trial["val_score"] == pytest.approx(score(doc, 2, metric))
        best = max(entry["trials"], key=lambda t: t["val_score"])
        assert entry["chosen"] == best["values"]
    ditto = summary["runs"]["ditto"]["trials"][0]
    doc = json.loads((root / "tuning" / "ditto" / "lr=0.01" / "results.json").read_text())
    assert ditto["val_score"] != pytest.approx(score(doc, 2))  # P-FL, not the global model's validation score


def test_a_claim_may_score_pfl_and_names_a_bad_metric(tmp_path):
    for seed, local in ((0, [0.5, 0.7]), (1, [0.6, 0.8])):
        run = tmp_path / "exp" / "a" / f"seed{seed}"
        run.mkdir(parents=True)
        rows = [{"global_accuracy": 0.1, "local_accuracy": v} for v in local]
        run.joinpath("results.json").write_text(json.dumps(
            {"run_config": {"num-server-rounds": 2}, "rounds": rows, "final": {"global_accuracy": 0.1,
                                                                                "local_accuracy": local[-1]}}))
    assert final_by_seed(tmp_path, "exp", "a", last=1, metric="local_accuracy") == pytest.approx({0: 70.0, 1: 80.0})
    assert final_by_seed(tmp_path, "exp", "a", last=2, metric="local_accuracy") == pytest.approx({0: 60.0, 1: 70.0})
    assert final_by_seed(tmp_path, "exp", "a", last=2) == pytest.approx({0: 10.0, 1: 10.0})
    claims = tmp_path / "claims.toml"
    row = ('[[claim]]\nid = "x"\npaper = "p"\nclaim = "c"\npaper-figure = "f"\nexperiment = "exp"\nbaseline = "a"\n'
           'method = "b"\n')
    claims.write_text(row + 'metric = "local_accuracy"\n')
    assert load_claims(claims)[0].metric == "local_accuracy"
    claims.write_text(row + 'metric = "val_accuracy"\n')
    with pytest.raises(ValueError, match="claim 'x': metric must be one of global_accuracy, local_accuracy"):
        load_claims(claims)
