"""Near-tie verdicts (experiments/near_ties.py, issue 43 item 1): which tuning choices validation cannot tell
apart from the chosen one, and the verdict over every pair of them."""

from __future__ import annotations

import math

import pytest

from experiments.near_ties import (ONE_FEDERATION_MARGIN, Choice, choice_dir, near_tie_choices, pair_summary,
                                   slug)


def trial(lr: float, *scores: float, wd: float = 0.0) -> dict:
    return {"values": {"lr": lr, "weight-decay": wd}, "val_score": sum(scores) / len(scores),
            "val_scores": {str(100 + i): s for i, s in enumerate(scores)}}


def test_a_trial_is_a_near_tie_when_its_paired_deficit_is_within_one_standard_error():
    best = trial(0.1, 0.80, 0.90, 0.85)
    # deficits 0.02, -0.01, 0.02: mean 0.01, sd 0.01732, se 0.01 -> within (mean <= se)
    tie = trial(0.03, 0.78, 0.91, 0.83)
    # deficits 0.05, 0.05, 0.06: mean 0.0533, se 0.00333 -> not a tie (consistently worse)
    worse = trial(0.3, 0.75, 0.85, 0.79)
    got = near_tie_choices([best, tie, worse], best["values"])
    assert [c.values["lr"] for c in got] == [0.1, 0.03]
    assert got[0].chosen and not got[1].chosen
    assert got[1].deficit == pytest.approx(0.01) and got[1].se == pytest.approx(0.01)


def test_at_most_three_choices_per_arm_nearest_first_and_nan_trials_never_tie():
    best = trial(0.1, 0.80, 0.90, 0.85)
    # paired deficits (x + 0.05, x - 0.05, x): mean x, se 0.029, so all three tie; x orders them
    ties = [trial(lr, 0.80 - x - 0.05, 0.90 - x + 0.05, 0.85 - x) for lr, x in ((0.01, 0.003), (0.02, 0.001),
                                                                               (0.05, 0.002))]
    nan = trial(0.2, 0.80, math.nan, 0.85)
    got = near_tie_choices([best, *ties, nan], best["values"])
    assert [c.values["lr"] for c in got] == [0.1, 0.02, 0.05]   # the two nearest
    assert len(near_tie_choices([best, *ties], best["values"], max_choices=1)) == 1


def test_one_tuning_federation_falls_back_to_the_stated_margin():
    best = {"values": {"lr": 0.1}, "val_score": 0.90}
    inside = {"values": {"lr": 0.03}, "val_score": 0.90 - ONE_FEDERATION_MARGIN + 1e-9}
    outside = {"values": {"lr": 0.3}, "val_score": 0.90 - ONE_FEDERATION_MARGIN - 1e-3}
    got = near_tie_choices([best, inside, outside], {"lr": 0.1})
    assert [c.values["lr"] for c in got] == [0.1, 0.03] and got[1].se is None


def test_the_chosen_values_must_be_a_scored_trial():
    with pytest.raises(ValueError, match="not a scored trial"):
        near_tie_choices([trial(0.1, 0.8, 0.9)], {"lr": 0.5, "weight-decay": 0.0})


def test_the_headline_is_the_worst_pairs_word_and_agreement_is_robust():
    assert pair_summary(["reproduced"] * 4) == ("reproduced", "robust (4 of 4 pairs reproduced)")
    head, text = pair_summary(["reproduced", "smaller than claimed", "reproduced", "inconclusive"])
    assert head == "inconclusive"
    assert text == "inconclusive in 1, smaller than claimed in 1, reproduced in 2 of 4 pairs"
    assert pair_summary([]) == ("not run", "no pair run")


def test_the_chosen_choice_reads_the_reported_runs_and_the_others_their_own_folder(tmp_path):
    chosen = Choice({"lr": 0.1}, 0.0, None, True)
    other = Choice({"lr": 0.03, "fedetf.alpha": 0.5}, 0.001, 0.002, False)
    assert choice_dir(tmp_path, "exp", "fedetf", chosen) == tmp_path / "exp" / "fedetf"
    assert choice_dir(tmp_path, "exp", "fedetf", other) == tmp_path / "exp" / "near-ties" / "fedetf" / \
        "fedetf.alpha=0.5,lr=0.03"
    assert slug({"lr": 0.0548, "weight-decay": 0.0005, "fedrane.gne-scale": "fedavg-norm"}) == \
        "fedrane.gne-scale=fedavg-norm,lr=0.0548,weight-decay=0.0005"
