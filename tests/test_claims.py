"""The claims ledger (experiments/claims.py): paired gains, verdicts, and the committed ledger's sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.claims import CLAIMS, Claim, Measured, ledger, load_claims, measure, verdict
from experiments.stats import paired_gain
from flcore.config import PROJECT_ROOT


def _write(root: Path, exp: str, label: str, accs: dict[int, float], rounds: int = 2) -> None:
    for seed, acc in accs.items():
        d = root / exp / label / f"seed{seed}"
        d.mkdir(parents=True)
        doc = {"run_config": {"num-server-rounds": rounds}, "rounds": [{}] * rounds, "final": {"global_accuracy": acc}}
        (d / "results.json").write_text(json.dumps(doc))


def test_gain_is_paired_by_seed_and_needs_five_seeds_unless_declared(tmp_path):
    c = Claim("x", "P", "c", "fig", 4.0, "e", "base", "meth")
    _write(tmp_path, "e", "base", {0: 0.80, 1: 0.70, 2: 0.90, 3: 0.5, 4: 0.6, 5: 0.1})
    _write(tmp_path, "e", "meth", {0: 0.82, 1: 0.73, 2: 0.91, 3: 0.54, 4: 0.60})  # seed 5 unpaired: left out
    m = measure(tmp_path, c)
    assert m.seeds == 5
    # differences 2, 3, 1, 4, 0 pp: mean 2, sample sd sqrt(2.5)
    assert m.gain.mean == pytest.approx(2.0) and m.gain.sd == pytest.approx(2.5 ** 0.5)
    assert m.gain.ci == pytest.approx(paired_gain([2, 3, 1, 4, 0]).ci)
    assert m.baseline == pytest.approx((70.0, 250 ** 0.5))  # sample sd (ddof = 1) of 80, 70, 90, 50, 60
    _write(tmp_path, "e", "few", {0: 0.9, 1: 0.9, 2: 0.9})
    assert measure(tmp_path, Claim("y", "P", "c", "f", None, "e", "base", "few")) is None
    three = measure(tmp_path, Claim("y", "P", "c", "f", None, "e", "base", "few", min_seeds=3))
    assert three.seeds == 3 and three.gain.mean == pytest.approx((10 + 20 + 0) / 3)


def test_min_seeds_below_three_is_refused(tmp_path):
    f = tmp_path / "claims.toml"
    f.write_text('[[claim]]\nid = "z"\npaper = "P"\nclaim = "c"\npaper-figure = "f"\nexperiment = "e"\n'
                 'baseline = "b"\nmethod = "m"\nmin-seeds = 2\n')
    with pytest.raises(ValueError, match="claim 'z': min-seeds must be an integer >= 3"):
        load_claims(f)


def test_unfinished_runs_do_not_count(tmp_path):
    _write(tmp_path, "e", "base", {k: 0.8 for k in range(5)})
    _write(tmp_path, "e", "meth", {k: 0.9 for k in range(4)})
    d = tmp_path / "e" / "meth" / "seed4"
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({"run_config": {"num-server-rounds": 5}, "rounds": [{}],
                                                "final": {"global_accuracy": 0.99}}))
    assert measure(tmp_path, Claim("x", "P", "c", "f", 1.0, "e", "base", "meth")) is None


def test_verdict_uses_the_interval():
    up = paired_gain([3.0, 3.5, 2.5, 3.0, 3.2])
    assert verdict(Measured(5, (0, 0), (0, 0), up), 4.0) == "reproduced"
    assert verdict(Measured(5, (0, 0), (0, 0), up), 8.0) == "smaller than claimed"
    assert verdict(Measured(5, (0, 0), (0, 0), paired_gain([3.0, -2.0, 1.0, 0.5, -1.0])), 4.0) == "inconclusive"
    assert verdict(Measured(5, (0, 0), (0, 0), paired_gain([-3.0, -2.0, -4.0, -2.5, -3.0])), 4.0) == "contradicted"
    assert verdict(None, 4.0) == "not run"


def test_ledger_prints_the_rule_n_ci_p_and_reason_only_when_a_claim_fails(tmp_path):
    _write(tmp_path, "e", "base", {k: 0.8 for k in range(5)})
    _write(tmp_path, "e", "up", {0: 0.9, 1: 0.91, 2: 0.92, 3: 0.9, 4: 0.92})
    _write(tmp_path, "e", "down", {k: 0.7 + 0.01 * k for k in range(5)})
    text = ledger(tmp_path, [Claim("good", "P", "up", "f", 5.0, "e", "base", "up"),
                             Claim("bad", "P", "down", "f", 5.0, "e", "base", "down", reason="the cause")], {"e": "E"})
    assert "Verdict from the paired gain's 95 % Student-t confidence interval" in text
    assert text.index("Verdict from") < text.index("| claim |")
    assert "**reproduced**" in text and "**contradicted**" in text
    assert "- **bad** (contradicted): the cause" in text and "- **good**" not in text
    g = paired_gain([10, 11, 12, 10, 12])
    assert g.p < 0.001 and f"| 5 | +11.00 | [{g.ci[0]:+.2f}, {g.ci[1]:+.2f}] | < 0.001 | < 0.001 | – (untuned) | **reproduced** |" in text
    assert "| p | p (Holm) | near-tie pairs | verdict |" in text
    assert "base: 80.00 ± 0.00" in text
    noted = ledger(tmp_path, [Claim("good", "P", "up", "f", 5.0, "e", "base", "up", reason="a caveat")], {"e": "E"})
    assert "- **good** (reproduced): a caveat" in noted      # a reproduced claim's reason is printed as a caveat


def _tuning(root: Path, exp: str, arms: dict[str, list[tuple[float, list[float]]]]) -> None:
    """tuning.json with, per arm, trials (lr, per-federation scores); the first trial is the chosen one."""
    runs = {label: {"chosen": {"lr": trials[0][0]},
                    "trials": [{"values": {"lr": lr}, "val_score": sum(sc) / len(sc),
                                "val_scores": {str(100 + i): v for i, v in enumerate(sc)}} for lr, sc in trials]}
            for label, trials in arms.items()}
    (root / exp).mkdir(parents=True, exist_ok=True)
    (root / exp / "tuning.json").write_text(json.dumps({"runs": runs}))


def test_the_headline_verdict_is_the_worst_near_tie_pairs(tmp_path):
    # the method's chosen lr 0.1 and a near tie lr 0.03 (deficits 0.01, -0.01, 0.02: within one SE); the
    # baseline's other trial is consistently worse (no tie)
    _tuning(tmp_path, "e", {"base": [(0.1, [0.80, 0.80, 0.80]), (0.3, [0.70, 0.71, 0.70])],
                            "up": [(0.1, [0.90, 0.90, 0.90]), (0.03, [0.89, 0.91, 0.88])]})
    _write(tmp_path, "e", "base", {k: 0.8 for k in range(5)})
    _write(tmp_path, "e", "up", {0: 0.9, 1: 0.91, 2: 0.92, 3: 0.9, 4: 0.92})
    claim = Claim("good", "P", "up", "f", 5.0, "e", "base", "up")
    text = ledger(tmp_path, [claim], {"e": "E"})
    assert "| 1 of 2 pairs run (reproduced in 1) | **reproduced** |" in text
    assert "  - base lr=0.1 (chosen) x up lr=0.03: not run (0 of 5 seeds)" in text
    # a near tie with only some of the reported seeds is not a pair yet
    _write(tmp_path, "e/near-ties/up", "lr=0.03", {0: 0.83, 1: 0.78})
    assert "  - base lr=0.1 (chosen) x up lr=0.03: not run (2 of 5 seeds)" in ledger(tmp_path, [claim], {"e": "E"})
    import shutil

    shutil.rmtree(tmp_path / "e/near-ties/up/lr=0.03")
    # the near tie's seeds: a gain that is inconclusive (its CI contains 0) -> the headline word is that one
    _write(tmp_path, "e/near-ties/up", "lr=0.03", {0: 0.83, 1: 0.78, 2: 0.84, 3: 0.77, 4: 0.82})
    text = ledger(tmp_path, [claim], {"e": "E"})
    assert "| inconclusive in 1, reproduced in 1 of 2 pairs | **inconclusive** |" in text
    assert "- **good** (chosen pair: reproduced; headline: the worst pair's, inconclusive):" in text
    # every pair agreeing: robust
    for k in range(5):
        (tmp_path / "e/near-ties/up/lr=0.03" / f"seed{k}" / "results.json").write_text(json.dumps(
            {"run_config": {"num-server-rounds": 2}, "rounds": [{}] * 2, "final": {"global_accuracy": 0.9 + 0.005 * k}}))
    assert "| robust (2 of 2 pairs reproduced) | **reproduced** |" in ledger(tmp_path, [claim], {"e": "E"})


def test_a_tuned_rows_score_is_the_mean_of_the_last_rounds_its_tuning_selected_on(tmp_path):
    from experiments.claims import final_by_seed, score_rounds

    d = tmp_path / "e" / "m" / "seed0"
    d.mkdir(parents=True)
    rounds = [{"global_accuracy": a} for a in (0.1, 0.5, 0.6, 0.7)]
    (d / "results.json").write_text(json.dumps({"run_config": {"num-server-rounds": 4}, "rounds": rounds,
                                                "final": {"global_accuracy": 0.7}}))
    assert score_rounds(tmp_path, "e") == 1 and final_by_seed(tmp_path, "e", "m") == {0: pytest.approx(70.0)}
    (tmp_path / "e" / "experiment.toml").write_text("[tuning]\nlast-rounds = 3\n")
    assert score_rounds(tmp_path, "e") == 3
    assert final_by_seed(tmp_path, "e", "m") == {0: pytest.approx(60.0)}   # mean of 0.5, 0.6, 0.7
    (tmp_path / "e" / "experiment.toml").write_text("[tuning]\nlr = [0.1]\n")
    assert score_rounds(tmp_path, "e") == 3                                   # tuning.py's default


def test_committed_claims_name_declared_runs_of_committed_experiment_configs():
    import tomllib

    claims = load_claims(CLAIMS)
    assert {c.id for c in claims} >= {"fedrane", "gne", "fedbc", "fedbc-dual-weighting", "fedufo", "fedbr", "fedetf"}
    for c in claims:
        cfg = PROJECT_ROOT / "experiments" / "configs" / f"{c.experiment}.toml"
        runs = tomllib.loads(cfg.read_text())["runs"]
        assert c.baseline in runs and c.method in runs, c.id
        assert "tuning" in tomllib.loads(cfg.read_text()), f"{c.id}: a claim's experiment must be tuned"


def test_reason_numbers_come_from_the_result_files(tmp_path):
    for seed, vals in ((0, [0.5, 0.9]), (1, [0.7])):
        d = tmp_path / "e" / "m" / f"seed{seed}"
        d.mkdir(parents=True)
        rounds = [{"strategy": {"w-ratio": v}} for v in vals]
        (d / "results.json").write_text(json.dumps({"run_config": {}, "rounds": rounds, "final": {}}))
    from experiments.claims import fill_reason

    c = Claim("x", "P", "c", "f", 1.0, "e", "b", "m", reason="ratio {{m:w-ratio:median}} up to {{m:w-ratio:max}}; "
                                                             "{{m:nothing:max}}")
    assert fill_reason(tmp_path, c) == "ratio 0.7 up to 0.9; (no 'nothing' recorded for m)"
    for label, accs in (("b", [0.5, 0.6, 0.7]), ("o", [0.6, 0.8, 0.7])):
        for seed, acc in enumerate(accs):
            d = tmp_path / "e" / label / f"seed{seed}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "results.json").write_text(json.dumps({"run_config": {}, "rounds": [{}], "final": {"global_accuracy": acc}}))
    c = Claim("x", "P", "c", "f", 1.0, "e", "b", "m", reason="o gains {{vs:o:mean}} {{vs:o:ci}}; {{vs:nope:mean}}")
    g = paired_gain([10.0, 20.0, 0.0])
    assert fill_reason(tmp_path, c) == (f"o gains +10.00 [{g.ci[0]:+.2f}, {g.ci[1]:+.2f}]; "
                                        "(no paired seeds of nope)")
    c = Claim("x", "P", "c", "f", 1.0, "e", "b", "m", reason="at the end {{m:w-ratio:last}}")
    assert fill_reason(tmp_path, c) == "at the end 0.8"  # the median of the seeds' last rounds: 0.9 and 0.7


def test_reason_quotes_the_rows_per_seed_gains(tmp_path):
    from experiments.claims import fill_reason

    _write(tmp_path, "e", "base", {k: 0.8 for k in range(5)})
    _write(tmp_path, "e", "meth", {0: 0.82, 1: 0.79, 2: 0.85, 3: 0.8, 4: 0.81})
    c = Claim("x", "P", "c", "f", 1.0, "e", "base", "meth",
              reason="gained on {{gain:positive}} of {{gain:n}} seeds, {{gain:min}} to {{gain:max}}")
    assert fill_reason(tmp_path, c) == "gained on 3 of 5 seeds, -1.00 to +5.00"


def test_a_chosen_run_the_near_tie_machine_did_not_reproduce_gets_a_caveat(tmp_path):
    import json

    from experiments.claims import chosen_check_caveat

    check = tmp_path / "exp" / "near-ties" / "chosen_check.json"
    check.parent.mkdir(parents=True)
    assert chosen_check_caveat(tmp_path, "exp") == ""                        # no check run: nothing to say
    check.write_text(json.dumps({"seed": 0, "stack": {"cpu_capability": "AVX512"},
                                 "runs": {"fedavg": {"status": "identical", "max_abs_difference": 0.0}}}))
    assert chosen_check_caveat(tmp_path, "exp") == ""
    check.write_text(json.dumps({"seed": 0, "stack": {"cpu_capability": "AVX512"},
                                 "runs": {"fedavg": {"status": "differs", "max_abs_difference": 0.089},
                                          "fedbr": {"status": "differs", "max_abs_difference": 0.084}}}))
    text = chosen_check_caveat(tmp_path, "exp")
    assert "AVX512 CPU kernels, seed 0" in text and "(fedavg, fedbr;" in text and "0.089" in text


def test_the_rerun_caveat_needs_a_pair_with_a_near_tie_run():
    """Only a pair with a near-tie choice mixes the reported runs with runs of the near-tie machine: a row whose
    pairs are the chosen x chosen one alone (no near ties, the FMNIST rows) gets no caveat from a re-run check."""
    from experiments.claims import NearTies
    from experiments.stats import PairedGain

    gain = PairedGain(n=3, mean=1.0, sd=1.0, ci=(0.0, 2.0), p=0.05)
    alone = NearTies([("lr=0.03 (chosen)", "lr=0.1 (chosen)", gain, "inconclusive")])
    assert not alone.has_near_tie_runs
    tie = NearTies([("lr=0.03 (chosen)", "lr=0.1 (chosen)", gain, "inconclusive"),
                    ("lr=0.01", "lr=0.1 (chosen)", gain, "inconclusive")])
    assert tie.has_near_tie_runs
    waiting = NearTies([("lr=0.03 (chosen)", "lr=0.1 (chosen)", gain, "inconclusive"),
                        ("lr=0.01", "lr=0.1 (chosen)", None, "not run (0 of 3 seeds)")])
    assert not waiting.has_near_tie_runs          # a near-tie pair not run yet mixes nothing
