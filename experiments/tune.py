"""Run the tuning protocol of an experiment config (experiments/tuning.py) and write its choices.

    python -m experiments.tune experiments/configs/<name>.toml [--only fedavg fedprox] [--force]

Trials go to results/<name>/tuning/<label>/<trial>/ (finished ones are skipped unless --force); the choices,
with every trial's validation score, to results/<name>/tuning.json. The exit code is non-zero if a trial failed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

from experiments.run import RESULTS_ROOT, is_complete, load_experiment, sweep_progress
from experiments.tuning import METRIC, TUNING_FILE, choose, score, trial_name
from flcore.config import resolve_run_config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--only", nargs="*", help="run labels to tune (default: all)")
    ap.add_argument("--force", action="store_true", help="re-run finished trials")
    args = ap.parse_args(argv)

    from experiments.simulate import simulate

    doc = load_experiment(args.config)
    plan = doc["tuning"]
    if plan is None:
        print(f"{args.config}: no [tuning] table", file=sys.stderr)
        return 2
    exp = doc["experiment"]
    name = exp["name"]
    root = RESULTS_ROOT / name
    labels = [lb for lb in doc["runs"] if not args.only or lb in args.only]
    jobs = []
    for label in labels:
        for trial in plan.trials(label):
            out = root / "tuning" / label / trial_name(trial)
            values = {**doc["base"], **doc["runs"][label], **trial, "seed": plan.seed,
                      "validation-fraction": plan.validation_fraction, "test-evaluation": False,
                      "out-dir": str(out), "checkpoint": False, "overwrite": True}
            jobs.append((label, trial, out, values))
    failed, t0 = [], time.time()
    for i, (label, trial, out, values) in enumerate(jobs):
        rounds = int(resolve_run_config(values)["num-server-rounds"])  # the default when the config omits it
        if not args.force and is_complete(out, rounds):
            continue
        print(f"{sweep_progress(i, len(jobs), time.time() - t0)} tune {name}/{label} {trial}", flush=True)
        try:
            simulate(values, num_supernodes=int(exp.get("num-supernodes", 10)))
        except Exception:  # noqa: BLE001 - report at the end, keep tuning the others
            traceback.print_exc()
            failed.append(f"{label}/{trial_name(trial)}")
    summary = json.loads((root / TUNING_FILE).read_text()) if (root / TUNING_FILE).exists() else {"runs": {}}
    summary.update({"metric": f"mean {METRIC} over the last {plan.last_rounds} rounds", "seed": plan.seed,
                    "validation-fraction": plan.validation_fraction, "lr-grid": list(plan.lr)})
    for label in labels:
        trials = []
        for trial in plan.trials(label):
            f = root / "tuning" / label / trial_name(trial) / "results.json"
            s = score(json.loads(f.read_text()), plan.last_rounds) if f.exists() else float("nan")
            trials.append((trial, s))
        try:
            chosen, best = choose(trials)
        except Exception as exc:  # noqa: BLE001
            print(f"{name}/{label}: {exc}", file=sys.stderr)
            failed.append(label)
            continue
        summary["runs"][label] = {"chosen": chosen, "val_score": best, "budget": len(trials),
                                  "trials": [{"values": t, "val_score": s if math.isfinite(s) else None} for t, s in trials]}
        print(f"[chosen] {name}/{label}: {chosen} (validation {best:.4f}, {len(trials)} trials)", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / TUNING_FILE).write_text(json.dumps(summary, indent=1))
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
