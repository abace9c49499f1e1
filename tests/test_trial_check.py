"""Re-run check of tuning trials (experiments/trial_check.py, issue 43 item 4): a trial written without a code
digest is re-run at today's code and compared round by round with its file; the files are not touched."""

from __future__ import annotations

import json

import experiments.run as run_mod
import experiments.tune as tune_mod
from experiments import trial_check
from experiments.report import check_line
from tests.test_tuning import CONFIG


def test_trials_without_a_code_digest_are_re_run_and_a_changed_one_is_named(tmp_path, monkeypatch):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(CONFIG)
    monkeypatch.setattr(run_mod, "RESULTS_ROOT", tmp_path / "results")
    monkeypatch.setattr(tune_mod, "RESULTS_ROOT", tmp_path / "results")
    assert tune_mod.main([str(cfg)]) == 0
    root = tmp_path / "results" / "tiny-tuning"
    assert trial_check.main([str(cfg)]) == 0                   # every trial names its code: nothing to re-run
    assert not (root / "tuning" / trial_check.CHECK_FILE).exists()

    def as_if_old(folder, moved: bool = False) -> str:
        """The trial's file as one written before results named their stack and before P-FL was evaluated on the
        validation split (another local accuracy: not compared), and, ``moved``, with another validation accuracy
        in round 2; returns the file's text."""
        path = folder / "results.json"
        doc = json.loads(path.read_text())
        del doc["stack"]
        doc["rounds"][0]["local_accuracy"] += 0.05
        if moved:
            doc["rounds"][1]["val_accuracy"] += 0.01
        path.write_text(json.dumps(doc))
        return path.read_text()

    same = root / "tuning" / "fedavg" / "lr=0.01-weight-decay=0.0"
    other = root / "tuning" / "fedprox" / "lr=0.3-fedprox.mu=1.0"
    texts = {same: as_if_old(same), other: as_if_old(other, moved=True)}
    assert trial_check.main([str(cfg)]) == 1                   # a trial that differs: exit 1
    check = json.loads((root / "tuning" / trial_check.CHECK_FILE).read_text())
    assert set(check["trials"]) == {"fedavg/lr=0.01-weight-decay=0.0", "fedprox/lr=0.3-fedprox.mu=1.0"}
    assert check["trials"]["fedavg/lr=0.01-weight-decay=0.0"]["status"] == "identical"
    moved = check["trials"]["fedprox/lr=0.3-fedprox.mu=1.0"]
    assert moved["status"] == "differs" and abs(moved["max_abs_difference_by_key"]["val_accuracy"] - 0.01) < 1e-9
    assert moved["recorded_code"] is None and moved["checked_on"]["code"] == check["stack"]["code"]["digest"]
    assert all(folder.joinpath("results.json").read_text() == text for folder, text in texts.items())  # untouched
    line = check_line(root)[0]
    assert "Re-run check of tuning trials (`results/tiny-tuning/tuning/trial_check.json`" in line
    assert "2 tuning trial(s) re-run: 1 identical, 1 differ (fedprox/lr=0.3-fedprox.mu=1.0" in line
    # --all re-runs every finished trial; the entries of the earlier check stay
    assert trial_check.main([str(cfg), "--all", "--only", "fedavg"]) == 0    # what it re-ran is identical
    check = json.loads((root / "tuning" / trial_check.CHECK_FILE).read_text())
    fedavg = len(json.loads((root / "tuning.json").read_text())["runs"]["fedavg"]["trials"])
    assert len(check["trials"]) == fedavg + 1 and check["trials"]["fedprox/lr=0.3-fedprox.mu=1.0"]["status"] == "differs"
    assert all(v["status"] == "identical" for k, v in check["trials"].items() if k.startswith("fedavg/"))


def test_a_trial_is_compared_on_what_the_tuning_reads():
    assert trial_check.compared_keys("val_accuracy") == (("val_accuracy",), ("val_loss",))
    assert trial_check.compared_keys("local_accuracy") == (("val_accuracy", "local_accuracy"), ("val_loss",))
