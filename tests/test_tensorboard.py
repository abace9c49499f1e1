"""TensorBoard event files (issue 33 item 2): a real run with tensorboard = true writes every per-round scalar
of results.json, read back with TensorBoard's own EventAccumulator and compared value by value; off by
default; a resumed log purges the rounds written again; a clear refusal without the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flcore.config import ConfigError, resolve_run_config
from server_app.preflight import check
from server_app.tensorboard_log import SUBDIR, TensorBoardLog, tag_of

ROOT = Path(__file__).resolve().parent.parent
# a method with strategy statistics (FedRANE's GNE step) and P-FL / fairness rows (federated evaluation)
JOB = ("method='fedrane-no-lra' dataset='digits' num-server-rounds=2 batch-size=16 local-test-fraction=0.25 "
       "federated-eval-every=1")


def read_events(log_dir: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value, as TensorBoard reads the event files."""
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    acc = EventAccumulator(str(log_dir), size_guidance={TENSORS: 0})
    acc.Reload()
    return {tag: {ev.step: make_ndarray(ev.tensor_proto).item() for ev in acc.Tensors(tag)}
            for tag in acc.Tags()["tensors"]}


def numbers(row: dict) -> dict[str, float]:
    """column -> value of every number of a round row (strategy's as 'strategy.<key>'), but the round."""
    items = [(k, v) for k, v in row.items() if k not in ("round", "strategy")]
    items += [(f"strategy.{k}", v) for k, v in row["strategy"].items()]
    return {k: float(v) for k, v in items if isinstance(v, (bool, int, float))}


def run(tmp_path: Path, config: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "cli", "run", "--nodes", "3", "-c", config], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_run_writes_every_scalar_of_results_json(tmp_path):
    out = tmp_path / "tb-run"
    proc = run(tmp_path, f"{JOB} tensorboard=true out-dir='{out}'")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    events = read_events(out / SUBDIR)
    expected = {}
    for row in rounds:
        for column, value in numbers(row).items():
            expected.setdefault(tag_of(column), {})[row["round"]] = value
    assert events == expected  # every scalar, at its round, equal to results.json's value (double precision)
    # what the issue names is among them, under readable groups
    for tag in ("G-FL/global_accuracy", "G-FL/global_loss", "P-FL/local_accuracy", "fairness/client_accuracy_worst",
                "cost/wall_time_s", "cost/bytes_sent", "cost/bytes_received", "strategy/gne-weight-ratio",
                "strategy/gne-iterations"):
        assert sorted(events[tag]) == [1, 2], tag
    assert events["G-FL/global_accuracy"][2] == rounds[1]["global_accuracy"]
    assert events["strategy/gne-weight-ratio"][1] == rounds[0]["strategy"]["gne-weight-ratio"]
    # strings, lists and per-client maps are no scalars: not written
    assert "strategy/gne-status" not in events and "strategy/gne-weights" not in events

    plain = tmp_path / "plain"
    assert run(tmp_path, JOB.replace("num-server-rounds=2", "num-server-rounds=1") + f" out-dir='{plain}'").returncode == 0
    assert (plain / "results.json").is_file() and not (plain / SUBDIR).exists()  # off by default


def test_tags_group_the_columns():
    assert [tag_of(c) for c in ("global_accuracy", "val_loss", "local_accuracy_std", "client_accuracy_worst",
                                "min_data_client_accuracy", "wall_time_s", "bytes_sent", "num_updates",
                                "strategy.fedbc-lambda-mean", "sampled_fraction")] == [
        "G-FL/global_accuracy", "validation/val_loss", "P-FL/local_accuracy_std", "fairness/client_accuracy_worst",
        "fairness/min_data_client_accuracy", "cost/wall_time_s", "cost/bytes_sent", "counts/num_updates",
        "strategy/fedbc-lambda-mean", "other/sampled_fraction"]


def test_a_resumed_log_replaces_the_rounds_written_again(tmp_path):
    first = TensorBoardLog(tmp_path)
    for rnd in (1, 2, 3):
        first.add_round({"round": rnd, "global_accuracy": 0.1 * rnd, "strategy": {"x": rnd, "ok": True},
                         "failures": [], "local_accuracy": None})
    first.close()
    resumed = TensorBoardLog(tmp_path)  # resumed from the checkpoint of round 1
    for rnd in (2, 3):
        resumed.add_round({"round": rnd, "global_accuracy": 0.5 + rnd, "strategy": {"x": 10 * rnd}})
    resumed.close()
    events = read_events(tmp_path / SUBDIR)
    assert events["G-FL/global_accuracy"] == {1: 0.1, 2: 2.5, 3: 3.5}
    assert events["strategy/x"] == {1: 1.0, 2: 20.0, 3: 30.0}
    assert events["strategy/ok"][1] == 1.0  # a bool as 0/1
    assert "P-FL/local_accuracy" not in events  # None is no value


def test_asked_for_without_the_package_is_refused_naming_key_and_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    values = resolve_run_config({"tensorboard": True, "out-dir": str(tmp_path / "r")})
    with pytest.raises(ConfigError) as err:
        check(values)
    assert "'tensorboard'" in str(err.value) and "pip install 'noniid-fl[tensorboard]'" in str(err.value)
    check({**values, "tensorboard": False})  # off: nothing asked of the package


def test_the_command_line_refuses_it_before_any_engine(tmp_path):
    """In a process where `tensorboard` cannot be imported: exit 2, one line naming the key and the extra."""
    script = ("import sys, importlib.abc\n"
              "class Block(importlib.abc.MetaPathFinder):\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name.split('.')[0] == 'tensorboard': raise ModuleNotFoundError(name)\n"
              "sys.meta_path.insert(0, Block())\n"
              "import importlib.util\n"
              "_real = importlib.util.find_spec\n"
              "importlib.util.find_spec = lambda n, *a: None if n == 'tensorboard' else _real(n, *a)\n"
              "from cli.main import main\n"
              f"sys.exit(main(['run', '--nodes', '3', '-c', \"{JOB} tensorboard=true\"]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'tensorboard'" in lines[0] and "noniid-fl[tensorboard]" in lines[0]
    assert not (tmp_path / "runs").exists()


def test_the_run_closes_its_writer_when_it_ends(tmp_path):
    """The writer (and its thread) is closed at the run's end, also when a round raises, so a process that runs
    many federations (experiments.run) keeps none open."""
    from flcore.config import RunConfig, resolve_run_config
    from server_app import runner
    from server_app.tensorboard_log import TensorBoardLog
    from tests.fakegrid import FakeGrid

    closed = []
    real_close = TensorBoardLog.close

    def close(self):
        closed.append(self._writer is not None)
        real_close(self)

    cfg = RunConfig.from_dict(resolve_run_config({"dataset": "digits", "model": "mlp", "num-server-rounds": 1,
                                                  "tensorboard": True, "out-dir": str(tmp_path / "a"),
                                                  "checkpoint": False}))
    TensorBoardLog.close = close
    try:
        runner.run_federation(FakeGrid(3), cfg)
        assert closed == [True]  # opened by the round, closed at the end
        broken = RunConfig.from_dict(resolve_run_config({**cfg.to_dict(), "out-dir": str(tmp_path / "b")}))
        original = runner.round_row
        runner.round_row = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("round failed"))
        try:
            with pytest.raises(RuntimeError, match="round failed"):
                runner.run_federation(FakeGrid(3), broken)
        finally:
            runner.round_row = original
        assert closed == [True, False]  # closed although the run failed (before any round was written)
    finally:
        TensorBoardLog.close = real_close
