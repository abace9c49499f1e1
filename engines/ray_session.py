"""The Ray processes one run starts: tagged, recorded, stopped when the run ends, reported when a killed run left some.

A run on a Ray instance it starts itself (:func:`engines.ray.run_ray` without ``ray_address``) goes through a
:class:`RaySession`:

- every process Ray starts for it (GCS, raylet, dashboard and runtime-env agents, the ClientApp actors)
  inherits the environment variable ``NONIID_FL_RAY_RUN=<token>`` from the driver, so the run's processes
  are found exactly (``/proc/<pid>/environ``, readable only for one's own processes: another user's Ray, or
  another run's, is never touched);
- Ray's files (logs, sockets) go to a private temp dir ``$RAY_TMPDIR|/tmp/nfl-<uid>-<token>``;
- a record ``<tmp>/noniid-fl-<uid>/ray-runs/<token>.json`` names the driver (pid and start time), the
  out-dir and the temp dir while the run is on.

When the run ends (normally, by an exception, or stopped by SIGINT/SIGTERM, see :class:`StopSignals`)
:meth:`RaySession.close` waits for Ray's own shutdown, then ends what is left of the run's processes
(SIGTERM, then SIGKILL) and removes the record and the temp dir. A run killed with SIGKILL cannot do that
(measured: Ray's dashboard and runtime-env agents outlive a killed driver by one to two minutes): the next
run's :func:`report_leftovers` finds the record of a driver that is gone, prints the processes still
carrying its token and the ``kill -KILL`` command that stops them, and keeps the record until none is left.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

log = logging.getLogger("noniid_fl")

TAG_VAR = "NONIID_FL_RAY_RUN"


def registry_dir() -> Path:
    """Where running sessions are recorded (per user)."""
    return Path(tempfile.gettempdir()) / f"noniid-fl-{os.getuid()}" / "ray-runs"


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), None if it is gone
    (or a zombie): with the pid it names one process (pids are reused)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def _command(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    return cmd if len(cmd) <= 100 else cmd[:97] + "..."


def tagged_processes(token: str) -> dict[int, str]:
    """pid -> command line of this user's live processes whose environment carries ``TAG_VAR=token``."""
    needle = f"{TAG_VAR}={token}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if needle in env.split(b"\0"):
            found[int(entry)] = _command(int(entry))
    return found


def end_processes(pids: Iterator[int] | list[int], grace_s: float = 3.0) -> list[int]:
    """SIGTERM ``pids``, SIGKILL those still there after ``grace_s``; returns the ones that survived both."""
    pids = list(pids)
    starts = {p: process_start(p) for p in pids}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in pids if starts[p] is not None and process_start(p) == starts[p]]
        for p in alive:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [p for p in alive if process_start(p) == starts[p]]
        pids = alive
    return pids


@dataclass
class Leftover:
    """Processes of an earlier run whose driver is gone."""

    record: Path
    driver_pid: int
    started: str
    out_dir: str
    processes: dict[int, str]

    def describe(self) -> str:
        lines = [f"noniid-fl: an earlier Ray run did not stop its processes (its driver, pid {self.driver_pid}, "
                 f"started {self.started}, is gone - killed?; out-dir {self.out_dir}):"]
        lines += [f"  pid {pid:<8} {cmd}" for pid, cmd in sorted(self.processes.items())]
        pids = " ".join(map(str, sorted(self.processes)))
        # -KILL: Ray's dashboard and runtime-env agents of a killed driver catch SIGTERM and stay (measured: >60 s)
        lines.append(f"  they are yours and that run's only; stop them with: kill -KILL {pids}")
        return "\n".join(lines)


def report_leftovers(stream: TextIO | None = None) -> list[Leftover]:
    """Print (to ``stream``, default stdout) the processes left by runs whose driver is gone; forget the runs
    that left none (their record and Ray temp dir are removed). Runs whose driver still runs are left alone."""
    leftovers = []
    folder = registry_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            rec = json.loads(path.read_text())
            token, pid, start = str(rec["token"]), int(rec["driver_pid"]), rec["driver_start"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"noniid-fl: unreadable Ray run record {path} ({exc!r}); remove it by hand", file=stream, flush=True)
            continue
        if process_start(pid) == start:
            continue  # that run is still going
        procs = tagged_processes(token)
        if procs:
            left = Leftover(path, pid, str(rec.get("started", "?")), str(rec.get("out_dir", "?")), procs)
            print(left.describe(), file=stream, flush=True)
            log.warning("%s", left.describe())
            leftovers.append(left)
        else:
            if rec.get("temp_dir"):
                shutil.rmtree(rec["temp_dir"], ignore_errors=True)
            path.unlink(missing_ok=True)
    return leftovers


class RaySession:
    """One run's Ray processes (see the module doc). ``with RaySession(out_dir) as s: ... s.init_args``."""

    def __init__(self, out_dir: str) -> None:
        self.token = uuid.uuid4().hex[:12]
        self.out_dir = out_dir
        base = Path(os.environ.get("RAY_TMPDIR") or "/tmp")
        self.temp_dir = base / f"nfl-{os.getuid()}-{self.token}"  # short: Ray's socket paths live under it
        self.record = registry_dir() / f"{self.token}.json"
        self._saved_tag: str | None = None
        self.left: list[int] = []  # pids that could not be stopped at close

    @property
    def init_args(self) -> dict[str, Any]:
        """Extra ``ray.init`` arguments for this session (Flower passes backend_config["init_args"] on)."""
        return {"_temp_dir": str(self.temp_dir)}

    def open(self) -> "RaySession":
        report_leftovers()
        self.record.parent.mkdir(parents=True, exist_ok=True)
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        rec = {"token": self.token, "driver_pid": os.getpid(), "driver_start": process_start(os.getpid()),
               "out_dir": self.out_dir, "temp_dir": str(self.temp_dir),
               "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        tmp.replace(self.record)
        self._saved_tag = os.environ.get(TAG_VAR)
        os.environ[TAG_VAR] = self.token
        return self

    def processes(self) -> dict[int, str]:
        return tagged_processes(self.token)

    def terminate(self) -> list[int]:
        """End this run's Ray processes now (SIGTERM, then SIGKILL); the pids that survived."""
        return end_processes(list(self.processes()))

    def close(self, wait_s: float = 1.0) -> None:
        """After the run: give Ray's shutdown ``wait_s`` to end the processes, end the rest, forget the run.

        (Measured: after ``ray.shutdown()`` the ClientApp actors' worker processes linger 8-9 s until they
        notice that their raylet is gone; Ray is down by then, so they are ended rather than waited for.)"""
        try:
            import ray

            if ray.is_initialized():  # Flower's backend shuts Ray down itself unless it failed before that
                ray.shutdown()
        finally:
            if self._saved_tag is None:
                os.environ.pop(TAG_VAR, None)
            else:
                os.environ[TAG_VAR] = self._saved_tag
        deadline = time.monotonic() + wait_s
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = self.processes()
        if left:
            log.info("ending this run's Ray processes still running after shutdown: %s", sorted(left.values()))
            self.left = self.terminate()
        if self.left:  # keep the record: the next run reports them
            print(f"noniid-fl: could not stop Ray processes {self.left} of this run", flush=True)
            return
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.record.unlink(missing_ok=True)

    def __enter__(self) -> "RaySession":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RunStopped(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT or SIGTERM); ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class StopSignals:
    """While active (main thread only): the first SIGINT/SIGTERM sets ``event`` - the run stops at its next
    message exchange - and, if the run has not ended ``grace_s`` later, calls ``on_timeout`` (end the Ray
    processes, so clients still training do not hold the run); a second signal raises KeyboardInterrupt at
    once. Elsewhere (another thread) it does nothing."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, on_timeout: Callable[[], Any], grace_s: float = 5.0) -> None:
        self.event = threading.Event()
        self.done = threading.Event()
        self.signum: int | None = None
        self.on_timeout = on_timeout
        self.grace_s = grace_s
        self._saved: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        if self.event.is_set():
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: stopping at once")
        self.signum = signum
        self.event.set()
        print(f"noniid-fl: {signal.Signals(signum).name} received: stopping the run and its Ray processes "
              "(send it again to stop at once)", flush=True)
        threading.Thread(target=self._watchdog, name="ray-stop-watchdog", daemon=True).start()

    def _watchdog(self) -> None:
        if not self.done.wait(self.grace_s):
            log.warning("the run did not stop within %.0fs of the signal: ending its Ray processes", self.grace_s)
            self.on_timeout()

    def install(self) -> None:
        """Put this object's handlers in place (again, after a library replaced them); the handlers found the
        first time are the ones restored at exit."""
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                previous = signal.signal(sig, self._handle)
                self._saved.setdefault(sig, previous)

    def __enter__(self) -> "StopSignals":
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()
