"""End to end through simulate() on the in-process engine (the default), on Flower's Simulation Engine (Ray),
and through `flwr run . local` (the README's path)."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.simulate import simulate
from flcore.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _check_fedavg_run(doc: dict, out: Path) -> None:
    rounds = doc["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert doc["final"]["global_accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert rounds[-1]["global_loss"] < rounds[0]["global_loss"]
    assert all(r["num_updates"] == 4 and r["failures"] == [] for r in rounds)
    assert 0 <= rounds[-1]["local_accuracy_worst"] <= rounds[-1]["local_accuracy"] <= rounds[-1]["local_accuracy_best"] <= 1
    assert rounds[-1]["min_data_client_accuracy"] is not None and rounds[-1]["bytes_sent"] > 0
    for name in ("results.json", "metrics.csv", "accuracy.png", "final_model.pt", "checkpoint.pt"):
        assert (out / name).exists(), name
    assert json.loads((out / "results.json").read_text())["run_config"]["method"] == "fedavg"


FEDAVG = {"dataset": "digits", "num-server-rounds": 3, "lr": 0.1, "batch-size": 16, "dirichlet-alpha": 1.0,
          "local-test-fraction": 0.25, "federated-eval-every": 1}


def test_fedavg_learns_and_writes_results_on_the_default_inprocess_engine(tmp_path):
    out = tmp_path / "run"
    doc = simulate({**FEDAVG, "out-dir": str(out)}, num_supernodes=4)
    assert doc["run_config"]["engine"] == "inprocess" and doc["run_config"]["engine-workers"] == 1
    _check_fedavg_run(doc, out)
    with pytest.raises(ConfigError, match="gpus_per_client apply to engine 'ray' only"):
        simulate({**FEDAVG, "out-dir": str(out)}, num_supernodes=4, gpus_per_client=0.5)


@pytest.mark.slow
def test_fedavg_learns_and_writes_results_on_ray_through_the_command_line(tmp_path):
    """`noniid-fl run --engine ray` in a process of its own (also the suite's check of the command line's Ray
    path, which was a Ray run of its own in tests/test_cli_runs.py)."""
    from tests.test_cli_runs import _env

    out = tmp_path / "run"
    values = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in FEDAVG.items())
    proc = subprocess.run([sys.executable, "-m", "cli", "run", "--nodes", "4", "--engine", "ray", "-c",
                           f"{values} out-dir='{out}'"], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["run_config"]["engine"] == "ray"
    _check_fedavg_run(doc, out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, timeout: float) -> None:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(1)


def _superlinks(port: int) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"flower-superlink.*--port {port}"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@pytest.mark.slow
def test_flwr_run_local_end_to_end_and_superlink_is_stopped(tmp_path):
    port, control = _free_port(), _free_port()
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr"), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port), "FLWR_LOCAL_CONTROL_API_PORT": str(control),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = tmp_path / "out"
    # Start the simulation SuperLink the way `flwr run . local` does, but wait for it as long as needed
    # (flwr itself gives up after a fixed 15 s, which a loaded machine can exceed); `flwr run . local`
    # then finds it on its port and uses it.
    (tmp_path / "flwr").mkdir()
    link = subprocess.Popen(["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess",
                             "--host", "127.0.0.1", "--port", str(port), "--database", str(tmp_path / "link.db")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    cmd = ["flwr", "run", ".", "local", "--stream", "--federation-config",
           "num-supernodes=3 client-resources-num-cpus=1",
           "-c", f"dataset='digits' num-server-rounds=2 out-dir='{out}' federated-eval-every=0"]
    try:
        _wait_for_port(port, 300)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        doc = json.loads((out / "results.json").read_text())
        assert len(doc["rounds"]) == 2 and doc["final"]["num_clients"] == 3
        assert doc["final"]["global_accuracy"] > 0.1
    finally:
        _stop([link.pid] + _superlinks(port))
        link.wait(timeout=30)
    assert _superlinks(port) == []


def _stop(pids: list[int], grace: float = 20.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL what is left."""
    import time

    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace
    while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.5)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.5)
