"""Running things under measurement: a Flower simulation with per-round timestamps, a memory sampler
for the whole process tree (this process + Ray's GCS, raylet and worker processes), result files.

The Flower runs use ``experiments.simulate.simulate(engine="ray")`` (the engine ``flwr run . local``
uses), the in-process runs ``engines.run_local``. Round-end
times are taken from the round driver's progress line (observed: ``server_app.runner.observe_lines``), which is printed
after the round's aggregation, evaluation, results write and checkpoint, so the interval between two
round ends is the full cost of a round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from benchmarks.procfs import cpu_seconds, process_tree, pss_mib
from flcore.stack import stack_info

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# ------------------------------------------------------------------------------------- memory and CPU
def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds used so far by this process tree (the driver and every Ray process it started).

    On a machine shared with other jobs, wall time stretches with everyone else's load while CPU time
    counts only the work done for this run, so CPU-time ratios are the steadier measure of overhead.
    """
    me = os.getpid()
    if root not in (None, me):
        return sum(cpu_seconds(p) for p in process_tree(root))
    # this process and its reaped children from getrusage (microseconds, where /proc counts 10 ms ticks),
    # its live descendants from /proc
    own = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    return own + sum(cpu_seconds(p) for p in process_tree(me)[1:])


class MemorySampler:
    """Samples the PSS of this process tree every ``interval`` seconds in a background thread.

    ``series`` holds (time, driver MiB, whole tree MiB). The driver is this process: the ServerApp, the
    SuperLink state and the simulation engine's message queues live here; ClientApps run in Ray workers.
    """

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.series: list[tuple[float, float, float]] = []
        self.own_cpu: list[tuple[float, float]] = []  # (time, CPU seconds this sampler has used so far)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            pids = process_tree(me)
            driver = pss_mib(me)
            total = driver + sum(pss_mib(p) for p in pids if p != me)
            now = time.time()
            self.series.append((now, driver, total))
            self.own_cpu.append((now, time.thread_time()))
            self._stop.wait(self.interval)

    def cpu_until(self, t: float) -> float:
        """CPU seconds the sampler itself had used by time ``t`` (to subtract from process-tree CPU)."""
        used = 0.0
        for ts, c in self.own_cpu:
            if ts > t:
                break
            used = c
        return used

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, t_from: float = float("-inf"), t_to: float = float("inf")) -> dict[str, float | None]:
        pts = [(d, t) for ts, d, t in self.series if t_from <= ts <= t_to]
        if not pts:
            return {"driver_mib": None, "tree_mib": None}
        return {"driver_mib": max(d for d, _ in pts), "tree_mib": max(t for _, t in pts)}


# ------------------------------------------------------------------------------------- flower runs
def steady_bound_round(text: str) -> bool:
    """True for every progress line but the round lines of rounds 2 .. R-2 and R ("[round k/R] ..."): the
    lines whose CPU reading bounds the steady state, rounds 2 .. R-1 (round 1 pays the start-up, round R the
    run's final checkpoint)."""
    if not text.startswith("[round "):
        return True
    done, _, total = text[len("[round "):].partition("]")[0].partition("/")
    return done == "1" or (done.isdigit() and total.isdigit() and int(done) == int(total) - 1)


@contextlib.contextmanager
def round_clock(cpu_each_round: bool = True) -> Iterator[list[tuple[float, float | None, str]]]:
    """Record (time, process-tree CPU seconds, line) of every progress line of the round driver.

    Reading the tree's CPU scans /proc (about 0.8 ms on a quiet 2-core box): in a millisecond round that is
    a cost the measurement adds to the round it measures, diluting engine/plain ratios. With
    ``cpu_each_round=False`` it is read only on the lines of :func:`steady_bound_round` (rounds 1 and R-1,
    and lines that are not round lines); the others get None."""
    from server_app.runner import observe_lines

    lines: list[tuple[float, float | None, str]] = []

    def note(text: str) -> None:
        t = time.time()
        lines.append((t, tree_cpu_seconds() if cpu_each_round or steady_bound_round(text) else None, text))

    with observe_lines(note):
        yield lines


@contextlib.contextmanager
def exchange_clock() -> Iterator[list[dict]]:
    """Record every message exchange of the strategies: phase, number of messages, bytes, start, duration
    (an exchange observer, strategies/exchange.py ``observe_exchanges``)."""
    from strategies.exchange import observe_exchanges

    calls: list[dict] = []

    def note(r) -> None:
        calls.append({"phase": r.phase, "round": r.server_round, "messages": r.messages, "replies": r.replies,
                      "bytes_sent": r.bytes_sent, "bytes_received": r.bytes_received, "start": r.start,
                      "seconds": r.seconds})

    with observe_exchanges(note):
        yield calls


def run_flower(overrides: Mapping[str, Any], num_supernodes: int, total_cpus: int,
               cpus_per_client: float = 1.0, start_attempts: int = 3, cpu_each_round: bool = True) -> dict[str, Any]:
    """One simulation; returns t_start, round-end times, exchanges, the time the call returned, the doc
    (``cpu_each_round``: see :func:`round_clock`)."""
    from experiments.simulate import simulate

    for attempt in range(start_attempts):
        with round_clock(cpu_each_round) as lines, exchange_clock() as calls:
            t0, c0 = time.time(), tree_cpu_seconds()
            try:
                doc = simulate(dict(overrides), num_supernodes=num_supernodes, cpus_per_client=cpus_per_client,
                               total_cpus=total_cpus, engine="ray")
            except RuntimeError:
                # Ray gives its raylet a fixed 30 s to come up; on an overloaded machine it sometimes does
                # not. Retry a run that failed before its first round; anything later is a real failure.
                if any(text.startswith("[round ") for _, _, text in lines) or attempt + 1 == start_attempts:
                    raise
                time.sleep(5.0)
                continue
            t_end = time.time()
        break
    return {**_clocked(lines, calls, t0, c0, t_end, doc), "start_attempts": attempt + 1}


def run_inprocess(overrides: Mapping[str, Any], num_nodes: int, workers: int = 1,
                  cpu_each_round: bool = True) -> dict[str, Any]:
    """The in-process engine (engines.run_local: the real ServerApp, strategy and ClientApp through an
    in-process Grid; ``workers`` > 1: that many worker processes), with the same clocks as run_flower."""
    from engines.local import run_local

    with round_clock(cpu_each_round) as lines, exchange_clock() as calls:
        t0, c0 = time.time(), tree_cpu_seconds()
        doc = run_local(dict(overrides), num_nodes, engine="inprocess", workers=workers)
        t_end = time.time()
    return _clocked(lines, calls, t0, c0, t_end, doc)


def _clocked(lines: list[tuple[float, float | None, str]], calls: list[dict], t0: float, c0: float, t_end: float,
             doc: Any) -> dict[str, Any]:
    """What run_flower and run_inprocess return: the round ends (time, tree CPU) from the progress lines, the
    time every client had registered (the "N clients, R rounds ->" line), the exchanges and the doc."""
    rounds = [(t, c) for t, c, text in lines if text.startswith("[round ")]
    first = next((t for t, _, text in lines if " clients, " in text and "rounds ->" in text), None)
    return {"t_start": t0, "cpu_start": c0, "round_ends": [t for t, _ in rounds],
            "round_end_cpu": [c for _, c in rounds], "t_registered": first, "t_end": t_end, "doc": doc,
            "exchanges": calls}


# ------------------------------------------------------------------------------------- output
def machine() -> dict[str, Any]:
    import torch

    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "loadavg_at_start": list(load),
            "cuda": torch.cuda.is_available()}


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (what else ran beside a measurement on a shared machine)."""
    return list(os.getloadavg())


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    payload = {"benchmark": name, "written": time.strftime("%Y-%m-%d %H:%M:%S"), "stack": stack_info(), **payload}
    path.write_text(json.dumps(payload, indent=1, default=float))
    return path


def load_result(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


# ------------------------------------------------------------------------------------- command line
def parser(doc: str | None, summary: bool = False) -> argparse.ArgumentParser:
    """A benchmark's argument parser: ``doc`` (its module docstring) as the help text, kept as written, or
    with ``summary`` only its first paragraph."""
    if summary:
        return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def set_value(text: str) -> object:
    """A ``--set`` value: int, float, true/false, else the string."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def set_overrides(pairs: list[str]) -> dict[str, Any]:
    """``--set key=value ...``: run-config overrides with typed values (:func:`set_value`)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set expects key=value, got {pair!r}")
        out[key] = set_value(value)
    return out


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out
