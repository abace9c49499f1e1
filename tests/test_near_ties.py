"""Near-tie verdicts (experiments/near_ties.py, issue 43 item 1): which tuning choices validation cannot tell
apart from the chosen one, and the verdict over every pair of them."""

from __future__ import annotations

import math

import pytest

from experiments.near_ties import (LOSS_ROUNDING, ONE_FEDERATION_MARGIN, Choice, choice_dir, compare_rounds,
                                   near_tie_choices, pair_summary, slug)


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


def _rounds(acc, loss, local=None):
    return [{"round": i + 1, "global_accuracy": a, "global_loss": lo,
             **({"local_accuracy": local[i]} if local is not None else {})} for i, (a, lo) in enumerate(zip(acc, loss))]


def test_a_re_run_is_identical_accuracy_identical_or_differs_by_its_figures():
    rec = _rounds([0.5, 0.6], [1.2, 1.1], local=[0.7, 0.8])
    same = compare_rounds(rec, _rounds([0.5, 0.6], [1.2, 1.1], local=[0.7, 0.8]))
    assert same["status"] == "identical" and same["max_abs_difference"] == 0.0
    # the evaluation summed in another order: the loss moves in its last bits, every accuracy is the same
    rounding = compare_rounds(rec, _rounds([0.5, 0.6], [1.2 + 1.6e-7, 1.1], local=[0.7, 0.8]))
    assert rounding["status"] == "accuracy identical"
    assert rounding["max_abs_difference_by_key"]["global_loss"] == pytest.approx(1.6e-7, rel=1e-3)
    assert rounding["max_abs_difference_by_key"]["global_accuracy"] == 0.0
    # a loss further off than rounding, a P-FL accuracy that moved, a round fewer, a figure one run lacks: differs
    far = _rounds([0.5, 0.6], [1.2 + 2 * LOSS_ROUNDING, 1.1], local=[0.7, 0.8])
    assert compare_rounds(rec, far)["status"] == "differs"
    moved = compare_rounds(rec, _rounds([0.5, 0.6], [1.2, 1.1], local=[0.7, 0.81]))
    assert moved["status"] == "differs" and moved["max_abs_difference_by_key"]["local_accuracy"] == pytest.approx(0.01)
    assert compare_rounds(rec, rec[:1])["status"] == "differs"
    lacks = compare_rounds(rec, _rounds([0.5, 0.6], [1.2, 1.1]))
    assert lacks["status"] == "differs" and lacks["measured_in_one_run_only"] == ["local_accuracy"]


def test_an_accuracy_identical_check_gets_no_caveat_a_differing_one_does(tmp_path):
    import json

    from experiments.claims import chosen_check_caveat

    check = tmp_path / "exp" / "near-ties" / "chosen_check.json"
    check.parent.mkdir(parents=True)
    rec = _rounds([0.5, 0.6], [1.2, 1.1])
    runs = {"fedavg": compare_rounds(rec, _rounds([0.5, 0.6], [1.2 + 1e-7, 1.1]))}
    check.write_text(json.dumps({"seed": 0, "stack": {"cpu_capability": "AVX512"}, "runs": runs}))
    assert chosen_check_caveat(tmp_path, "exp") == ""
    runs["fedbr"] = compare_rounds(rec, _rounds([0.5, 0.61], [1.2, 1.1]))
    check.write_text(json.dumps({"seed": 0, "stack": {"cpu_capability": "AVX512"}, "runs": runs}))
    assert "(fedbr;" in chosen_check_caveat(tmp_path, "exp")


def test_a_check_adds_its_runs_to_the_file_and_each_entry_names_where_it_was_checked(tmp_path, monkeypatch):
    import json

    import experiments.run
    import experiments.simulate
    from experiments.near_ties import check_chosen

    monkeypatch.setattr(experiments.run, "RESULTS_ROOT", tmp_path)
    rec = _rounds([0.5, 0.6], [1.2, 1.1])
    (tmp_path / "exp" / "fedavg" / "seed0").mkdir(parents=True)
    (tmp_path / "exp" / "fedavg" / "seed0" / "results.json").write_text(json.dumps({"rounds": rec}))
    path = tmp_path / "exp" / "near-ties" / "chosen_check.json"
    path.parent.mkdir(parents=True)
    earlier = {"git": {"commit": "c0ffee"}, "code": {"digest": "d1"}, "cpu_capability": "AVX2", "platform": "p"}
    path.write_text(json.dumps({"seed": 0, "stack": earlier, "runs": {"fedbr": {"status": "identical"}}}))
    seen = []

    def fake_simulate(cfg, num_supernodes):
        seen.append((cfg.to_dict()["lr"], num_supernodes))
        return {"rounds": _rounds([0.5, 0.6], [1.2, 1.1 + 5e-8])}

    monkeypatch.setattr(experiments.simulate, "simulate", fake_simulate)
    doc = {"experiment": {"name": "exp"}, "base": {"dataset": "digits"}, "runs": {"fedavg": {"method": "fedavg"},
                                                                            "fedprox": {"method": "fedprox"}}}
    tuning = {"runs": {"fedavg": {"chosen": {"lr": 0.03}}, "fedprox": {"chosen": {"lr": 0.1}}}}
    check_chosen(doc, tuning, 0, 4, ["fedavg", "fedprox"])
    out = json.loads(path.read_text())
    assert seen == [(0.03, 4)]                                              # fedprox has no reported run to re-run
    assert out["runs"]["fedavg"]["status"] == "accuracy identical"
    assert out["runs"]["fedprox"]["status"] == "no reported run"
    assert out["runs"]["fedbr"]["checked_on"] == {"commit": "c0ffee", "code": "d1", "cpu_capability": "AVX2",
                                                  "platform": "p", "cpu": None, "kernel_env": {}}  # kept, as it ran
    assert out["runs"]["fedavg"]["checked_on"]["code"] == out["stack"]["code"]["digest"]


@pytest.mark.parametrize("name", ["../chosen_check.json", "other.json", "chosen_check.txt"])
def test_a_check_file_that_is_not_a_chosen_check_name_is_refused_before_anything_runs(name, capsys):
    from experiments.near_ties import main

    with pytest.raises(SystemExit) as exc:
        main(["no-such-config.toml", "--check-chosen", "--check-file", name])
    assert exc.value.code == 2 and "--check-file must be a file name chosen_check[.<what>].json" in capsys.readouterr().err


def test_dry_run_with_check_chosen_runs_nothing(tmp_path, monkeypatch, capsys):
    """--dry-run printed the near-tie plan but ran the chosen check anyway (minutes of FMNIST training)."""
    import json

    import experiments.near_ties as near_ties
    import experiments.run
    import experiments.simulate

    monkeypatch.setattr(experiments.run, "RESULTS_ROOT", tmp_path)
    cfg = tmp_path / "exp.toml"
    cfg.write_text('[experiment]\nname = "exp"\ntitle = "t"\ndescription = "d"\nseeds = [0]\n[base]\n'
                   'dataset = "digits"\n[runs.fedavg]\nmethod = "fedavg"\n[tuning]\nseed = 100\nlr = [0.01]\n')
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "tuning.json").write_text(json.dumps({"runs": {"fedavg": {
        "chosen": {"lr": 0.01}, "val_score": 0.5, "trials": [{"values": {"lr": 0.01}, "val_score": 0.5}]}}}))

    def no_simulate(*_a, **_k):
        raise AssertionError("a dry run ran a federation")

    monkeypatch.setattr(experiments.simulate, "simulate", no_simulate)
    assert near_ties.main([str(cfg), "--check-chosen", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--check-chosen would re-run the chosen trial of fedavg at seed 0" in out
    assert not (tmp_path / "exp" / "near-ties" / "chosen_check.json").exists()
