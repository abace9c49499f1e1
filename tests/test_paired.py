"""experiments/paired.py: the paired equivalence table (bf16 against fp32, issue 44)."""

import pytest

from experiments.paired import equivalence, paired_rows, paired_table


def doc(seed: int, acc: float) -> dict:
    return {"run_config": {"seed": seed}, "final": {"global_accuracy": acc}}


def test_equivalence_reads_the_interval_against_the_margin():
    assert equivalence(-0.4, 0.9, 1.0) == "equivalent within ±1"
    assert equivalence(-1.2, 0.3, 1.0) == "not shown equivalent"     # reaches past -1
    assert equivalence(-3.0, -1.5, 1.0) == "different"
    assert equivalence(1.01, 2.0, 1.0) == "different"
    assert equivalence(-1.0, 1.0, 1.0) == "equivalent within ±1"     # the ends count as inside


def test_pairs_match_seed_to_seed_and_skip_unshared_seeds():
    runs = {"bf16": [doc(2, 0.80), doc(0, 0.70), doc(1, 0.75), doc(9, 0.10)],
            "fp32": [doc(0, 0.71), doc(1, 0.74), doc(2, 0.80), doc(5, 0.99)]}
    (row,) = paired_rows(runs, [["bf16", "fp32"]], 1.0)
    assert row["seeds"] == [0, 1, 2]
    assert row["differences"] == pytest.approx([-1.0, 1.0, 0.0])
    assert row["mean"] == pytest.approx(0.0) and row["p"] == pytest.approx(1.0)
    # sd 1 over 3 seeds: t(0.975, 2) = 4.303 -> half width 4.303 / sqrt(3) = 2.484
    assert row["ci"] == pytest.approx((-2.484, 2.484), abs=1e-3)
    assert row["verdict"] == "not shown equivalent"
    assert row["a_mean"] == pytest.approx(75.0) and row["b_mean"] == pytest.approx(75.0)


def test_the_table_has_a_row_per_pair_with_two_shared_seeds():
    runs = {"a": [doc(0, 0.5), doc(1, 0.6)], "b": [doc(0, 0.5), doc(1, 0.601)], "c": [doc(0, 0.4)]}
    lines = paired_table(runs, [["a", "b"], ["c", "b"], ["x", "b"]], 1.0)
    rows = [line for line in lines if line.startswith("| a")]
    assert len(rows) == 1 and "**equivalent within ±1**" in rows[0] and "-0.05" in rows[0]
    assert paired_table(runs, [["c", "b"]], 1.0) == []


def _write_runs(root, label, accs_by_seed, last_rounds=2):
    import json

    exp = root / "exp"
    (exp / "experiment.toml").parent.mkdir(parents=True, exist_ok=True)
    (exp / "experiment.toml").write_text(f"[tuning]\nlast-rounds = {last_rounds}\n")
    for seed, accs in accs_by_seed.items():
        d = exp / label / f"seed{seed}"
        d.mkdir(parents=True)
        doc = {"run_config": {"num-server-rounds": len(accs), "seed": seed},
               "rounds": [{"round": i + 1, "global_accuracy": a} for i, a in enumerate(accs)],
               "final": {"global_accuracy": accs[-1]}}
        (d / "results.json").write_text(json.dumps(doc))


def test_versus_best_picks_the_strongest_baseline_scores_the_last_rounds_and_reads_the_papers_gain(tmp_path):
    from experiments.paired import versus_best_rows, versus_best_table

    _write_runs(tmp_path, "m", {0: [0.5, 0.80, 0.82], 1: [0.5, 0.84, 0.86], 2: [0.5, 0.81, 0.83]})
    _write_runs(tmp_path, "weak", {0: [0.5, 0.60, 0.60], 1: [0.5, 0.61, 0.61], 2: [0.5, 0.62, 0.62]})
    _write_runs(tmp_path, "strong", {0: [0.5, 0.79, 0.79], 1: [0.5, 0.80, 0.80], 2: [0.5, 0.81, 0.83]})
    paper = {"g-fl": {"m": 0.88, "weak": 0.80, "strong": 0.87}}
    (row,) = versus_best_rows(tmp_path, "exp", [["m", "weak", "strong"]], paper)
    assert row["baseline"] == "strong" and row["n"] == 3
    # last 2 rounds: m 81, 85, 82; strong 79, 80, 82 -> differences 2, 5, 0
    assert row["gain"].mean == pytest.approx(7 / 3) and row["paper_gain"] == pytest.approx(1.0)
    assert row["verdict"] == "inconclusive"   # the interval of (2, 5, 0) contains 0
    lines = versus_best_table(tmp_path, "exp", [["m", "weak", "strong"]], paper)
    assert "| m | strong | 3 |" in lines[4] and "+1.00" in lines[4] and "**inconclusive**" in lines[4]
    assert versus_best_rows(tmp_path, "exp", [["m", "absent"]], paper) == []
