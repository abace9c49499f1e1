"""experiments/preset_runs.py: which reported runs are in a paper preset's setting, and how they depart from it."""

from __future__ import annotations

import json
from pathlib import Path

from experiments import report
from experiments.preset_runs import NOT_RECORDED, departures, in_setting, preset_runs, status
from flcore.config import resolve_run_config
from flcore.presets import get_preset


def write_run(root: Path, experiment: str, label: str, seed: int, config: dict, clients: int | None = None) -> None:
    d = root / experiment / label / f"seed{seed}"
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps({"run_config": config, "rounds": []}))
    if clients is not None:
        (d / "client_split.json").write_text(json.dumps({"digest": "x", "num_partitions": clients}))


def preset_config(name: str, **over) -> dict:
    return {**resolve_run_config({"preset": name}), "preset": "", **over}


def test_a_tuned_short_run_is_in_the_setting_and_each_departure_is_named(tmp_path):
    write_run(tmp_path, "exp", "fedrane", 0, preset_config("fedrane-fmnist-dir01", lr=0.03, **{"num-server-rounds": 10}),
              clients=20)
    write_run(tmp_path, "exp", "fedrane", 1, preset_config("fedrane-fmnist-dir01", lr=0.1, **{"num-server-rounds": 10}),
              clients=20)
    (run,) = preset_runs(tmp_path)["fedrane-fmnist-dir01"]
    assert (run.experiment, run.label, run.seeds) == ("exp", "fedrane", 2)
    assert run.differs == {"num-server-rounds": ("10", "100"), "lr": ("0.03 / 0.1", "0.5")}
    assert status([run]) == "setting run: `exp` fedrane (2 seeds)"
    assert status([]) == "**not run**"


def test_a_seed_at_the_presets_value_is_listed_beside_one_that_departs(tmp_path):
    write_run(tmp_path, "exp", "a", 0, preset_config("fedrane-fmnist-dir01", lr=0.03))
    write_run(tmp_path, "exp", "a", 1, preset_config("fedrane-fmnist-dir01"))
    (run,) = preset_runs(tmp_path)["fedrane-fmnist-dir01"]
    assert run.differs == {"lr": ("0.03 / 0.5", "0.5")}


def test_another_alpha_method_or_client_count_is_another_setting():
    p = get_preset("fedrane-fmnist-dir01")
    same = preset_config(p.name)
    assert in_setting(same, 20, p.values, p.num_supernodes) and in_setting(same, None, p.values, p.num_supernodes)
    assert not in_setting({**same, "dirichlet-alpha": 0.5}, 20, p.values, p.num_supernodes)
    assert not in_setting({**same, "method": "fedavg"}, 20, p.values, p.num_supernodes)
    assert not in_setting(same, 10, p.values, p.num_supernodes)


def test_a_table_column_counts_for_its_own_epochs_preset_only(tmp_path):
    # FedBC's Table 1 presets differ only in E: a run at E = 25 is in every column's setting, and counts for E = 25
    write_run(tmp_path, "t1", "fedbc-e25", 0, preset_config("fedbc-synthetic-e25", lr=0.003), clients=30)
    found = preset_runs(tmp_path)
    assert list(found) == ["fedbc-synthetic-e25"]
    assert found["fedbc-synthetic-e25"][0].differs == {"lr": ("0.003", "0.01")}


def test_a_key_the_run_did_not_record_is_named_not_skipped():
    p = get_preset("fedrane-fmnist-dir01")
    old = {k: v for k, v in preset_config(p.name).items() if k != "fedrane.lra-predictor"}
    assert departures(old, resolve_run_config({"preset": p.name}), p.values) == {
        "fedrane.lra-predictor": (NOT_RECORDED, "mlp")}


def test_the_committed_presets_section_is_generated_from_the_result_files():
    assert report.presets_status(report.RESULTS_ROOT) in report.DOC.read_text(), "run: python -m experiments.report"
