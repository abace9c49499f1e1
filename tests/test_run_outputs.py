"""Run outputs (issue 18): default out-dir and runs/latest, --overwrite, metrics.csv = every per-round scalar of
results.json, the per-round elapsed/ETA line, and the experiment runner's progress bar and exit code."""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

import pytest

from flcore.config import ConfigError, RunConfig, resolve_run_config
from server_app import outputs
from server_app.results import ResultsWriter, csv_columns
from server_app.runner import DONE_MARKER, clock, progress, run_federation
from tests.fakegrid import FakeGrid


def test_default_out_dir_is_method_and_time_and_never_reused(tmp_path):
    now = time.mktime((2026, 3, 4, 5, 6, 7, 0, 0, -1))
    first = outputs.default_out_dir("fedbc", tmp_path, now)
    assert first == tmp_path / "runs" / "fedbc-20260304-050607"
    first.mkdir(parents=True)
    assert outputs.default_out_dir("fedbc", tmp_path, now).name == "fedbc-20260304-050607-2"


def test_with_out_dir_resolves_once(tmp_path, monkeypatch):
    """RunConfig.with_out_dir: '' -> runs/<method>-<time>, or the resumed run's directory; a given one made
    absolute; a resolved config comes back as the very same object (nothing downstream resolves it anew)."""
    monkeypatch.chdir(tmp_path)
    got = RunConfig.from_dict({"method": "moon"}).with_out_dir()
    assert Path(got.out_dir).parent == tmp_path / "runs" and Path(got.out_dir).name.startswith("moon-")
    assert got.with_out_dir() is got and got.out_path == tmp_path / "runs" / Path(got.out_dir).name
    resumed = RunConfig.from_dict({"resume-from": "r/ckpt/checkpoint.pt"}).with_out_dir()
    assert resumed.out_dir == str(tmp_path / "r" / "ckpt")
    assert RunConfig.from_dict({"out-dir": "x"}).with_out_dir().out_dir == str(tmp_path / "x")
    with pytest.raises(ConfigError, match="'out-dir' is '' here"):
        _ = RunConfig.from_dict({}).out_path


def test_latest_links_the_newest_run(tmp_path):
    runs = tmp_path / "runs"
    a, b = runs / "fedavg-1", runs / "fedavg-2"
    outputs.prepare_out_dir(a, overwrite=False)
    assert os.readlink(runs / "latest") == "fedavg-1" and (runs / "latest").resolve() == a
    outputs.prepare_out_dir(b, overwrite=False)
    assert os.readlink(runs / "latest") == "fedavg-2"
    assert outputs.link_latest(tmp_path / "elsewhere") is None  # only runs/ directories get a link
    assert sorted(p.name for p in runs.iterdir()) == ["fedavg-1", "fedavg-2", "latest"]


def test_an_old_latest_directory_is_left_alone(tmp_path, capsys):
    (tmp_path / "runs" / "latest").mkdir(parents=True)
    (tmp_path / "runs" / "latest" / "results.json").write_text("{}")
    assert outputs.link_latest(tmp_path / "runs" / "new") is None
    assert "not a link; left as it is" in capsys.readouterr().out
    assert (tmp_path / "runs" / "latest" / "results.json").exists()


def test_overwrite_removes_only_run_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("results.json", "metrics.csv", "checkpoint.pt", "notes.txt", "run.log"):
        (out / name).write_text("old")
    outputs.prepare_out_dir(out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "run.log"]
    (out / "checkpoint.pt").write_text("keep")
    outputs.prepare_out_dir(out, overwrite=True, resume_from=str(out))  # resuming here keeps the checkpoint
    assert (out / "checkpoint.pt").read_text() == "keep"


def test_csv_columns_are_every_per_round_scalar(tmp_path):
    rows = [{"round": 1, "global_accuracy": 0.5, "sampled": [0, 1], "failures": [], "per_client": {"0": 0.4},
             "strategy": {"m-scalar": 1.5, "m-vector": [1.0, 2.0], "m-flag": True}},
            {"round": 2, "global_accuracy": 0.6, "client_accuracy_best": 0.9, "num_evaluated": 2,
             "strategy": {"m-scalar": 2.5, "m-late": "x"}}]
    cols = csv_columns(rows)
    assert {"client_accuracy_best", "num_evaluated", "strategy.m-scalar", "strategy.m-flag",
            "strategy.m-late"} <= set(cols)
    assert not {"sampled", "failures", "per_client", "strategy.m-vector", "strategy"} & set(cols)
    w = ResultsWriter(tmp_path, RunConfig.from_dict({}))
    w.rounds = rows
    with w.write_csv().open() as fh:
        got = list(csv.DictReader(fh))
    assert got[0]["strategy.m-scalar"] == "1.5" and got[1]["strategy.m-scalar"] == "2.5"
    assert got[0]["client_accuracy_best"] == "" and got[1]["client_accuracy_best"] == "0.9"


def test_clock_and_eta():
    assert clock(5.04) == "5.0s" and clock(73.4) == "1m13s" and clock(3725) == "1h02m05s"
    # rounds 3..5 of 10 resumed at t=100 (run started at t=90), now t=130: 10 s a round, 5 rounds left
    assert progress(5, 3, 10, t_start=90.0, t_rounds=100.0, now=130.0) == "elapsed 40.0s, ETA 50.0s"


def test_a_real_run_writes_every_scalar_to_csv_and_prints_elapsed_and_eta(tmp_path, capsys):
    cfg = RunConfig.from_dict(resolve_run_config({
        "method": "fedbc", "dataset": "digits", "num-server-rounds": 2, "batch-size": 16, "checkpoint": False,
        "federated-eval-every": 2, "local-test-fraction": 0.25, "out-dir": str(tmp_path / "run")}))
    doc = run_federation(FakeGrid(3), cfg)
    with (tmp_path / "run" / "metrics.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 2
    scalars = 0
    for row, got in zip(doc["rounds"], table):
        items = [(k, v) for k, v in row.items() if k != "strategy"]
        items += [(f"strategy.{k}", v) for k, v in row["strategy"].items()]
        for key, value in items:
            if value is None or isinstance(value, (bool, int, float, str)):
                scalars += 1
                assert got[key] == ("" if value is None else str(value)), key
    assert scalars > 40 and "strategy.fedbc-lambda-mean" in table[0]
    for row in doc["rounds"]:  # the global model's representations on the G-FL test set (models/representation.py)
        d = row["global_feature_dim"]
        assert 1.0 <= row["global_feature_erank"] <= d and 1 / d <= row["global_feature_corr"] <= 1.0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("[round ")]
    assert len(lines) == 2 and all("elapsed " in line and ", ETA " in line for line in lines)
    assert lines[-1].endswith("ETA 0.0s") and DONE_MARKER in out


def _experiment(tmp_path: Path) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text("""
[experiment]
name = "t"
seeds = [0]
num-supernodes = 3
[base]
dataset = "digits"
num-server-rounds = 1
batch-size = 16
federated-eval-every = 0
[runs.good]
method = "fedavg"
[runs.broken]
method = "fedavg"
max-update-norm = 1e-9
round-retries = 0
[runs.good2]
method = "fedprox"
fedprox.mu = 0.1
""")
    return path


def test_experiment_runner_shows_progress_and_exits_1_when_a_run_fails(tmp_path, monkeypatch, capsys):
    import experiments.run as runner

    monkeypatch.setattr(runner, "RESULTS_ROOT", tmp_path / "results")
    assert runner.main([str(_experiment(tmp_path))]) == 1
    out, err = capsys.readouterr()
    assert "[........................] 0/3 runs" in out and "[################........] 2/3 runs" in out
    assert "[########################] 3/3 runs" in out and "2 done, 1 failed" in out
    assert "[FAILED] t/broken/seed0" in out and "FAILED runs: broken/seed0" in err and "RoundFailed" in err
    good = json.loads((tmp_path / "results" / "t" / "good" / "seed0" / "results.json").read_text())
    assert len(good["rounds"]) == 1
    # again: the finished runs are skipped, the failed one is run again (into its non-empty out-dir) and fails
    assert runner.main([str(_experiment(tmp_path))]) == 1
    out, _ = capsys.readouterr()
    assert "[skip] t/good/seed0" in out and "[skip] t/good2/seed0" in out and "0/1 runs" in out
    # a finished run records its client split; one whose recorded split is not the config's now is redone
    split = tmp_path / "results" / "t" / "good" / "seed0" / runner.SPLIT_FILE
    assert json.loads(split.read_text())["num_partitions"] == 3
    split.write_text(json.dumps({"digest": "0" * 16, "num_partitions": 3}))
    assert runner.main([str(_experiment(tmp_path)), "--only", "good"]) == 0
    out, _ = capsys.readouterr()
    assert "[redo] t/good/seed0: recorded with other values (client split: 0000000000000000 -> " in out
    assert json.loads(split.read_text())["digest"] != "0" * 16


@pytest.mark.parametrize("done, total, bar", [(0, 4, "[" + "." * 24 + "] 0/4"), (1, 4, "[" + "#" * 6 + "." * 18 + "] 1/4")])
def test_sweep_progress_bar(done, total, bar):
    from experiments.run import sweep_progress

    line = sweep_progress(done, total, 60.0)
    assert line.startswith(bar) and ("ETA 3m00s" in line) == (done == 1)


def test_a_finished_run_recorded_with_other_values_is_redone_not_reported_under_the_new_config(tmp_path, monkeypatch,
                                                                                                capsys):
    """Re-running an experiment whose config changed (an edited base, a tuning that chose anew) redoes the runs
    recorded with the old values and says which values moved; runs that match are skipped."""
    import experiments.run as runner

    monkeypatch.setattr(runner, "RESULTS_ROOT", tmp_path / "results")
    path = _experiment(tmp_path)
    runner.main([str(path), "--only", "good", "good2"])
    capsys.readouterr()
    good2 = tmp_path / "results" / "t" / "good2" / "seed0" / "results.json"
    first = json.loads(good2.read_text())
    path.write_text(path.read_text().replace("fedprox.mu = 0.1", "fedprox.mu = 0.5"))
    assert runner.main([str(path), "--only", "good", "good2"]) == 0
    out = capsys.readouterr().out
    assert "[skip] t/good/seed0" in out  # fedavg does not read fedprox.*: its run still is the planned one
    assert "[redo] t/good2/seed0: recorded with other values (fedprox.mu: 0.1 -> 0.5)" in out
    again = json.loads(good2.read_text())
    assert first["run_config"]["fedprox.mu"] == 0.1 and again["run_config"]["fedprox.mu"] == 0.5
    assert again["final"] != first["final"]  # a stronger proximal pull: another model


def test_recorded_config_changes_compare_the_common_keys_and_the_methods_own_section(tmp_path):
    from flcore.config import RunConfig
    from server_app.results import recorded_config_changes

    def cfg(**keys):
        return RunConfig.from_dict({"method": "fedprox", "out-dir": str(tmp_path), **keys})

    assert recorded_config_changes(tmp_path, cfg()) == []  # nothing recorded
    from server_app.results import ResultsWriter

    ResultsWriter(tmp_path, cfg(lr=0.1)).write()  # the echo exactly as a run records it
    doc = json.loads((tmp_path / "results.json").read_text())
    record = doc["run_config"]
    assert recorded_config_changes(tmp_path, cfg(lr=0.1)) == []
    record["out-dir"] = "/elsewhere"            # where it was written: not compared
    record["reply-poll-interval"] = 9.0         # how often replies were polled: not compared
    record["fedufo.cgr-target"] = "other"       # another method's section: not read by this run
    record.pop("fedprox.mu")                    # a key the record lacks (added after the run): not compared
    (tmp_path / "results.json").write_text(json.dumps(doc))
    assert recorded_config_changes(tmp_path, cfg(lr=0.1)) == []
    assert recorded_config_changes(tmp_path, cfg(lr=0.03, **{"fedprox.mu": 0.5})) == ["lr: 0.1 -> 0.03"]
    record["momentum"] = 0.5
    (tmp_path / "results.json").write_text(json.dumps(doc))
    assert recorded_config_changes(tmp_path, cfg(lr=0.1)) == ["momentum: 0.5 -> 0.9"]
