"""Issue 20, items 4 and 5: crashed simulation workers, and the Ray processes a run starts.

Fast tests (no Ray started): the reply classification and grid wrappers of server_app/worker_watch.py and
engines/ray.py, the session record / leftover report / signal handling of engines/ray_session.py.

Real runs (``slow`` but the worker pool's; in subprocesses, ``noniid-fl run`` as an operator types it; the fault
comes from the fault-injecting ClientApps of tests/fault_apps.py, put in place of the real one):
- a client whose Ray worker dies (``os._exit``) in round 2: Ray replaces the worker, only that client fails
  round 2, every other client trains every round, exit 0 with the failure in results.json;
- every client's worker dies on every train message: round 1 cannot complete, exit 1;
- ``flwr run .`` (scripts/run_local.sh) with the crashing client: the run stops with WorkerLost, exit 1;
- the worker pool of the in-process engine with the same crashing client;
- SIGTERM in the middle of a run: exit 143 and none of the run's Ray processes left;
- SIGKILL: Ray processes are left, and the next ``noniid-fl run --engine ray`` reports them (that next run is
  the one whose every client crashes: one Ray start-up serves both tests, through module-scoped fixtures).
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode

from engines import ray_session
from engines.ray import RunInterrupted, StoppableGrid, backend_config
from engines.ray_session import (TAG_VAR, RaySession, StopSignals, end_processes, process_start, report_leftovers,
                                 tagged_processes)
from server_app.worker_watch import WorkerLost, WorkerWatchGrid, ray_failure
from tests.run_local_util import superlink_gone

ROOT = Path(__file__).resolve().parent.parent
JOB = "dataset='digits' batch-size=16 federated-eval-every=0"


# ----------------------------------------------------------------------------- replies of Flower's Ray engine
@pytest.fixture(autouse=True)
def _server_process_identity():
    from engines.local import server_identity

    with server_identity(1):  # what Flower sets in a ServerApp's process (messages take their run id from it)
        yield


def _instruction(node: int = 7, rnd: int = 2) -> Message:
    msg = Message(RecordDict({"config": ConfigRecord({"x": 1})}), dst_node_id=node, message_type="train",
                  group_id=str(rnd))
    msg.metadata.__dict__["_message_id"] = f"m{node}"
    return msg


def _flower_error_reply(exc: Exception, code: int = ErrorCode.UNKNOWN) -> Message:
    """The error reply Flower's engine (vce_api.worker) makes of an exception raised by the Ray backend."""
    msg = _instruction()
    reply = Message(Error(code=code, reason=str(type(exc)) + ":<'" + str(exc) + "'>"), reply_to=msg)
    reply.metadata.__dict__["_src_node_id"] = 7
    return reply


def _ray_errors() -> dict[str, Exception]:
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    return {"restarted": ActorUnavailableError("The actor is temporarily unavailable: IOError: The actor was "
                                               "restarted.", None),
            "dead": ActorDiedError()}


def test_ray_worker_failures_are_told_apart_from_client_errors():
    errors = _ray_errors()
    assert ray_failure(_flower_error_reply(errors["restarted"])) == "restarted"
    assert ray_failure(_flower_error_reply(errors["dead"])) == "dead"
    assert ray_failure(_flower_error_reply(RuntimeError("boom"))) is None  # not a Ray error
    assert ray_failure(_flower_error_reply(errors["dead"], code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION)) is None
    ok = Message(RecordDict({"metrics": MetricRecord({"a": 1.0})}), reply_to=_instruction())
    assert ray_failure(ok) is None


class _Replies:
    """A grid whose pull returns the given replies (for the wrappers)."""

    def __init__(self, replies):
        self.replies = replies
        self.pushed = []
        self.custom = "kept"

    def get_node_ids(self):
        return [7]

    def push_messages(self, messages):
        self.pushed += list(messages)
        return ["m7"]

    def pull_messages(self, ids):
        return list(self.replies)

    def send_and_receive(self, messages, *, timeout=None):
        return list(self.replies)


def test_a_replaced_worker_becomes_code_8_and_a_dead_one_stops_the_run():
    errors = _ray_errors()
    ok = Message(RecordDict({"metrics": MetricRecord({"a": 1.0})}), reply_to=_instruction())
    raised = _flower_error_reply(RuntimeError("the client's own bug"), code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION)
    grid = WorkerWatchGrid(_Replies([ok, _flower_error_reply(errors["restarted"]), raised]), resume_hint="/runs/a")
    got = list(grid.pull_messages(["m7"]))
    assert got[0] is ok and not got[0].has_error()
    assert got[1].error.code == ErrorCode.CLIENT_APP_CRASHED == 8
    reason = got[1].error.reason
    assert reason.startswith("the Ray worker process running this client died (ActorUnavailableError: The actor ")
    assert "IOError: The actor was restarted." in reason and "'>" not in reason
    assert reason.endswith("on the actor.); Ray replaced it and the message was tried at most twice")
    assert got[2].error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION and "own bug" in got[2].error.reason
    assert grid.replaced == 1 and grid.custom == "kept"  # other attributes reach the wrapped grid

    dead = WorkerWatchGrid(_Replies([_flower_error_reply(errors["dead"])]), resume_hint="/runs/a")
    with pytest.raises(WorkerLost, match=r"node 7, 'train' of round 2 died and was not replaced \(ActorDiedError"):
        dead.send_and_receive([_instruction()])
    with pytest.raises(WorkerLost, match=re.escape("resume-from='/runs/a'")):
        dead.pull_messages(["m7"])


def test_a_stop_request_ends_the_serverapp_at_its_next_grid_call():
    stop = threading.Event()
    inner = _Replies([])
    grid = StoppableGrid(inner, stop)
    assert list(grid.push_messages([_instruction()])) == ["m7"] and list(grid.get_node_ids()) == [7]
    stop.set()
    for call in (lambda: grid.push_messages([_instruction()]), lambda: grid.pull_messages(["m7"]),
                 grid.get_node_ids, lambda: grid.send_and_receive([])):
        with pytest.raises(RunInterrupted):
            call()
    assert len(inner.pushed) == 1


def test_actors_are_restartable_through_flowers_client_resources(monkeypatch):
    """Flower's own validation accepts the actor options and its pool creates every actor with them."""
    import flwr.simulation.ray_transport.ray_actor as ray_actor
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    cfg = backend_config(1.0, 0.25, {"num_cpus": 2})
    assert cfg == {"client_resources": {"num_cpus": 1.0, "num_gpus": 0.25, "max_restarts": -1, "max_task_retries": 1},
                   "init_args": {"num_cpus": 2}}
    backend = RayBackend.__new__(RayBackend)  # its __init__ would start Ray; only the validation is used
    backend.client_resources_key = "client_resources"
    resources = backend._validate_client_resources(cfg)
    created = []

    class Recorder:
        @classmethod
        def options(cls, **options):
            created.append(options)
            return cls

        @classmethod
        def remote(cls, **kwargs):
            return object()

    monkeypatch.setattr(ray_actor.ray, "nodes", lambda: [{"Resources": {"CPU": 2.0, "GPU": 1.0}}])
    pool = ray_actor.BasicActorPool(actor_type=Recorder, client_resources=resources, actor_kwargs={})
    pool.add_actors_to_pool(pool.actors_capacity)
    assert created == [{"num_cpus": 1.0, "num_gpus": 0.25, "max_restarts": -1, "max_task_retries": 1}] * 2


# ------------------------------------------------------------------------------------------ Ray sessions
@pytest.fixture
def registry(tmp_path, monkeypatch):
    folder = tmp_path / "reg"
    monkeypatch.setattr(ray_session, "registry_dir", lambda: folder)
    return folder


def _sleeping(proc: subprocess.Popen) -> subprocess.Popen:
    """``proc`` once it runs ``sleep`` (Popen returns after the fork: until the exec, /proc shows the parent's
    command line and environment, which a loaded machine made visible to the scans below); a hang guard, no budget."""
    deadline = time.monotonic() + 30
    while Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
        assert time.monotonic() < deadline, f"pid {proc.pid} did not exec sleep"
        time.sleep(0.01)
    return proc


def _tagged_sleeper(token: str) -> subprocess.Popen:
    return _sleeping(subprocess.Popen(["sleep", "120"], env={**os.environ, TAG_VAR: token}))


def _record(folder: Path, token: str, pid: int, start, temp_dir: Path | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{token}.json"
    path.write_text(json.dumps({"token": token, "driver_pid": pid, "driver_start": start, "out_dir": "/runs/x",
                                "temp_dir": str(temp_dir) if temp_dir else "", "started": "2026-01-02 03:04:05"}))
    return path


def _gone_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_leftovers_of_a_dead_driver_are_reported_until_they_are_gone(registry, tmp_path):
    sleeper = _tagged_sleeper("tokdead")
    try:
        temp = tmp_path / "raytmp"
        temp.mkdir()
        dead = _record(registry, "tokdead", _gone_pid(), 12345, temp)
        live = _record(registry, "toklive", os.getpid(), process_start(os.getpid()))  # a run still going
        out = io.StringIO()
        left = report_leftovers(out)
        assert [x.processes for x in left] == [{sleeper.pid: "sleep 120"}]
        text = out.getvalue()
        assert "an earlier Ray run did not stop its processes" in text and "out-dir /runs/x" in text
        assert f"pid {sleeper.pid}" in text and text.strip().endswith(f"stop them with: kill -KILL {sleeper.pid}")
        assert dead.exists() and live.exists() and temp.exists()  # reported again next time
    finally:
        sleeper.kill()
        sleeper.wait()
    out = io.StringIO()
    assert report_leftovers(out) == [] and out.getvalue() == ""
    assert not dead.exists() and not temp.exists()  # nothing left: the record and Ray's temp dir are removed
    assert live.exists()  # a running driver's record is never touched


def test_an_unreadable_record_is_named(registry):
    registry.mkdir(parents=True)
    (registry / "bad.json").write_text("{not json")
    out = io.StringIO()
    assert report_leftovers(out) == []
    assert f"unreadable Ray run record {registry / 'bad.json'}" in out.getvalue()


def test_ray_temp_dir_is_short_enough_for_rays_sockets(monkeypatch):
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    temp = RaySession("/runs/y").temp_dir
    assert temp.parent == Path("/tmp") and temp.name.startswith(f"nfl-{os.getuid()}-")
    sock = temp / "session_2026-11-23_14-49-15_207028_18177" / "sockets" / "plasma_store"
    assert len(str(sock)) < 107  # the Unix socket path limit


def test_a_session_tags_its_processes_and_ends_those_left_at_close(registry, monkeypatch, tmp_path):
    monkeypatch.delenv(TAG_VAR, raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    session = RaySession("/runs/y").open()
    rec = json.loads(session.record.read_text())
    assert rec["driver_pid"] == os.getpid() and rec["out_dir"] == "/runs/y" and os.environ[TAG_VAR] == session.token
    assert session.temp_dir.is_dir() and session.temp_dir.parent == tmp_path
    child = _sleeping(subprocess.Popen(["sleep", "120"]))  # inherits the tag, as Ray's processes do
    assert session.processes() == {child.pid: "sleep 120"}
    session.close(wait_s=0.5)
    assert child.wait(timeout=10) == -signal.SIGTERM
    assert TAG_VAR not in os.environ and not session.record.exists() and not session.temp_dir.exists()


def test_end_processes_escalates_to_sigkill():
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"],
                                stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "ready"
    assert end_processes([stubborn.pid], grace_s=0.5) == []
    assert stubborn.wait(timeout=10) == -signal.SIGKILL


def test_first_signal_asks_to_stop_and_calls_the_watchdog_second_interrupts():
    before = signal.getsignal(signal.SIGTERM)
    fired = threading.Event()
    with StopSignals(on_timeout=fired.set, grace_s=0.2) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.event.wait(5) and stop.signum == signal.SIGTERM
        assert fired.wait(5)  # the run did not end within grace_s: Ray's processes are ended
        with pytest.raises(KeyboardInterrupt, match="SIGINT again"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    assert signal.getsignal(signal.SIGTERM) is before


# ------------------------------------------------------------------------------------------- real runs
def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


class _Run:
    """``noniid-fl run --engine ray`` in a subprocess with ``app`` as the ClientApp; output collected as it comes."""

    CODE = ("import sys, engines.ray as r; r.DEFAULT_CLIENT_APP = sys.argv[1]; from cli.main import main; "
            "sys.exit(main(sys.argv[2:]))")

    def __init__(self, cwd: Path, app: str, nodes: int, config: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE, app, "run", "--engine", "ray", "--nodes",
                                      str(nodes), "-c", config], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, needle: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while needle not in self.text:
            assert self.proc.poll() is None, f"ended ({self.proc.returncode}) before {needle!r}:\n{self.text[-3000:]}"
            assert time.monotonic() < end, f"no {needle!r} within {timeout}s:\n{self.text[-3000:]}"
            time.sleep(0.2)

    def token(self, timeout: float = 120.0) -> str:
        """The run's Ray session token, from its record (driver pid = this subprocess)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for path in ray_session.registry_dir().glob("*.json"):
                try:
                    rec = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if rec.get("driver_pid") == self.proc.pid:
                    return rec["token"]
            assert self.proc.poll() is None, self.text[-3000:]
            time.sleep(0.2)
        raise AssertionError(f"no Ray session record for pid {self.proc.pid}")

    def finish(self, timeout: float = 600) -> int:
        rc = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return rc


def _assert_nothing_left(token: str) -> None:
    assert tagged_processes(token) == {}
    assert not (ray_session.registry_dir() / f"{token}.json").exists()
    assert not list(Path(os.environ.get("RAY_TMPDIR") or "/tmp").glob(f"nfl-{os.getuid()}-{token}"))


def _trained(row: dict) -> set[int]:
    return set(row["sampled"]) - {f["cid"] for f in row["failures"]}


@pytest.mark.slow
def test_a_crashed_ray_worker_is_replaced_and_only_its_client_fails_that_round(tmp_path):
    out = tmp_path / "crash"
    run = _Run(tmp_path, "tests.fault_apps:exit_in_round_2", 4, f"{JOB} num-server-rounds=3 out-dir='{out}'")
    token = run.token()
    assert run.finish() == 0, run.text[-4000:]
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    assert [r["num_updates"] for r in rounds] == [4, 3, 4]
    assert [_trained(r) for r in rounds] == [{0, 1, 2, 3}, {0, 2, 3}, {0, 1, 2, 3}]  # client 1 is back in round 3
    (failure,) = rounds[1]["failures"]
    assert (failure["cid"], failure["phase"], failure["kind"]) == (1, "train", "error")
    assert failure["reason"].startswith("code 8: the Ray worker process running this client died (")
    assert "Ray replaced it" in failure["reason"]
    assert "noniid-fl: run complete" in run.text and "client 1 failed" in (out / "run.log").read_text()
    _assert_nothing_left(token)  # a normal exit stops every Ray process of the run


@pytest.fixture(scope="module")
def sigkilled(tmp_path_factory):
    """A run SIGKILLed after its first round, and what it left: its processes (tagged with its token).

    What Ray itself leaves behind a killed driver varies (measured: its dashboard and runtime-env agents for 0
    to 2 minutes), so each actor of this run also starts a process that stays (tests.fault_apps:linger).
    Module-scoped: the run of :func:`unfinishable` is the next start that must report these processes (one Ray
    start-up less than a run of its own). Whatever the tests did not end is ended at the module's end."""
    tmp = tmp_path_factory.mktemp("sigkill")
    run = _Run(tmp, "tests.fault_apps:linger", 3, f"{JOB} num-server-rounds=500 out-dir='{tmp / 'killed'}'")
    token = run.token()
    try:
        run.wait_for("[round 1/500]", timeout=300)
    finally:
        run.proc.kill()
        run.finish()
    try:
        yield {"run": run, "token": token, "left": tagged_processes(token), "out": tmp / "killed"}
    finally:  # Ray's orphaned agents ignore SIGTERM (measured): a short grace before SIGKILL
        end_processes(list(tagged_processes(token)), grace_s=0.5)
        report_leftovers(io.StringIO())


@pytest.fixture(scope="module")
def unfinishable(tmp_path_factory, sigkilled):
    """``noniid-fl run --engine ray`` in which every client's worker dies on every train message (started after
    the :func:`sigkilled` run, whose processes are still there): (run, exit code, session token, out-dir)."""
    tmp = tmp_path_factory.mktemp("allcrash")
    out = tmp / "allcrash"
    run = _Run(tmp, "tests.fault_apps:exit_every_train", 2,
               f"{JOB} num-server-rounds=2 round-retries=0 out-dir='{out}'")
    token = run.token()
    return run, run.finish(), token, out


@pytest.mark.slow
def test_a_round_that_cannot_complete_exits_1(unfinishable):
    run, rc, token, out = unfinishable
    assert rc == 1, run.text[-4000:]
    last = run.text.strip().splitlines()[-2]
    assert last.startswith("noniid-fl: run failed") and "RoundFailed" in last and "min-train-replies=1" in last
    log = (out / "run.log").read_text()
    assert log.count("the Ray worker process running this client died") >= 2  # both clients, round 1
    _assert_nothing_left(token)


@pytest.mark.slow
def test_ray_processes_left_by_a_sigkilled_run_are_reported_at_the_next_start(sigkilled, unfinishable):
    """The next start is the run of :func:`unfinishable` (``noniid-fl run --engine ray``; the report comes
    from its session's start, before Ray starts, whatever the run then does)."""
    killed, token, left = sigkilled["run"], sigkilled["token"], sigkilled["left"]
    nxt = unfinishable[0]
    try:
        sleepers = {pid for pid, cmd in left.items() if cmd == "sleep 600"}
        assert sleepers, left  # one per actor that trained: they outlive the driver
        m = re.search(rf"an earlier Ray run did not stop its processes \(its driver, pid {killed.proc.pid}, started "
                      rf"[-\d: ]+, is gone - killed\?; out-dir {re.escape(str(sigkilled['out']))}\):\n(.*?)\n"
                      r"  they are yours and that run's only; stop them with: kill -KILL ([\d ]+)\n", nxt.text, re.S)
        assert m, nxt.text[:3000]
        listed = {int(p) for p in m.group(2).split()}
        assert sleepers <= listed <= set(left)  # only that run's processes (Ray's own may have ended meanwhile)
        assert all(f"pid {p}" in m.group(1) for p in listed)
    finally:  # Ray's orphaned dashboard and runtime-env agents ignore SIGTERM: SIGKILL after 0.5 s, not 3 s
        end_processes(list(tagged_processes(token)), grace_s=0.5)
    report_leftovers(io.StringIO())  # nothing left now: the record goes
    _assert_nothing_left(token)


@pytest.mark.slow
def test_sigterm_stops_the_run_and_every_ray_process_it_started(tmp_path):
    out = tmp_path / "term"
    run = _Run(tmp_path, "client_app.app:app", 3, f"{JOB} num-server-rounds=500 out-dir='{out}'")
    token = run.token()
    run.wait_for("[round 1/500]", timeout=300)
    assert tagged_processes(token)  # raylet, GCS, agents, actors
    sent = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=120) == 128 + signal.SIGTERM, run.text[-4000:]
    took = time.monotonic() - sent
    assert "SIGTERM received: stopping the run and its Ray processes" in run.text
    assert f"noniid-fl: stopped by SIGTERM; the rounds finished so far are in {out}" in run.text
    _assert_nothing_left(token)
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    assert 1 <= len(rounds) < 500 and took < 60


@pytest.mark.slow
def test_flwr_run_stops_with_worker_lost_when_a_worker_dies(tmp_path):
    """`flwr run .` cannot be told to restart actors: the run stops at the first dead worker and
    scripts/run_local.sh exits 1 and stops its SuperLink (a checkout of its own: the app's code, with the crashing
    ClientApp put in the client_app package, and the files run_local.sh uses; deploy.localfed.snapshot_app copies
    the code). Also tests/test_cli_runs.py's check of run_local.sh on a run that fails."""
    from deploy.localfed import snapshot_app

    app = snapshot_app(tmp_path / "app")  # pyproject.toml (without fab-exclude) and the packages it declares
    shutil.copy(ROOT / "tests" / "fault_apps.py", app / "client_app" / "fault_apps.py")
    (app / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "run_local.sh", app / "scripts")
    (app / "deploy").mkdir()  # run_local.sh may snapshot its checkout with it
    for name in ("__init__.py", "localfed.py", "connection.py"):
        shutil.copy(ROOT / "deploy" / name, app / "deploy" / name)
    toml = (app / "pyproject.toml").read_text()
    assert 'clientapp = "client_app.app:app"' in toml
    (app / "pyproject.toml").write_text(toml.replace('clientapp = "client_app.app:app"',
                                                     'clientapp = "client_app.fault_apps:exit_in_round_2"'))
    out = tmp_path / "flwr-out"
    env = {**_env(), "PYTHONPATH": str(app), "FLWR_HOME": str(tmp_path / "flwr")}
    proc = subprocess.run(["bash", str(app / "scripts" / "run_local.sh"), "4",
                           f"{JOB} num-server-rounds=3 out-dir='{out}'"], cwd=app, env=env, capture_output=True,
                          text=True, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-4000:]
    assert "'train' of round 2 died and was not replaced (ActorDiedError" in text
    assert f"Continue it with resume-from='{out}'" in text and "the run did not complete" in proc.stderr
    assert superlink_gone(proc.stdout)  # its SuperLink (and children) stopped after the failed run too
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    assert [r["round"] for r in rounds] == [1] and rounds[0]["num_updates"] == 4  # round 1 kept, checkpointed
    assert (out / "checkpoint.pt").exists()


@pytest.mark.slow
def test_the_worker_pool_replaces_a_crashed_worker_too(tmp_path):
    """The in-process engine's pool (engines/pool.py): the crashed client fails round 2 with code 8; a node
    queued behind it in the same worker fails with it (its Context lived in that worker); the others train.
    Slow tier: the replacement worker is a fresh process (4 s of imports)."""
    from engines.local import run_inprocess
    from flcore.config import resolve_run_config

    out = tmp_path / "pool"
    values = resolve_run_config({"dataset": "digits", "batch-size": 16, "federated-eval-every": 0,
                                 "num-server-rounds": 3, "out-dir": str(out)})
    run_inprocess(values, 4, workers=2, client_app="tests.fault_apps:exit_in_round_2")
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    assert _trained(rounds[0]) == _trained(rounds[2]) == {0, 1, 2, 3}
    failed = {f["cid"]: f for f in rounds[1]["failures"]}
    assert 1 in failed and len(failed) < 4 and rounds[1]["num_updates"] == 4 - len(failed)
    pid = re.search(r"engine worker \d+ \(pid (\d+)\) died with exit code 3", failed[1]["reason"]).group(1)
    assert all(f["reason"].startswith("code 8: ") and f"(pid {pid})" in f["reason"] for f in failed.values())
