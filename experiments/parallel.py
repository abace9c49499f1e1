"""Independent jobs side by side: what ``experiments.run --workers N`` and ``experiments.tune --workers N`` use to
run N runs (or tuning trials) at once, one process each.

A job is a call ``work(values)`` of one run config (``experiments.run.run_one``: simulate it into its own output
folder), in a worker process of its own (``spawn``: nothing of the parent's torch or thread state is inherited),
so a job gives the same numbers as when run alone: a run's numbers depend on its config and seed, never on what
runs beside it (tests/test_parallel_runs.py). Results come back in the order jobs finish. One worker (the
default) runs every job in this process, one after another, as before.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
from typing import Any, Callable, Iterator, TypeVar

Key = TypeVar("Key")
Result = TypeVar("Result")


def run_jobs(jobs: list[tuple[Key, dict[str, Any]]], work: Callable[[dict[str, Any]], Result], workers: int = 1,
             skip: Callable[[Key], bool] | None = None) -> Iterator[tuple[Key, Result | None]]:
    """``(key, work(values))`` of every ``(key, values)`` job: in this process (``workers`` 1) in order, else in
    up to ``workers`` processes, as each finishes (``work`` must then be picklable: a module-level function or a
    functools.partial of one). With one worker, ``skip(key)`` is asked just before a job starts (``(key, None)``:
    not run), so a job can be dropped on what the ones before it showed."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or len(jobs) <= 1:
        for key, values in jobs:
            yield key, (None if skip is not None and skip(key) else work(values))
        return
    with cf.ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
        futures = {pool.submit(work, values): key for key, values in jobs}
        for future in cf.as_completed(futures):
            yield futures[future], future.result()
