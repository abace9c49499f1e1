"""docs/RESULTS.md (experiments/report.py): the tuning table shows the final grid, how it grew, the effective
budgets and inert knobs; experiments recorded before the fixed test split are marked."""

from __future__ import annotations

import json

from experiments import report


def _tuning(tmp_path, doc):
    d = tmp_path / "exp"
    d.mkdir()
    (d / "tuning.json").write_text(json.dumps(doc))
    return report.tuning_table(d)


def test_tuning_table_shows_the_final_grid_budgets_and_edges(tmp_path):
    trial = {"values": {"lr": 1.11, "weight-decay": 0.0}, "val_score": 0.9}
    text = _tuning(tmp_path, {
        "metric": "mean val_accuracy over the last 5 rounds", "seed": 100, "validation-fraction": 0.2,
        "lr-grid": [0.01, 0.03, 0.1, 0.333, 1.11], "lr-grid-initial": [0.01, 0.03, 0.1],
        "lr-grid-extended": {"low": 0, "high": 2}, "max-extend": 2, "inert-tolerance": 0.005,
        "runs": {"fedavg": {"chosen": {"lr": 1.11, "weight-decay": 0.0}, "val_score": 0.9, "budget": 15,
                            "effective-budget": 10, "inert-knobs": ["weight-decay"], "makeup-lr": [0.0548],
                            "on-edge": True, "trials": [trial]},
                 "fedprox": {"chosen": {"lr": 0.1, "fedprox.mu": 0.01}, "val_score": 0.8, "budget": 10,
                             "effective-budget": 10, "inert-knobs": [], "makeup-lr": [], "on-edge": False,
                             "trials": [{"values": {"lr": 0.333, "fedprox.mu": 1.0}, "val_score": None}]}}})
    assert "final lr grid [0.01, 0.03, 0.1, 0.333, 1.11] (grown from [0.01, 0.03, 0.1] by 0 value(s) below " \
           "and 2 above, at most 2 per side)" in text
    assert "more than 0.005" in text
    assert ("| fedavg | 15 | 10 | weight-decay (make-up lr [0.0548]) | lr=1.11, weight-decay=0.0 (on the edge of the "
            "bounded grid) | 90.00 | lr=1.11, weight-decay=0.0: 90.0 |") in text
    assert "| fedprox | 10 | 10 | none | lr=0.1, fedprox.mu=0.01 | 80.00 | lr=0.333, fedprox.mu=1.0: diverged |" in text


def test_tuning_table_of_an_older_file_says_its_grid_was_fixed(tmp_path):
    text = _tuning(tmp_path, {"metric": "m", "seed": 100, "validation-fraction": 0.2, "lr-grid": [0.01, 0.1],
                              "runs": {"a": {"chosen": {"lr": 0.1}, "val_score": 0.5, "budget": 2,
                                             "trials": [{"values": {"lr": 0.1}, "val_score": 0.5}]}}})
    assert "lr grid [0.01, 0.1] (fixed: tuned before the edge-growth rule)" in text
    assert "| a | 2 | – | – | lr=0.1 | 50.00 |" in text


def test_experiments_recorded_before_the_fixed_split_are_marked(tmp_path):
    from experiments.run import SPLIT_MARKER

    assert "earlier test split, drawn with each run's seed" in report.split_note(tmp_path)[0]
    (tmp_path / SPLIT_MARKER).write_text("{}")
    assert report.split_note(tmp_path) == []


def test_ledger_only_replaces_just_the_ledger_section():
    doc = ("# Results\n\nheader\n\n## Claims ledger\n\nold ledger\n\n## Paper-scale presets: what has been run\n\n"
           "presets\n\n## Other\n\nsomeone's table\n")
    out = report.replace_ledger(doc, "## Claims ledger\n\nnew ledger")
    assert out == doc.replace("old ledger\n", "new ledger\n")
    import pytest

    with pytest.raises(ValueError, match="no ledger section"):
        report.replace_ledger("# Results\n", "x")


def test_a_section_is_replaced_in_place_up_to_the_next_heading():
    doc = "# R\n\n## A\n\nold a\n\n## B\n\nold b\n\n## C\n\nc\n"
    assert report.replace_section(doc, ["## B", "", "new b", ""]) == "# R\n\n## A\n\nold a\n\n## B\n\nnew b\n\n## C\n\nc\n"
    assert report.replace_section(doc, ["## C", "", "new c", ""]) == "# R\n\n## A\n\nold a\n\n## B\n\nold b\n\n## C\n\nnew c\n\n"
    import pytest

    with pytest.raises(ValueError, match="no section '## D'"):
        report.replace_section(doc, ["## D"])


def test_the_committed_ledger_is_generated_from_the_result_files():
    from experiments.claims import CLAIMS, ledger_for

    text = report.DOC.read_text()
    assert ledger_for(report.RESULTS_ROOT, CLAIMS) in text, "run: python -m experiments.report --ledger-only"


def test_runs_tuned_by_separate_invocations_name_their_own_grids(tmp_path):
    """`experiments.tune --only` per column grows each column's grid on its own: the report names each."""
    def run(lr, grid, grown):
        return {"chosen": {"lr": lr}, "val_score": 0.5, "budget": 1, "lr-grid": grid, "lr-grid-extended": grown,
                "trials": [{"values": {"lr": lr}, "val_score": 0.5}]}
    text = _tuning(tmp_path, {
        "metric": "m", "seed": 100, "validation-fraction": 0.2, "lr-grid": [0.001, 0.003, 0.01],
        "lr-grid-initial": [0.003, 0.01], "lr-grid-extended": {"low": 1, "high": 0}, "max-extend": 2,
        "runs": {"a-e1": run(0.03, [0.003, 0.01, 0.03], {"low": 0, "high": 1}),
                 "b-e1": run(0.01, [0.003, 0.01, 0.03], {"low": 0, "high": 1}),
                 "a-e5": run(0.001, [0.001, 0.003, 0.01], {"low": 1, "high": 0})}})
    assert ("final lr grid [0.003, 0.01, 0.03] for a-e1, b-e1 (grown from [0.003, 0.01] by 0 value(s) below and 1 "
            "above, at most 2 per side); final lr grid [0.001, 0.003, 0.01] for a-e5 (grown from [0.003, 0.01] by 1 "
            "value(s) below and 0 above, at most 2 per side)") in text


def test_runs_without_their_split_or_code_digest_are_counted_in_their_section(tmp_path):
    import json

    for i, (split, code) in enumerate([(True, True), (False, True), (False, False)]):
        d = tmp_path / "a" / f"seed{i}"
        d.mkdir(parents=True)
        (d / "results.json").write_text(json.dumps({"stack": {"code": {"digest": "x"}} if code else {}}))
        if split:
            (d / "client_split.json").write_text("{}")
    (note, _) = report.provenance_note(tmp_path)
    assert "2 of 3 runs record no client split (client_split.json); 1 of 3 runs record no code digest" in note
    (tmp_path / "a" / "seed1" / "client_split.json").write_text("{}")
    (tmp_path / "a" / "seed2" / "client_split.json").write_text("{}")
    (tmp_path / "a" / "seed2" / "results.json").write_text(json.dumps({"stack": {"code": {"digest": "x"}}}))
    assert report.provenance_note(tmp_path) == []
