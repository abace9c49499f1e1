"""Run the tuning protocol of an experiment config (experiments/tuning.py) and write its choices.

    python -m experiments.tune experiments/configs/<name>.toml [--only fedavg fedprox] [--force]

Trials go to results/<name>/tuning/<label>/<trial>/ (finished ones are skipped unless --force, so an interrupted
tuning resumes where it stopped); the lr grid grows past an edge a choice sits on and a run whose knob is inert
gets make-up lr values (tuning.py's rules), until neither applies. The choices, the final grid and every trial's
validation score go to results/<name>/tuning.json. The exit code is non-zero if a trial failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import sys
import time
from pathlib import Path

from typing import Any

from experiments.parallel import run_jobs
from experiments.run import RESULTS_ROOT, is_complete, load_experiment, planned_config, run_one, sweep_progress
from experiments.tuning import (METRIC, TUNING_FILE, TuningPlan, choose, effective_budget, extend_grid, extend_knob,
                                growable, inert_knobs, knob_edges, makeup_lrs, mean_score, on_edge, score,
                                trial_name)

MAX_PASSES = 12  # grid growth is bounded by max-extend per side and make-up by the largest budget: a safety cap


def trial_dir(root: Path, label: str, trial: dict[str, Any], plan: TuningPlan, seed: int) -> Path:
    """The trial's folder on tuning seed ``seed``: the first seed's is the trial's own folder (as with a single
    tuning seed), each further seed's is seed=<s>/ inside it."""
    own = root / "tuning" / label / trial_name(trial)
    return own if seed == plan.seed else own / f"seed={seed}"


def trial_values(doc: dict[str, Any], plan: TuningPlan, root: Path, label: str,
                  trial: dict[str, Any], seed: int) -> dict[str, Any]:
    """The run config of one trial on one tuning seed: validation split, no test evaluation."""
    return {**doc["base"], **doc["runs"][label], **trial, "seed": seed,
            "validation-fraction": plan.validation_fraction, "test-evaluation": False, "pfl-eval-split": "validation",
            "out-dir": str(trial_dir(root, label, trial, plan, seed)), "checkpoint": False, "overwrite": True}


def num_partitions(doc: dict[str, Any]) -> int:
    """The experiment's federation size: the clients its splits are drawn over."""
    return int(doc["experiment"].get("num-supernodes", 10))


def finished(root: Path, label: str, trial: dict[str, Any], doc: dict[str, Any], plan: TuningPlan,
              seed: int) -> bool:
    """Whether the trial ran every round on tuning seed ``seed`` with the values planned now (a trial recorded
    with other values, e.g. before the config's base changed, runs again)."""
    values = trial_values(doc, plan, root, label, trial, seed)
    return is_complete(trial_dir(root, label, trial, plan, seed), planned_config(values), num_partitions(doc))


def _ran_now(root: Path, label: str, trial: dict[str, Any], plan: TuningPlan, seed: int, since: float) -> bool:
    """Whether this invocation wrote the trial's results on ``seed`` already (--force re-runs each once)."""
    f = trial_dir(root, label, trial, plan, seed) / "results.json"
    return f.exists() and f.stat().st_mtime >= since


def _seed_scores(root: Path, label: str, trial: dict[str, Any], doc: dict[str, Any],
                 plan: TuningPlan) -> list[float]:
    """The trial's validation score on each tuning seed; NaN where it did not finish every round (diverged)."""
    return [score(json.loads((trial_dir(root, label, trial, plan, s) / "results.json").read_text()), plan.last_rounds,
                  plan.metric(label))
            if finished(root, label, trial, doc, plan, s) else float("nan") for s in plan.seeds]


def _make_up(plan: TuningPlan, labels: list[str], scored: dict[str, list[tuple[dict[str, Any], float]]],
             chosen: dict[str, tuple[dict[str, Any], float]], makeup: dict[str, list[dict[str, Any]]],
             name: str) -> bool:
    """Add make-up lr trials to every run whose effective budget (inert knobs left out) is below the largest;
    True when some were added."""
    grids = {label: dict(plan.knobs.get(label, {})) for label in labels}
    inert = {label: inert_knobs(scored[label], list(grids[label]), plan.inert_tolerance) for label in labels}
    budget = {label: effective_budget(scored[label], inert[label]) for label in labels}
    target, added = max(budget.values()), False
    for label in labels:
        if budget[label] >= target or label not in chosen:
            continue
        active = [k for k in grids[label] if k not in inert[label]]
        per_lr = math.prod(len(grids[label][k]) for k in active)
        lrs = [t["lr"] for t, _ in scored[label]]
        new = makeup_lrs(lrs, chosen[label][0]["lr"], math.ceil((target - budget[label]) / per_lr))
        for value in new:
            for combo in itertools.product(*(grids[label][k] for k in active)):
                fixed = dict(zip(active, combo))
                makeup[label].append({"lr": value, **{k: fixed.get(k, grids[label][k][0]) for k in grids[label]}})
        if new:
            print(f"[budget] {name}/{label}: inert knob(s) {inert[label]}, effective budget {budget[label]} < "
                  f"{target}: make-up lr {new}", flush=True)
            added = True
    return added


def _grow_knobs(plan: TuningPlan, chosen: dict[str, tuple[dict[str, Any], float]],
                scored: dict[str, list[tuple[dict[str, Any], float]]],
                extended: dict[str, dict[str, dict[str, int]]], name: str) -> dict[str, dict[str, tuple]] | None:
    """The runs' knob grids with one value added beyond each edge a run's chosen knob value sits on
    (tuning.extend_knob) while the score still rises towards it: the choice scores strictly above the same
    trial with the knob at the edge's neighbour (on a plateau a further value changes nothing), and the knob is
    not inert for the run (its values move no score by more than inert-tolerance: its "choice" is noise); None
    when none grew."""
    knobs = {label: dict(grids) for label, grids in plan.knobs.items()}
    grew = False
    for label, (values, best) in chosen.items():
        for key, grid in list(knobs.get(label, {}).items()):
            if not growable(grid) or values.get(key) not in knob_edges(grid):
                continue
            if inert_knobs(scored[label], [key], plan.inert_tolerance):  # no choice made: nothing to grow for
                continue
            ordered = sorted(grid)
            inner = ordered[1] if values[key] == ordered[0] else ordered[-2]
            neighbour = [s for t, s in scored[label] if t == {**values, key: inner}]
            if neighbour and math.isfinite(neighbour[0]) and not best > neighbour[0]:
                continue
            new = extend_knob(key, grid, values[key], extended[label].setdefault(key, {}), plan.max_extend)
            if new is not None:
                print(f"[grid] {name}/{label}: {key}={values[key]} sits on an edge of its grid {list(grid)}; grid "
                      f"now {list(new)}", flush=True)
                knobs[label][key] = new
                grew = True
    return knobs if grew else None


def _trial_record(trial: dict[str, Any], per_seed: list[float], plan: TuningPlan) -> dict[str, Any]:
    """A trial's entry in tuning.json: its values, its score (tuning.mean_score) and, with several tuning seeds,
    each seed's."""
    mean = mean_score(per_seed)
    out: dict[str, Any] = {"values": trial, "val_score": mean if math.isfinite(mean) else None}
    if len(plan.seeds) > 1:
        out["val_scores"] = {str(s): v if math.isfinite(v) else None for s, v in zip(plan.seeds, per_seed)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--only", nargs="*", help="run labels to tune (default: all)")
    ap.add_argument("--force", action="store_true", help="re-run finished trials")
    ap.add_argument("--workers", type=int, default=1,
                    help="trials run at once, one process each (experiments/parallel.py; default 1: in order, here)")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")

    doc = load_experiment(args.config)
    plan = doc["tuning"]
    if plan is None:
        print(f"{args.config}: no [tuning] table", file=sys.stderr)
        return 2
    exp = doc["experiment"]
    name = exp["name"]
    root = RESULTS_ROOT / name
    labels = [lb for lb in doc["runs"] if not args.only or lb in args.only]
    grid, extended = tuple(plan.lr), {"low": 0, "high": 0}
    initial_knobs = {label: dict(plan.knobs.get(label, {})) for label in labels}
    knob_extended: dict[str, dict[str, dict[str, int]]] = {label: {} for label in labels}
    makeup: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    failed: list[str] = []
    diverged: list[str] = []  # this invocation's; a diverged trial has an unfinished results.json and reruns
    t0 = time.time()
    progress = {"done": 0, "total": 0}  # trials run (or given up) so far, and planned so far

    def given_up(key: tuple[str, dict[str, Any], int]) -> bool:
        """A trial that failed or diverged on another seed scores NaN: its other seeds need not run (asked with
        one worker, just before a trial starts)."""
        gone = f"{key[0]}/{trial_name(key[1])}" in failed + diverged
        if not gone:
            print(f"{sweep_progress(progress['done'], progress['total'], time.time() - t0)} tune {name}/{key[0]} "
                  f"{key[1]}" + (f" seed {key[2]}" if len(doc['tuning'].seeds) > 1 else ""), flush=True)
        return gone

    for _ in range(MAX_PASSES):  # each pass: run what is missing, then grow the grid or make up a budget
        trials = {label: plan.trials(label, grid) + makeup[label] for label in labels}
        todo = [(label, t, s) for label in labels for t in trials[label] for s in plan.seeds
                if f"{label}/{trial_name(t)}" not in failed + diverged
                and (args.force and not _ran_now(root, label, t, plan, s, t0)
                     or not finished(root, label, t, doc, plan, s))]
        progress["total"] = progress["done"] + len(todo)
        if args.workers > 1 and todo:
            print(f"{sweep_progress(progress['done'], progress['total'], time.time() - t0)} tune {name}: "
                  f"{len(todo)} trials in {min(args.workers, len(todo))} processes", flush=True)
        jobs = [((label, trial, seed), trial_values(doc, plan, root, label, trial, seed))
                for label, trial, seed in todo]
        work = functools.partial(run_one, num_partitions=num_partitions(doc))
        for (label, trial, seed), outcome in run_jobs(jobs, work, args.workers, given_up):
            progress["done"] += 1
            if outcome is None or outcome[0] == "ok":
                continue
            if outcome[0] == "diverged":  # too few usable updates: the trial diverged, it scores NaN
                print(f"[diverged] {name}/{label} {trial} seed {seed}: {outcome[1][:200]}", flush=True)
                diverged.append(f"{label}/{trial_name(trial)}")
            else:  # report at the end, keep tuning the others
                print(outcome[1], file=sys.stderr, flush=True)
                failed.append(f"{label}/{trial_name(trial)}")
        per_seed = {label: [_seed_scores(root, label, t, doc, plan) for t in trials[label]] for label in labels}
        # a trial's score: its mean over the tuning seeds (tuning.mean_score; NaN never wins)
        scored = {label: [(t, mean_score(p)) for t, p in zip(trials[label], per_seed[label])] for label in labels}
        chosen = {}
        for label in labels:
            try:
                chosen[label] = choose(scored[label])
            except Exception as exc:  # noqa: BLE001
                print(f"{name}/{label}: {exc}", file=sys.stderr)
        grown = extend_grid(grid, [c[0]["lr"] for c in chosen.values()], extended, plan.max_extend)
        if grown is not None:
            print(f"[grid] {name}: a choice sits on an edge of lr grid {list(grid)}; grid now {list(grown)}",
                  flush=True)
            grid = grown
            continue
        knobs = _grow_knobs(plan, chosen, scored, knob_extended, name)
        if knobs is not None:
            plan = dataclasses.replace(plan, knobs=knobs)
            continue
        if not _make_up(plan, labels, scored, chosen, makeup, name):
            break
    summary = json.loads((root / TUNING_FILE).read_text()) if (root / TUNING_FILE).exists() else {"runs": {}}
    summary.update({"metric": f"mean {METRIC} over the last {plan.last_rounds} rounds"
                              + "".join(f"; {label}: {key}" for label, key in sorted(plan.metrics.items()))
                              + (f", averaged over {len(plan.seeds)} tuning seeds" if len(plan.seeds) > 1 else ""),
                    "seed": plan.seed, "seeds": list(plan.seeds),
                    "validation-fraction": plan.validation_fraction, "lr-grid": list(grid),
                    "lr-grid-initial": list(plan.lr), "lr-grid-extended": extended, "max-extend": plan.max_extend,
                    "inert-tolerance": plan.inert_tolerance})
    for label in labels:
        if label not in chosen:
            failed.append(label)
            continue
        values, best = chosen[label]
        knobs = list(plan.knobs.get(label, {}))
        inert = inert_knobs(scored[label], knobs, plan.inert_tolerance)
        grids = plan.knobs.get(label, {})
        summary["runs"][label] = {
            "chosen": values, "val_score": best, "metric": plan.metric(label), "budget": len(scored[label]),
            "effective-budget": effective_budget(scored[label], inert), "inert-knobs": inert,
            "makeup-lr": sorted({t["lr"] for t in makeup[label]}), "on-edge": on_edge(grid, values["lr"]),
            # the lr grid this run was tuned on: runs tuned by separate `--only` invocations grow their own
            "lr-grid": list(grid), "lr-grid-extended": dict(extended),
            "knob-grids": {k: list(v) for k, v in grids.items()},
            "knob-grids-initial": {k: list(v) for k, v in initial_knobs[label].items()},
            "knob-on-edge": [k for k, v in grids.items() if growable(v) and values[k] in knob_edges(v)
                             and not (values[k] == min(v) == 0.0)],
            "trials": [_trial_record(t, p, plan) for t, p in zip(trials[label], per_seed[label])]}
        print(f"[chosen] {name}/{label}: {values} (validation {best:.4f}, {len(scored[label])} trials, "
              f"effective {summary['runs'][label]['effective-budget']}, inert {inert or 'none'})", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / TUNING_FILE).write_text(json.dumps(summary, indent=1))
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
