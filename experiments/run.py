"""Run an experiment config (runs x seeds) in local simulation.

    python -m experiments.run experiments/configs/baselines.toml [--seeds 0 1 2] [--only fedavg fedbc] [--force]

Config format (TOML):
    [experiment]
    name = "baselines-mnist5k"          # results go to results/<name>/<label>/seed<k>/
    title = "Baselines on mnist-5k"      # section title in docs/RESULTS.md
    description = "what is compared and how it mirrors the paper"
    seeds = [0, 1, 2]
    num-supernodes = 10
    [base]                               # run-config overrides shared by all runs
    dataset = "mnist-5k"
    [runs.fedavg]                        # one table row per label
    method = "fedavg"
    [runs.fedprox]
    method = "fedprox"
    fedprox.mu = 0.1                     # a method's keys are sectioned, as on `flwr run -c`
    [tuning]                             # optional: the tuning protocol (experiments/tuning.py); the runs
    lr = [0.01, 0.03, 0.1]               # then use the values `python -m experiments.tune` chose
Finished runs (a complete results.json) are skipped unless --force. A failing run is reported and the
others go on; the exit code is non-zero if any run failed.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import time
import tomllib
import traceback
from pathlib import Path
from typing import Any

from flwr.common.config import flatten_dict

from data_partitioning.federated import split_digest
from experiments.tuning import load_choices, parse_plan
from flcore.config import PROJECT_ROOT, ConfigError, RunConfig, resolve_run_config
from server_app.results import recorded_config_changes

RESULTS_ROOT = PROJECT_ROOT / "results"


def load_experiment(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"experiment config {path} does not exist")
    with path.open("rb") as fh:
        doc = tomllib.load(fh)
    exp = doc.get("experiment")
    if not isinstance(exp, dict) or "name" not in exp:
        raise ConfigError(f"{path}: needs an [experiment] table with a 'name'")
    if not doc.get("runs"):
        raise ConfigError(f"{path}: needs at least one [runs.<label>] table")
    # dotted keys (fedufo.losses = ...) are nested tables in TOML: flatten them the way Flower does, so that
    # a run's section keys add to the base's instead of replacing the whole section table
    doc["base"] = flatten_dict(doc.get("base", {}))
    doc["runs"] = {label: flatten_dict(over) for label, over in doc["runs"].items()}
    for label, over in doc["runs"].items():  # validate every run before spending compute
        try:
            RunConfig.from_dict(resolve_run_config({**doc["base"], **over}))
        except ConfigError as exc:
            raise ConfigError(f"{path}: run '{label}': {exc}") from None
    doc["tuning"] = parse_plan(doc["tuning"], list(doc["runs"]), str(path)) if "tuning" in doc else None
    if doc["tuning"] is not None:
        check_tuning_seed(doc["tuning"].seeds, exp.get("seeds", [0, 1, 2]), f"{path}: [experiment] seeds")
    return doc


def check_tuning_seed(tuning_seeds: tuple[int, ...], reported: list[int], where: str) -> None:
    """Refuse a tuning seed that is also a reported seed: the choice would be made on the very federation
    (partition, validation split, model initialisation) whose test accuracy is then reported."""
    for tuning_seed in tuning_seeds:
        if int(tuning_seed) in {int(s) for s in reported}:
            raise ConfigError(f"tuning seed {tuning_seed} ([tuning] seed/seeds) is also a reported seed ({where} = "
                              f"{sorted(int(s) for s in reported)}): tune on a seed that is not reported")


def tuned_runs(doc: dict[str, Any], root: Path, only: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Each run's overrides (of the ``only`` labels, if given), with the values its tuning chose
    (experiments/tuning.py) when the experiment has a [tuning] table: the reported runs train on all training
    data (no validation split)."""
    runs = {label: over for label, over in doc["runs"].items() if not only or label in only}
    if doc.get("tuning") is None:
        return runs
    chosen = load_choices(root, list(runs))
    return {label: {**over, **chosen[label]} for label, over in runs.items()}


SPLIT_MARKER = "test_split.json"


def write_split_marker(out_root: Path, doc: dict[str, Any]) -> None:
    """Record that this experiment's runs use the test split fixed per dataset (issue 31; the report marks
    experiments recorded before it, whose test split followed the run seed)."""
    from data_partitioning.federated import data_seed

    datasets = sorted({str(resolve_run_config({**doc["base"], **over})["dataset"]) for over in doc["runs"].values()})
    (out_root / SPLIT_MARKER).write_text(json.dumps(
        {"test-split": "fixed per dataset, independent of the run and tuning seeds",
         "data-seed": {name: data_seed(name) for name in datasets}}, indent=1) + "\n")


def run_dir(name: str, label: str, seed: int) -> Path:
    return RESULTS_ROOT / name / label / f"seed{seed}"


def planned_config(values: dict[str, Any]) -> RunConfig:
    """The parsed run config of one planned run (an experiment's run or a tuning trial): parsed once here."""
    return RunConfig.from_dict(resolve_run_config(values))


SPLIT_FILE = "client_split.json"  # beside results.json: the digest of the client split the run trained on


def write_split(path: Path, cfg: RunConfig, num_partitions: int) -> None:
    """Record the client split of the run just finished in ``path`` (data_partitioning.federated.split_digest)."""
    (path / SPLIT_FILE).write_text(json.dumps({"digest": split_digest(cfg, num_partitions),
                                               "num_partitions": num_partitions}) + "\n")


Outcome = tuple[str, str, dict[str, Any] | None]   # ("ok" | "diverged" | "failed", message, results.json or None)


def run_one(values: dict[str, Any], num_partitions: int, cpus_per_client: float = 1.0) -> Outcome:
    """Simulate one run config (run-config keys, ``out-dir`` included) and record its client split beside its
    results: ``("ok", "", results.json)``; ``("diverged", message, None)`` when too few clients' updates were usable
    (RoundFailed), ``("failed", traceback, None)`` when it raised: the caller reports it and runs the others."""
    from experiments.simulate import simulate
    from strategies.client_registry import RoundFailed

    try:
        doc = simulate(values, num_supernodes=num_partitions, cpus_per_client=cpus_per_client)
        write_split(Path(values["out-dir"]), planned_config(values), num_partitions)
        return "ok", "", doc
    except RoundFailed as exc:
        return "diverged", f"RoundFailed: {exc}", None
    except Exception:  # noqa: BLE001
        return "failed", traceback.format_exc(), None


def split_change(path: Path, cfg: RunConfig, num_partitions: int) -> str | None:
    """``"client split: recorded -> planned"`` when the run in ``path`` recorded a split other than the one
    ``cfg`` draws now over ``num_partitions`` clients (the partitioner or the data changed since); None when they
    agree or no split was recorded (runs from before the record existed: their commit tells)."""
    try:
        recorded = json.loads((path / SPLIT_FILE).read_text())["digest"]
    except (OSError, ValueError, KeyError):
        return None
    planned = split_digest(cfg, num_partitions)
    return None if recorded == planned else f"client split: {recorded} -> {planned}"


def is_complete(path: Path, cfg: RunConfig, num_partitions: int | None = None) -> bool:
    """Whether ``path`` holds a finished run of ``cfg``: a results.json with every planned round, recorded with
    ``cfg``'s values (server_app.results.recorded_config_changes: a run recorded with other values, e.g. before
    a tuning chose anew or a config file was edited, is not this run and is redone, not reported under it) and,
    given ``num_partitions``, on the client split ``cfg`` draws now (:func:`split_change`)."""
    f = path / "results.json"
    if not f.exists():
        return False
    try:
        finished = len(json.loads(f.read_text())["rounds"]) >= cfg.num_server_rounds
    except (ValueError, KeyError):
        return False
    return (finished and not recorded_config_changes(path, cfg)
            and (num_partitions is None or split_change(path, cfg, num_partitions) is None))


def sweep_progress(done: int, total: int, elapsed: float, width: int = 24) -> str:
    """``[#########...............] 3/8 runs, elapsed 4m10s, ETA 6m57s`` (ETA at the mean pace so far)."""
    from server_app.runner import clock

    filled = width * done // total if total else width
    eta = f", ETA {clock(elapsed / done * (total - done))}" if done else ""
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} runs, elapsed {clock(elapsed)}{eta}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--seeds", type=int, nargs="*")
    ap.add_argument("--only", nargs="*", help="run labels to run (default: all)")
    ap.add_argument("--force", action="store_true", help="re-run finished runs")
    ap.add_argument("--cpus-per-client", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=1,
                    help="runs at once, one process each (experiments/parallel.py; default 1: in order, here)")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    from experiments.parallel import run_jobs

    doc = load_experiment(args.config)
    exp = doc["experiment"]
    name = exp["name"]
    seeds = args.seeds if args.seeds is not None else exp.get("seeds", [0, 1, 2])
    if doc["tuning"] is not None:
        check_tuning_seed(doc["tuning"].seeds, seeds, "--seeds" if args.seeds is not None else "[experiment] seeds")
    out_root = RESULTS_ROOT / name
    out_root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.config, out_root / "experiment.toml")
    write_split_marker(out_root, doc)
    num_partitions = int(exp.get("num-supernodes", 10))
    jobs = []  # (label, seed, parsed run config) of every run still to do, in order
    for label, over in tuned_runs(doc, out_root, args.only).items():
        if args.only and label not in args.only:
            continue
        for seed in seeds:
            out = run_dir(name, label, seed)
            # overwrite: this runner decides what to redo (skip finished runs unless --force)
            values = {**doc.get("base", {}), **over, "seed": seed, "out-dir": str(out), "checkpoint": False,
                      "overwrite": True}
            cfg = planned_config(values)  # parsed once: simulate() runs this object
            if not args.force and is_complete(out, cfg, num_partitions):
                print(f"[skip] {name}/{label}/seed{seed} (done)")
                continue
            changes = recorded_config_changes(out, cfg) + [c for c in [split_change(out, cfg, num_partitions)] if c]
            if changes:
                print(f"[redo] {name}/{label}/seed{seed}: recorded with other values ({'; '.join(changes[:4])}"
                      f"{'; ...' if len(changes) > 4 else ''})", flush=True)
            jobs.append(((label, seed), values))
    failed: list[str] = []
    t_sweep = time.time()
    started = {"at": t_sweep, "done": 0}

    def announce(key: tuple[str, int]) -> bool:
        """Say which run starts (with one worker, just before it does); never skips one."""
        started["at"] = time.time()
        print(f"{sweep_progress(started['done'], len(jobs), started['at'] - t_sweep)} {name}/{key[0]}/seed{key[1]} ...",
              flush=True)
        return False

    if args.workers > 1 and len(jobs) > 1:
        print(f"{name}: {len(jobs)} runs in {min(args.workers, len(jobs))} processes", flush=True)
    work = functools.partial(run_one, num_partitions=num_partitions, cpus_per_client=args.cpus_per_client)
    for (label, seed), outcome in run_jobs(jobs, work, args.workers, announce):
        started["done"] += 1
        took = time.time() - (started["at"] if args.workers == 1 else t_sweep)
        assert outcome is not None  # announce never skips
        status, message, res = outcome
        if status == "ok" and res is not None:
            acc = res["final"].get("global_accuracy")
            print(f"[done] {name}/{label}/seed{seed}: G-FL {'not evaluated' if acc is None else f'{acc:.4f}'} "
                  f"in {took:.0f}s", flush=True)
        else:  # keep going, report at the end
            print(message, file=sys.stderr, flush=True)
            print(f"[FAILED] {name}/{label}/seed{seed} after {took:.0f}s", flush=True)
            failed.append(f"{label}/seed{seed}")
    if jobs:
        print(f"{sweep_progress(len(jobs), len(jobs), time.time() - t_sweep)} {len(jobs) - len(failed)} done, "
              f"{len(failed)} failed", flush=True)
    if failed:
        print(f"FAILED runs: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
