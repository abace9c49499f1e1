"""`noniid-fl compare` (issue 33 item 1): the table's numbers against results.json computed here, grouping of
seeds, the figure looked at as a Figure and as a picture, the refusal of runs on different test sets, the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from experiments.compare import (BY_SEED, FIXED, CompareError, collect, compare, group_runs, series,
                                 table_rows, table_text)
from experiments.compare_plot import figure, save
from flcore.config import defaults

ROOT = Path(__file__).resolve().parent.parent


def head_commit() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def stack(commit: str, torch: str = "2.14.1") -> dict:
    return {"python": "3.11.7", "packages": {"flwr": "1.42.0", "torch": torch}, "device": "cpu",
            "lock": {"matches": True, "digest": "abc"}, "git": {"commit": commit, "dirty": False}}


def write_run(folder: Path, seed: int, acc: list[float], *, commit: str | None = None, local: list | None = None,
              worst: list | None = None, **config) -> Path:
    """A results.json as server_app/results.py writes it: every key, rounds with the given accuracies, a loss
    and a time derived from them."""
    rc = {**defaults(), "seed": seed, "out-dir": str(folder), **config}
    rounds = []
    for i, a in enumerate(acc, 1):
        row = {"round": i, "global_accuracy": a, "global_loss": 2.0 - a - 0.01 * seed,
               "wall_time_s": 1.0 + 0.1 * i + 0.05 * seed, "bytes_sent": 1000, "bytes_received": 900,
               "failures": [], "strategy": {}}
        if local is not None:
            row["local_accuracy"] = local[i - 1]
        if worst is not None:
            row["client_accuracy_worst"] = worst[i - 1]
        rounds.append(row)
    folder.mkdir(parents=True, exist_ok=True)
    doc = {"run_config": rc, "rounds": rounds, "final": {"num_clients": 10},
           "stack": stack(commit or head_commit())}
    (folder / "results.json").write_text(json.dumps(doc))
    return folder


ACC = {  # (method, seed) -> G-FL accuracy per round
    ("fedavg", 0): [0.50, 0.70, 0.85, 0.84], ("fedavg", 1): [0.40, 0.75, 0.80, 0.90],
    ("fedavg", 2): [0.55, 0.60, 0.79, 0.83],
    ("fedprox", 0): [0.30, 0.50, 0.60, 0.82], ("fedprox", 1): [0.35, 0.45, 0.70, 0.81],
}


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    for (method, seed), acc in ACC.items():
        extra = {"fedprox.mu": 0.1} if method == "fedprox" else {}
        write_run(tmp_path / "runs" / f"{method}-s{seed}", seed, acc, method=method, **extra)
    return tmp_path / "runs"


def expected_row(files: list[Path], target: float = 0.8) -> dict[str, str]:
    """Final, best, rounds to target and s/round as mean ± sample std, computed from the files directly."""
    docs = [json.loads(f.read_text()) for f in files]
    final = [100 * d["rounds"][-1]["global_accuracy"] for d in docs]
    best = [100 * max(r["global_accuracy"] for r in d["rounds"]) for d in docs]
    reach = [next(r["round"] for r in d["rounds"] if r["global_accuracy"] >= target) for d in docs]
    time = [sum(r["wall_time_s"] for r in d["rounds"]) / len(d["rounds"]) for d in docs]

    def ms(v: list[float], dec: int) -> str:
        return f"{np.mean(v):.{dec}f} ± {np.std(v, ddof=1):.{dec}f}"

    return {"final": ms(final, 2), "best": ms(best, 2), "reach": ms(reach, 1), "time": ms(time, 2)}


def test_table_numbers_equal_results_json(runs_dir):
    groups = compare([runs_dir])
    assert [g.label for g in groups] == ["fedavg-s0 +2", "fedprox-s0 +1"]
    rows = {r[0]: r for r in table_rows(groups)}
    for label, method in (("fedavg-s0 +2", "fedavg"), ("fedprox-s0 +1", "fedprox")):
        files = sorted(runs_dir.glob(f"{method}-s*/results.json"))
        want = expected_row(files)
        row = rows[label]
        assert row[3] == want["final"] and row[4] == want["best"] and row[6] == want["time"]
        assert row[5] == want["reach"] + " (≥80%)"
    assert rows["fedavg-s0 +2"][1] == "0,1,2" and rows["fedprox-s0 +1"][1] == "0,1"
    # the setting column names what differs between the groups: the method (and fedprox's own key)
    assert rows["fedavg-s0 +2"][7] == "method=fedavg"
    assert rows["fedprox-s0 +1"][7] == "method=fedprox"
    # the terminal table and the Markdown table carry the same cells
    text, md = table_text(groups), table_text(groups, markdown=True)
    for row in rows.values():
        assert re.search(r"\s{2,}".join(re.escape(c) for c in row), text)
        assert "| " + " | ".join(row) + " |" in md
    assert "stack [1]: python 3.11.7, flwr 1.42.0, torch 2.14.1, device cpu, the lock (abc)" in text


def test_rounds_to_target_counts_runs_that_never_reach_it(runs_dir):
    groups = compare([runs_dir])
    rows = {r[0]: r for r in table_rows(groups, target=0.86)}
    # fedavg: only seed 1 reaches 0.86 (round 4); fedprox: neither seed
    assert rows["fedavg-s0 +2"][5] == "4.0 (2 never) (≥86%)"
    assert rows["fedprox-s0 +1"][5] == "– (≥86%)"


def test_seeds_group_and_keys_that_do_not_change_numbers_are_ignored(tmp_path):
    write_run(tmp_path / "a", 0, [0.5, 0.6], **{"data-root": "/data1", "device": "cpu", "engine": "ray"})
    write_run(tmp_path / "b", 1, [0.4, 0.7], **{"data-root": "/data2", "device": "cuda", "checkpoint": False,
                                                  "fedrane.lra-topk": 7})  # another method's key: not read
    write_run(tmp_path / "c", 0, [0.3, 0.4], lr=0.1)
    groups = group_runs(collect([tmp_path / "a", tmp_path / "b", tmp_path / "c", tmp_path / "a"]))
    assert [(g.label, g.seeds) for g in groups] == [("a +1", [0, 1]), ("c", [0])]
    rows = table_rows(groups)
    assert [r[7] for r in rows] == ["lr=0.03", "lr=0.1"]
    rounds, mean, low, high = series(groups[0], "global_accuracy")
    assert rounds.tolist() == [1, 2]
    np.testing.assert_allclose(mean, [0.45, 0.65])
    np.testing.assert_allclose(low, [0.4, 0.6])
    np.testing.assert_allclose(high, [0.5, 0.7])
    _, mean, low, high = series(groups[0], "global_accuracy", band="std")
    np.testing.assert_allclose(high - mean, [0.05, 0.05])
    np.testing.assert_allclose(mean - low, [0.05, 0.05])


def test_runs_latest_and_its_target_are_one_run(runs_dir):
    (runs_dir / "latest").symlink_to(runs_dir / "fedavg-s0")
    runs = collect([runs_dir / "fedavg-s0", runs_dir / "latest"])
    assert len(runs) == 1


def write_experiment(root: Path, name: str, marker: bool, seeds=(0, 1), **config) -> Path:
    exp = root / name
    exp.mkdir(parents=True)
    (exp / "experiment.toml").write_text(f'[experiment]\nname = "{name}"\n')
    if marker:
        (exp / "test_split.json").write_text("{}")
    for label, method in (("fedavg", "fedavg"), ("fedprox", "fedprox")):
        for s in seeds:
            write_run(exp / label / f"seed{s}", s, ACC[(method, s)], method=method, **config)
    # a tuning trial (no test evaluation) is not a reported run
    write_run(exp / "tuning" / "fedavg" / "lr=0.1", 100, [0.1, 0.2], method="fedavg")
    return exp


def test_experiment_folders_are_read_by_label_and_seed(tmp_path):
    exp = write_experiment(tmp_path, "exp1", marker=True)
    groups = compare([exp])
    assert [(g.label, g.seeds) for g in groups] == [("exp1/fedavg", [0, 1]), ("exp1/fedprox", [0, 1])]
    assert all(r.split == FIXED for g in groups for r in g.runs)
    # one label's folder, and the tuning trials when named
    assert [g.label for g in compare([exp / "fedprox"])] == ["exp1/fedprox"]
    assert [g.seeds for g in compare([exp / "tuning"])] == [[100]]


@pytest.mark.parametrize("change, key", [
    ({"dataset": "digits"}, "dataset"),
    ({"global-test-fraction": 0.3}, "global-test-fraction"),
])
def test_runs_on_different_test_sets_are_refused_naming_runs_and_key(tmp_path, change, key):
    a = write_run(tmp_path / "a", 0, [0.5])
    b = write_run(tmp_path / "b", 0, [0.5], **change)
    with pytest.raises(CompareError) as err:
        compare([a, b])
    msg = str(err.value)
    assert str(a) in msg and str(b) in msg and f"{key} is" in msg


def test_torchvision_test_set_ignores_data_root_and_fraction(tmp_path):
    a = write_run(tmp_path / "a", 0, [0.5], dataset="fmnist", **{"data-root": "/x"})
    b = write_run(tmp_path / "b", 1, [0.6], dataset="fmnist", **{"data-root": "/y", "global-test-fraction": 0.3})
    # the official test set: no refusal (two groups: global-test-fraction is a key of the config)
    assert [g.seeds for g in compare([a, b])] == [[0], [1]]


def test_the_test_split_before_issue_31_followed_the_seed(tmp_path):
    old = write_experiment(tmp_path, "old", marker=False)
    new = write_experiment(tmp_path, "new", marker=True)
    with pytest.raises(CompareError, match="test split is 'fixed per dataset' vs 'drawn with the run seed"):
        compare([new, old])
    with pytest.raises(CompareError, match="seed is 0 vs 1"):
        compare([old])  # seeds 0 and 1 of an old experiment were tested on different images
    assert [g.label for g in compare([old / "fedavg" / "seed0", old / "fedprox" / "seed0"])] == \
        ["old/fedavg", "old/fedprox"]
    # a lone run tells by its stack's commit: the fix's parent predates it
    parent = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "3d987425f2e9^"], capture_output=True,
                            text=True, check=True).stdout.strip()
    before = write_run(tmp_path / "before", 0, [0.5], commit=parent)
    after = write_run(tmp_path / "after", 0, [0.5])
    assert [r.split for r in collect([before, after])] == [BY_SEED, FIXED]
    with pytest.raises(CompareError, match="test split is"):
        compare([before, after])


def test_no_run_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match="no results.json in this folder or below it"):
        compare([tmp_path / "empty"])
    with pytest.raises(CompareError, match="no such run folder"):
        compare([tmp_path / "missing"])


def test_figure_panels_legend_lines_and_bands(tmp_path):
    for s in (0, 1):
        write_run(tmp_path / f"p{s}", s, [0.5 + 0.1 * s, 0.6], local=[0.7, 0.8 + 0.01 * s], worst=[0.2, 0.3])
    write_run(tmp_path / "q", 0, [0.2, 0.3], lr=0.1)
    groups = compare([tmp_path])
    fig = figure(groups)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    titles = [ax.get_title() for ax in axes]
    assert [t.split(" (")[0] for t in titles] == ["G-FL accuracy", "G-FL loss", "P-FL accuracy",
                                                   "fairness: global model on its worst client"]
    assert all(ax.get_xlabel() == "round" for ax in axes)
    assert [ax.get_ylabel() for ax in axes] == ["accuracy", "loss", "accuracy", "accuracy"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["p0 +1 (2 seeds)", "q (1 seed)"]
    assert "band: min–max over seeds" in fig._suptitle.get_text() and "mnist-5k" in fig._suptitle.get_text()
    acc = axes[0]
    lines = {ln.get_label(): ln for ln in acc.get_lines()}
    np.testing.assert_allclose(lines["p0 +1 (2 seeds)"].get_ydata(), [0.55, 0.6])
    np.testing.assert_allclose(lines["q (1 seed)"].get_ydata(), [0.2, 0.3])
    bands = acc.collections  # one band: the group with two seeds
    assert len(bands) == 1
    ys = bands[0].get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(0.5) and ys.max() == pytest.approx(0.6)
    # the P-FL panel has only the group that recorded it
    assert [ln.get_label() for ln in axes[2].get_lines()] == ["p0 +1 (2 seeds)"]

    png, svg = save(fig, tmp_path / "out" / "cmp.png", svg=True)
    import matplotlib.image as mpimg

    img = mpimg.imread(png)
    w, h = fig.get_size_inches() * 100
    assert img.shape[:2] == (round(h), round(w))
    x0, y0, x1, y1 = (int(v) for v in acc.get_window_extent().extents)
    area = img[img.shape[0] - y1:img.shape[0] - y0, x0:x1, :3]  # image rows count from the top
    ink = (area < 0.95).any(axis=2).mean()
    assert 0.02 < ink < 0.9  # curves, band, grid and spines: neither blank nor filled
    from matplotlib.colors import to_rgb

    color = np.array(to_rgb(lines["q (1 seed)"].get_color()))
    assert (np.abs(area - color).sum(axis=2) < 0.1).sum() > 50  # the line is drawn in the panel, in its colour
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")


def test_repository_experiment_matches_its_files():
    """results/default-fedavg (5 seeds on the lock): the table against the files, read independently."""
    exp = ROOT / "results" / "default-fedavg"
    files = sorted((exp / "fedavg").glob("seed*/results.json"))
    groups = compare([exp])
    assert len(groups) == 1 and groups[0].seeds == [0, 1, 2, 3, 4]
    row = table_rows(groups)[0]
    want = expected_row(files)
    assert row[3] == want["final"] == "96.64 ± 0.34"
    assert (row[4], row[6]) == (want["best"], want["time"])


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "cli", "compare", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cli_prints_the_table_and_writes_the_figure(runs_dir, tmp_path):
    proc = cli(str(runs_dir / "fedavg-s0"), str(runs_dir / "fedavg-s1"), str(runs_dir / "fedprox-s0"),
               "--markdown", "--svg", "-o", "fig/c.png", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("| run | seeds | rounds | final G-FL % |")
    assert "| fedavg-s0 +1 | 0,1 |" in proc.stdout
    assert (tmp_path / "fig" / "c.png").stat().st_size > 10_000 and (tmp_path / "fig" / "c.svg").is_file()
    assert proc.stdout.rstrip().endswith("figure: fig/c.png, fig/c.svg")


def test_cli_refusal_is_one_line_and_exit_2(tmp_path):
    a = write_run(tmp_path / "a", 0, [0.5])
    b = write_run(tmp_path / "b", 0, [0.5], dataset="digits")
    proc = cli(str(a), str(b), cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("noniid-fl compare: error: runs ") and "dataset is" in lines[0]
    assert not (tmp_path / "compare.png").exists()


def test_cli_help_names_every_flag(tmp_path):
    proc = cli("--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: noniid-fl compare")
    for flag in ("RUN_OR_DIR", "--output", "--svg", "--markdown", "--band", "--target"):
        assert flag in proc.stdout


@pytest.mark.slow
def test_compare_real_runs_end_to_end(tmp_path):
    """`noniid-fl run` twice at two seeds and once with another lr, then `noniid-fl compare runs/...`: the
    table's cells equal the three results.json files, the figure is written."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    job = "dataset='digits' num-server-rounds=3 batch-size=16 target-accuracy=0.5"
    for name, extra in (("a0", "seed=0"), ("a1", "seed=1"), ("b0", "seed=0 lr=0.1")):
        proc = subprocess.run([sys.executable, "-m", "cli", "run", "--nodes", "3", "-c",
                               f"{job} {extra} out-dir='runs/{name}'"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    proc = cli("runs/a0", "runs/a1", "runs/b0", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    a_row = next(line for line in lines if line.startswith("a0 +1 "))
    b_row = next(line for line in lines if line.startswith("b0 "))
    want_a = expected_row(sorted((tmp_path / "runs").glob("a?/results.json")), target=0.5)
    want_b = {k: v.split(" ± ")[0] for k, v in expected_row([tmp_path / "runs" / "b0" / "results.json"] * 2,
                                                            target=0.5).items()}
    for row, want in ((a_row, want_a), (b_row, want_b)):
        assert want["final"] in row and want["best"] in row and want["time"] in row
    assert "lr=0.03" in a_row and "lr=0.1" in b_row and "0,1" in a_row
    assert (tmp_path / "compare.png").stat().st_size > 10_000
