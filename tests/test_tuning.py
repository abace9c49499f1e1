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
max-extend = 0
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
        assert entry["budget"] == len(entry["trials"]) >= 4 and entry["effective-budget"] >= 4
        for trial in entry["trials"]:  # each trial: a validation split, no test evaluation at all
            name = "-".join(f"{k}={v}" for k, v in trial["values"].items())
            doc = json.loads((root / "tuning" / label / name / "results.json").read_text())
            assert doc["run_config"]["validation-fraction"] == 0.2 and doc["run_config"]["seed"] == 100
            assert doc["run_config"]["test-evaluation"] is False
            assert all(r["global_accuracy"] is None and r["val_accuracy"] is not None for r in doc["rounds"])
            assert trial["val_score"] == pytest.approx(score(doc, 2))
            split = json.loads((root / "tuning" / label / name / run_mod.SPLIT_FILE).read_text())
            assert split["num_partitions"] == 3 and len(split["digest"]) == 16  # the trial's client split
        best = max(entry["trials"], key=lambda t: t["val_score"])
        assert entry["chosen"] == best["values"] and knob in entry["chosen"]
    assert summary["runs"]["fedavg"]["effective-budget"] == summary["runs"]["fedprox"]["effective-budget"]
    assert run_mod.main([str(cfg)]) == 0
    for label in ("fedavg", "fedprox"):
        rc = json.loads((root / label / "seed0" / "results.json").read_text())["run_config"]
        chosen = summary["runs"][label]["chosen"]
        assert all(rc[k] == v for k, v in chosen.items())
        assert rc["validation-fraction"] == 0.0 and rc["test-evaluation"] is True and rc["seed"] == 0
    from data_partitioning.federated import data_seed

    marker = json.loads((root / run_mod.SPLIT_MARKER).read_text())
    assert marker["data-seed"] == {"digits": data_seed("digits")}  # the report tells fixed-split experiments apart


# --- issue 31: grids grow past an edge a choice sits on; inert knobs do not count toward an equal budget ---

from experiments.tuning import (effective_budget, extend_grid, extend_knob, growable, inert_knobs,  # noqa: E402
                                makeup_lrs, on_edge)


def test_grid_grows_past_the_chosen_edge_by_its_own_step_and_is_bounded():
    ext: dict[str, int] = {}
    assert extend_grid((0.01, 0.03, 0.1), [0.1, 0.03], ext, 2) == (0.01, 0.03, 0.1, 0.333) and ext == {"high": 1}
    assert extend_grid((0.01, 0.03, 0.1, 0.333), [0.333], ext, 2) == (0.01, 0.03, 0.1, 0.333, 1.11)
    assert extend_grid((0.01, 0.03, 0.1, 0.333, 1.11), [1.11], ext, 2) is None and ext == {"high": 2}  # bound
    low: dict[str, int] = {}
    assert extend_grid((0.003, 0.01, 0.03), [0.003, 0.03], low, 1) == (0.0009, 0.003, 0.01, 0.03, 0.09)
    assert low == {"low": 1, "high": 1}
    assert extend_grid((0.01, 0.03, 0.1), [0.03], {}, 2) is None            # an inner choice: nothing grows
    assert extend_grid((0.01, 0.03, 0.1), [0.1], {}, 0) is None             # max-extend 0: a fixed grid
    assert on_edge((0.01, 0.03, 0.1), 0.1) and on_edge((0.01, 0.03), 0.01) and not on_edge((0.01, 0.03, 0.1), 0.03)


def test_a_knob_grid_grows_past_the_chosen_edge_by_its_own_step_and_is_bounded():
    ext: dict[str, int] = {}
    assert extend_knob("fedprox.mu", (0.01, 0.1), 0.01, ext, 2) == (0.001, 0.01, 0.1) and ext == {"low": 1}
    assert extend_knob("fedprox.mu", (0.001, 0.01, 0.1), 0.1, ext, 2) == (0.001, 0.01, 0.1, 1.0)
    assert extend_knob("fedprox.mu", (0.001, 0.01, 0.1), 0.001, {"low": 2}, 2) is None   # max-extend reached
    assert extend_knob("fedprox.mu", (0.001, 0.01, 0.1), 0.01, {}, 2) is None            # an inner choice
    assert extend_knob("weight-decay", (0.0, 5e-4), 0.0, {}, 2) is None                  # 0: the knob's bound
    assert extend_knob("weight-decay", (0.0, 5e-4), 5e-4, {}, 2) == (0.0, 5e-4, 0.00158)  # from 0: x sqrt(10)
    assert extend_knob("fedrane.gne-scale", ("normalized", "fedavg-norm"), "normalized", {}, 2) is None
    assert extend_knob("local-epochs", (1, 2), 2, {}, 2) is None                         # integers: no step
    assert not growable((0.1,)) and not growable((0.1, 0.1)) and growable((0.0, 5e-4))
    # a grid listed in decreasing order: its smallest value is its low edge; the grown grid is increasing
    assert extend_knob("fedbc.eta-lambda", (1e-3, 5e-4), 5e-4, {}, 2) == (0.00025, 5e-4, 1e-3)
    assert extend_knob("fedbc.eta-lambda", (1e-3, 5e-4), 1e-3, {}, 2) == (5e-4, 1e-3, 0.002)


def test_inert_knob_is_one_within_tolerance_at_every_other_value():
    trials = [({"lr": 0.01, "wd": 0.0}, 0.820), ({"lr": 0.01, "wd": 5e-4}, 0.823),
              ({"lr": 0.03, "wd": 0.0}, 0.860), ({"lr": 0.03, "wd": 5e-4}, 0.860)]
    assert inert_knobs(trials, ["wd"], 0.005) == ["wd"]
    assert effective_budget(trials, ["wd"]) == 2 and effective_budget(trials, []) == 4
    assert inert_knobs(trials, ["wd"], 0.0) == []                       # tolerance 0: identical scores only
    assert inert_knobs(trials[:2] + [({"lr": 0.03, "wd": 0.0}, 0.86), ({"lr": 0.03, "wd": 5e-4}, 0.87)],
                       ["wd"], 0.005) == []                             # one lr where it matters is enough
    assert inert_knobs(trials[:3] + [({"lr": 0.03, "wd": 5e-4}, float("nan"))], ["wd"], 0.005) == []  # diverged
    assert inert_knobs([({"lr": 0.01, "wd": 0.0}, 0.8)], ["wd"], 0.005) == []  # never compared: not inert


def test_makeup_fills_wide_gaps_near_the_choice_first():
    assert makeup_lrs([0.01, 0.03, 0.1], 0.03, 3) == [0.0548, 0.0173, 0.0405]
    assert makeup_lrs([0.01, 0.03, 0.1], 0.1, 2) == [0.0548, 0.074]
    assert makeup_lrs([0.01], 0.01, 2) == []                            # no pair to split


def test_plan_refuses_bad_growth_settings_and_unsorted_grids():
    for table, msg in (({"lr": [0.1, 0.01]}, "increasing"), ({"lr": [0.1, 0.1]}, "increasing"),
                       ({"lr": [0.1], "max-extend": -1}, "max-extend"), ({"lr": [0.1], "max-extend": 1.5}, "max-extend"),
                       ({"lr": [0.1], "inert-tolerance": 0.5}, "inert-tolerance")):
        with pytest.raises(ConfigError, match=msg):
            parse_plan(table, ["a"], "cfg")
    plan = parse_plan({"lr": [0.01, 0.1], "max-extend": 1, "inert-tolerance": 0.0}, ["a"], "cfg")
    assert (plan.max_extend, plan.inert_tolerance) == (1, 0.0)


def _fake_simulate(score_of):
    """A stand-in for experiments.simulate.simulate: writes a finished results.json whose validation accuracy is
    ``score_of(run config values)`` in every round (the tuning loop reads nothing else)."""
    calls = []

    def simulate(values, num_supernodes, **_):
        from pathlib import Path

        calls.append(dict(values))
        out = Path(values["out-dir"])
        out.mkdir(parents=True, exist_ok=True)
        rounds = [{"val_accuracy": score_of(values), "global_accuracy": None}] * int(values["num-server-rounds"])
        doc = {"run_config": values, "rounds": rounds, "final": {}}
        (out / "results.json").write_text(json.dumps(doc))
        return doc
    return simulate, calls


def test_tuning_grows_the_grid_and_makes_up_an_inert_knobs_budget(tmp_path, monkeypatch):
    import experiments.simulate as sim_mod

    # fedavg: the score rises with lr (its choice sits on the top edge) and ignores weight decay; fedprox peaks at
    # lr 0.1 and its mu matters
    def score_of(v):
        if v["method"] == "fedavg":
            return 0.5 + 0.1 * math.log10(v["lr"] / 0.01)
        return 0.8 - 0.05 * abs(math.log10(v["lr"] / 0.1)) - (0.02 if v["fedprox.mu"] == 1.0 else 0.0)
    fake, calls = _fake_simulate(score_of)
    monkeypatch.setattr(sim_mod, "simulate", fake)
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(CONFIG.replace("max-extend = 0", "max-extend = 2").replace("lr = [0.01, 0.3]", "lr = [0.01, 0.03, 0.1]"))
    monkeypatch.setattr(tune_mod, "RESULTS_ROOT", tmp_path / "results")
    assert tune_mod.main([str(cfg)]) == 0
    summary = json.loads((tmp_path / "results" / "tiny-tuning" / "tuning.json").read_text())
    assert summary["lr-grid-initial"] == [0.01, 0.03, 0.1]
    assert summary["lr-grid"] == [0.01, 0.03, 0.1, 0.333, 1.11] and summary["lr-grid-extended"] == {"low": 0, "high": 2}
    avg, prox = summary["runs"]["fedavg"], summary["runs"]["fedprox"]
    assert avg["chosen"]["lr"] == 1.11 and avg["on-edge"] is True          # the bound reached: said so
    assert avg["inert-knobs"] == ["weight-decay"] and prox["inert-knobs"] == []
    # fedprox's mu = 0.01 beat 1.0 at the low edge of its grid: the grid grew below by the edge's step (1e-4),
    # where the score is flat (a tie, and the first goes): no further growth on a plateau, the edge is reported
    assert prox["knob-grids-initial"] == {"fedprox.mu": [0.01, 1.0]}
    assert prox["knob-grids"] == {"fedprox.mu": [0.0001, 0.01, 1.0]} and prox["knob-on-edge"] == ["fedprox.mu"]
    assert prox["chosen"] == {"lr": 0.1, "fedprox.mu": 0.0001} and prox["on-edge"] is False
    # weight decay's low edge is 0, the knob's bound: not grown, not reported as an edge
    assert avg["knob-grids"] == {"weight-decay": [0.0, 5e-4]} and avg["knob-on-edge"] == []
    # fedprox: 5 lr x 3 mu = 15 effective; fedavg: 5 distinct lr + 10 make-up lr values (weight decay at 0.0)
    assert prox["effective-budget"] == 15 and avg["effective-budget"] == 15 and len(avg["makeup-lr"]) == 10
    assert all(t["values"]["weight-decay"] == 0.0 for t in avg["trials"][10:])
    assert avg["budget"] == 20 and prox["budget"] == 15
    n = len(calls)
    assert n == 35 and all(c["seed"] == 100 and c["test-evaluation"] is False for c in calls)
    assert tune_mod.main([str(cfg)]) == 0 and len(calls) == n               # resumed: nothing runs twice
    assert json.loads((tmp_path / "results" / "tiny-tuning" / "tuning.json").read_text())["runs"] == summary["runs"]


def test_a_knob_grows_only_while_its_score_rises_and_never_when_it_is_inert():
    plan = parse_plan({"lr": [0.01, 0.1], "knobs": {"a": {"fedprox.mu": [0.01, 0.1]}}}, ["a"], "cfg")

    def grown(scores):
        scored = {"a": [({"lr": lr, "fedprox.mu": mu}, s) for (lr, mu), s in scores.items()]}
        best = max(scored["a"], key=lambda t: t[1])
        out = tune_mod._grow_knobs(plan, {"a": best}, scored, {"a": {}}, "t")
        return None if out is None else out["a"]["fedprox.mu"]

    rising = {(0.01, 0.01): 0.70, (0.01, 0.1): 0.60, (0.1, 0.01): 0.80, (0.1, 0.1): 0.75}
    assert grown(rising) == (0.001, 0.01, 0.1)                                 # 0.80 > 0.75: grows below
    assert grown({**rising, (0.1, 0.1): 0.80}) is None                         # a tie at the choice's lr: plateau
    inert = {(0.01, 0.01): 0.700, (0.01, 0.1): 0.699, (0.1, 0.01): 0.801, (0.1, 0.1): 0.800}
    assert grown(inert) is None                                                # within inert-tolerance everywhere


def test_several_tuning_seeds_score_each_trial_by_its_mean_and_a_divergence_on_one_seed_disqualifies_it(
        tmp_path, monkeypatch):
    """With ``seeds = [100, 101]`` a trial runs on both federations and scores the mean of its validation
    accuracies; lr 0.3 wins on seed 100 alone (the single-seed choice) but diverges on seed 101, so the mean
    picks lr 0.01. The first seed's trials stay in the trial's folder (a single-seed tuning's trials are reused),
    the second seed's go to seed=101/ inside it, tuning.json records each seed's score, and a second invocation
    only retries the diverged trials."""
    import experiments.simulate as sim_mod
    from experiments.tuning import mean_score
    from strategies.client_registry import RoundFailed

    def score_of(v):
        if v["lr"] == 0.3 and v["seed"] == 101:
            raise RoundFailed("too few usable updates")
        base = {0.01: 0.60, 0.3: 0.90}[v["lr"]] + (0.01 if v["seed"] == 101 else 0.0)
        return base - (0.02 if v.get("weight-decay") or v.get("fedprox.mu") == 1.0 else 0.0)
    fake, calls = _fake_simulate(score_of)
    monkeypatch.setattr(sim_mod, "simulate", fake)
    monkeypatch.setattr(tune_mod, "RESULTS_ROOT", tmp_path / "results")
    root = tmp_path / "results" / "tiny-tuning"
    single = tmp_path / "single.toml"
    single.write_text(CONFIG)
    assert tune_mod.main([str(single)]) == 0
    one = json.loads((root / "tuning.json").read_text())
    assert one["runs"]["fedavg"]["chosen"] == {"lr": 0.3, "weight-decay": 0.0} and one["seeds"] == [100]
    assert "val_scores" not in one["runs"]["fedavg"]["trials"][0]
    n_single = len(calls)
    assert n_single == 8 and {c["seed"] for c in calls} == {100}

    multi = tmp_path / "multi.toml"
    multi.write_text(CONFIG.replace("seed = 100", "seeds = [100, 101]"))
    assert tune_mod.main([str(multi)]) == 0
    assert len(calls) == 2 * n_single and {c["seed"] for c in calls[n_single:]} == {101}  # seed 100's reused
    assert all(c["out-dir"].endswith("/seed=101") for c in calls[n_single:])
    summary = json.loads((root / "tuning.json").read_text())
    assert summary["seeds"] == [100, 101] and summary["seed"] == 100 and "2 tuning seeds" in summary["metric"]
    avg, prox = summary["runs"]["fedavg"], summary["runs"]["fedprox"]
    assert avg["chosen"] == {"lr": 0.01, "weight-decay": 0.0} and prox["chosen"] == {"lr": 0.01, "fedprox.mu": 0.01}
    assert avg["val_score"] == pytest.approx(0.605)
    by_values = {json.dumps(t["values"], sort_keys=True): t for t in avg["trials"]}
    best = by_values[json.dumps({"lr": 0.01, "weight-decay": 0.0}, sort_keys=True)]
    assert best["val_scores"] == {"100": pytest.approx(0.60), "101": pytest.approx(0.61)}
    lost = by_values[json.dumps({"lr": 0.3, "weight-decay": 0.0}, sort_keys=True)]
    assert lost["val_score"] is None and lost["val_scores"] == {"100": pytest.approx(0.90), "101": None}
    before = len(calls)
    assert tune_mod.main([str(multi)]) == 0     # resumed: only the diverged (unfinished) seed-101 trials run again
    assert [(c["lr"], c["seed"]) for c in calls[before:]] == [(0.3, 101)] * 4
    assert json.loads((root / "tuning.json").read_text())["runs"] == summary["runs"]
    assert math.isnan(mean_score([0.5, float("nan")])) and mean_score([0.5, 0.7]) == pytest.approx(0.6)
    assert mean_score([0.123456789]) == 0.123456789                         # one seed: its score unchanged


def test_tuning_seeds_are_checked_and_none_may_be_reported():
    assert parse_plan({"lr": [0.01], "seeds": [100, 7]}, ["a"], "cfg").seeds == (100, 7)
    assert parse_plan({"lr": [0.01]}, ["a"], "cfg").seeds == (100,)
    for bad, msg in (({"seed": 1, "seeds": [2]}, "both 'seed' and 'seeds'"), ({"seeds": []}, "non-empty list"),
                     ({"seeds": [1, 1]}, "repeat"), ({"seeds": [1.5]}, "integers")):
        with pytest.raises(ConfigError, match=msg):
            parse_plan({"lr": [0.01], **bad}, ["a"], "cfg")
    with pytest.raises(ConfigError, match="tuning seed 3 .* is also a reported seed"):
        run_mod.check_tuning_seed((100, 3), [0, 1, 2, 3], "[experiment] seeds")
