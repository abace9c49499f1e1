"""Near-tie verdicts (issue 43 item 1): does a ledger verdict survive the tuning choices validation cannot tell
apart from the one it made?

**The rule.** For each tuned run (an arm of a claim), a trial is a *near tie* of the chosen one when its mean
deficit on validation, paired by tuning federation, is at most one standard error of that paired deficit:

    d_f = score(chosen, f) - score(trial, f)  for every tuning federation f both scored,
    near tie  <=>  mean(d) <= sd(d) / sqrt(n)     (n >= 2 federations)

With one tuning federation there is no paired noise to read (the FedBR row), so the rule falls back to a stated
margin: d <= ``ONE_FEDERATION_MARGIN`` (half a point of accuracy). A trial that scored NaN on any federation is
never a near tie. Each arm keeps at most ``MAX_CHOICES`` choices: the chosen one and the nearest ties (smallest
mean deficit first), so a row has at most 3 x 3 pairs.

**Runs.** The chosen trial is the experiment's reported run (results/<exp>/<label>/seed<k>/); every other choice
runs the same reported seeds on all training data, as the reported run does, into
results/<exp>/near-ties/<label>/<slug>/seed<k>/ (``python -m experiments.near_ties <config> [--only LABEL ...]``,
resumable like experiments.run).

**Verdict over the pairs.** experiments/claims.py pairs every baseline choice with every method choice (paired by
seed) and reads each pair's verdict off its interval; the row is *robust* when every pair gives the same word,
otherwise it says how many pairs give which; the headline word is the worst pair's (``WORST_FIRST``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ONE_FEDERATION_MARGIN = 0.005   # with a single tuning federation: a deficit of at most half a point
MAX_CHOICES = 3                 # per arm: the chosen trial and at most two near ties
NEAR_TIES_DIR = "near-ties"
CHECK_FILE = "chosen_check.json"   # the re-run check where the near-tie runs ran (the ledger's caveat reads it)
WORST_FIRST = ("contradicted", "inconclusive", "smaller than claimed", "reproduced")  # the headline is the first


@dataclass(frozen=True)
class Choice:
    values: dict[str, Any]     # the trial's tuned values (lr and the run's knobs)
    deficit: float             # mean paired validation deficit to the chosen trial (0 for the chosen one)
    se: float | None           # its standard error (None: one federation)
    chosen: bool

    @property
    def slug(self) -> str:
        return slug(self.values)


def slug(values: dict[str, Any]) -> str:
    """A folder name for a choice: ``lr=0.1,fedetf.alpha=0.5`` (keys sorted)."""
    return ",".join(f"{k}={values[k]:g}" if isinstance(values[k], float) else f"{k}={values[k]}"
                    for k in sorted(values))


def _scores(trial: dict[str, Any]) -> dict[str, float] | None:
    """Per-federation validation scores of a trial (a single federation: ``{"only": score}``); None when the
    trial scored NaN or nothing somewhere."""
    raw = trial.get("val_scores")
    if raw is None:
        raw = {"only": trial.get("val_score")}
    out = {}
    for fed, value in raw.items():
        if value is None or not math.isfinite(float(value)):
            return None
        out[str(fed)] = float(value)
    return out or None


def near_tie_choices(trials: list[dict[str, Any]], chosen: dict[str, Any],
                     max_choices: int = MAX_CHOICES) -> list[Choice]:
    """The chosen trial and its near ties (module docstring's rule), nearest first, at most ``max_choices``."""
    scored = [(t, _scores(t)) for t in trials]
    best = next((s for t, s in scored if t["values"] == chosen and s is not None), None)
    if best is None:
        raise ValueError(f"the chosen values {chosen} are not a scored trial")
    ties = []
    for trial, scores in scored:
        if scores is None or trial["values"] == chosen:
            continue
        feds = sorted(set(best) & set(scores))
        if not feds:
            continue
        d = [best[f] - scores[f] for f in feds]
        mean = statistics.fmean(d)
        if len(d) >= 2:
            se = statistics.stdev(d) / math.sqrt(len(d))
            tie = mean <= se
        else:
            se = None
            tie = mean <= ONE_FEDERATION_MARGIN
        if tie:
            ties.append(Choice(dict(trial["values"]), mean, se, False))
    ties.sort(key=lambda c: (c.deficit, c.slug))
    return [Choice(dict(chosen), 0.0, None, True), *ties[:max(max_choices - 1, 0)]]


def arm_choices(tuning: dict[str, Any], label: str) -> list[Choice]:
    """The choices of run ``label`` from an experiment's tuning.json document."""
    run = tuning["runs"][label]
    return near_tie_choices(run["trials"], run["chosen"])


def choice_dir(results_root: Path, experiment: str, label: str, choice: Choice) -> Path:
    """Where a choice's seeds live: the reported run's folder for the chosen one, near-ties/ for the others."""
    if choice.chosen:
        return results_root / experiment / label
    return results_root / experiment / NEAR_TIES_DIR / label / choice.slug


def load_tuning(results_root: Path, experiment: str) -> dict[str, Any] | None:
    path = results_root / experiment / "tuning.json"
    return json.loads(path.read_text()) if path.exists() else None


def pair_summary(words: list[str]) -> tuple[str, str]:
    """(headline word, summary) over the pairs' verdict words: robust when all agree, else the counts."""
    if not words:
        return "not run", "no pair run"
    headline = min(words, key=WORST_FIRST.index)
    if len(set(words)) == 1:
        return headline, f"robust ({len(words)} of {len(words)} pairs {headline})"
    counts = [f"{w} in {words.count(w)}" for w in WORST_FIRST if w in words]
    return headline, f"{', '.join(counts)} of {len(words)} pairs"


def main(argv: list[str] | None = None) -> int:
    from experiments.run import RESULTS_ROOT, is_complete, load_experiment, planned_config, write_split

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--only", nargs="*", help="run labels (default: every tuned run)")
    ap.add_argument("--seeds", type=int, nargs="*")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the choices and the runs still to do (with --check-chosen: the runs it would re-run), "
                         "run nothing")
    ap.add_argument("--check-chosen", action="store_true",
                    help="first re-run each arm's chosen trial at its first seed at today's code and record whether "
                         "it reproduces the reported run (near-ties/chosen_check.json): near-tie runs of today's "
                         "code pair with reported runs of an older commit only if it does")
    ap.add_argument("--check-file", default=CHECK_FILE,
                    help=f"the check's file in results/<exp>/{NEAR_TIES_DIR}/ (default {CHECK_FILE}: the check of the "
                         "machine the near-tie runs ran on, which the ledger's caveat reads; another name, "
                         "chosen_check.<what>.json, records a check elsewhere, e.g. on another CPU kernel level)")
    args = ap.parse_args(argv)
    if not (args.check_file.startswith("chosen_check") and args.check_file.endswith(".json")
            and "/" not in args.check_file):
        ap.error(f"--check-file must be a file name chosen_check[.<what>].json, got {args.check_file!r}")

    from experiments.simulate import simulate

    doc = load_experiment(args.config)
    name = doc["experiment"]["name"]
    tuning = load_tuning(RESULTS_ROOT, name)
    if tuning is None:
        raise SystemExit(f"results/{name}/tuning.json does not exist: near ties need the experiment's tuning")
    seeds = args.seeds if args.seeds is not None else doc["experiment"].get("seeds", [0, 1, 2])
    num_partitions = int(doc["experiment"].get("num-supernodes", 10))
    if args.check_chosen and args.dry_run:  # what the check would re-run, nothing run
        labels = [lb for lb in doc["runs"] if not args.only or lb in args.only]
        print(f"--check-chosen would re-run the chosen trial of {', '.join(labels)} at seed {seeds[0]} "
              f"(results/{name}/{NEAR_TIES_DIR}/{args.check_file})")
    elif args.check_chosen:
        check_chosen(doc, tuning, seeds[0], num_partitions, args.only, args.check_file)
    jobs = []
    for label, over in doc["runs"].items():
        if args.only and label not in args.only:
            continue
        for choice in arm_choices(tuning, label):
            se = "" if choice.se is None else f" (se {100 * choice.se:.2f})"
            print(f"{label}: {'chosen' if choice.chosen else 'near tie'} {choice.slug}: deficit "
                  f"{100 * choice.deficit:.2f} points{se}")
            if choice.chosen:
                continue
            for seed in seeds:
                out = choice_dir(RESULTS_ROOT, name, label, choice) / f"seed{seed}"
                values = {**doc.get("base", {}), **over, **choice.values, "seed": seed, "out-dir": str(out),
                          "checkpoint": False, "overwrite": True}
                cfg = planned_config(values)
                if not is_complete(out, cfg, num_partitions):
                    jobs.append((label, choice.slug, seed, cfg, out))
    print(f"{len(jobs)} near-tie runs to do")
    if args.dry_run:
        return 0
    failed = []
    for i, (label, sl, seed, cfg, out) in enumerate(jobs):
        t0 = time.time()
        try:
            res = simulate(cfg, num_supernodes=num_partitions)
            write_split(out, cfg, num_partitions)
            acc = res["final"].get("global_accuracy")
            print(f"[{i + 1}/{len(jobs)}] {name}/{label}/{sl}/seed{seed}: G-FL {acc} in {time.time() - t0:.0f}s",
                  flush=True)
        except Exception:  # noqa: BLE001 - keep going, report at the end
            traceback.print_exc()
            failed.append(f"{label}/{sl}/seed{seed}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


ACCURACY_KEYS = ("global_accuracy", "val_accuracy", "local_accuracy", "client_accuracy_mean",
                 "client_accuracy_worst")
LOSS_KEYS = ("global_loss", "val_loss")
LOSS_ROUNDING = 1e-6   # a loss difference at most this big, every accuracy equal: the evaluation's rounding


def compare_rounds(recorded: list[dict[str, Any]], again: list[dict[str, Any]],
                   accuracy_keys: tuple[str, ...] = ACCURACY_KEYS,
                   loss_keys: tuple[str, ...] = LOSS_KEYS) -> dict[str, Any]:
    """How a re-run's per-round figures compare with the reported run's: the largest absolute difference per key
    (the accuracies of ``accuracy_keys``, the losses of ``loss_keys``; by default G-FL, validation, P-FL and
    client accuracies, G-FL and validation losses) over the rounds both have, and a status:

    - ``identical``: as many rounds, every compared value equal;
    - ``accuracy identical``: as many rounds, every accuracy equal and each loss within ``LOSS_ROUNDING`` (what a
      machine whose kernels sum the evaluation in another order gives: training, choices and every accuracy-based
      score are the reported run's; measured on two VMs of the same AVX512 level, docs/EXPERIMENTS.md);
    - ``differs``: anything else (the run took another path).
    """
    by_key: dict[str, float] = {}
    one_sided: set[str] = set()   # keys measured in a round of one run only
    for a, b in zip(recorded, again):
        for k in (*accuracy_keys, *loss_keys):
            if a.get(k) is not None and b.get(k) is not None:
                by_key[k] = max(by_key.get(k, 0.0), abs(float(a[k]) - float(b[k])))
            elif (a.get(k) is None) != (b.get(k) is None):
                one_sided.add(k)
    same_length = len(recorded) == len(again) and bool(by_key) and not one_sided
    accuracy_equal = all(by_key.get(k, 0.0) == 0.0 for k in accuracy_keys)
    loss = max((by_key.get(k, 0.0) for k in loss_keys), default=0.0)
    if same_length and accuracy_equal and loss == 0.0:
        status = "identical"
    elif same_length and accuracy_equal and loss <= LOSS_ROUNDING:
        status = "accuracy identical"
    else:
        status = "differs"
    return {"status": status, "max_abs_difference": max(by_key.values()) if by_key else None,
            "max_abs_difference_by_key": by_key, "measured_in_one_run_only": sorted(one_sided),
            "rounds": [len(recorded), len(again)]}


KERNEL_ENV_KEYS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def checked_on(stack: dict[str, Any], environ: Any = None) -> dict[str, Any]:
    """The commit, code digest and machine a check ran on, from its stack (flcore.stack.stack_info), and the
    environment variables that steer the CPU kernels, where set (a check may take another kernel level's paths)."""
    environ = os.environ if environ is None else environ
    return {"commit": (stack.get("git") or {}).get("commit"), "code": (stack.get("code") or {}).get("digest"),
            "cpu_capability": stack.get("cpu_capability"), "platform": stack.get("platform"), "cpu": stack.get("cpu"),
            "kernel_env": {k: environ[k] for k in KERNEL_ENV_KEYS if environ.get(k)}}


def check_chosen(doc: dict[str, Any], tuning: dict[str, Any], seed: int, num_partitions: int,
                 only: list[str] | None, check_file: str = CHECK_FILE) -> dict[str, Any]:
    """Re-run each arm's chosen trial at ``seed`` in a temporary folder and compare its per-round figures with the
    reported run's (:func:`compare_rounds`). Written to results/<exp>/near-ties/``check_file``: each run's entry
    names the commit, code digest and machine it was checked on; entries of runs not re-checked now are kept (a
    check of some labels adds to the file), the file's ``stack`` is the latest check's."""
    import tempfile

    from experiments.run import RESULTS_ROOT, planned_config
    from experiments.simulate import simulate
    from flcore.stack import stack_info

    name = doc["experiment"]["name"]
    path = RESULTS_ROOT / name / NEAR_TIES_DIR / check_file
    stack = stack_info()
    where = checked_on(stack)
    old = json.loads(path.read_text()) if path.exists() else {}
    kept = old.get("runs", {}) if old.get("seed", seed) == seed else {}
    old_where = checked_on(old.get("stack") or {}, environ={})
    out: dict[str, Any] = {"seed": seed, "stack": stack,
                           "runs": {k: {**r, "checked_on": r.get("checked_on", old_where)} for k, r in kept.items()}}
    for label, over in doc["runs"].items():
        if only and label not in only:
            continue
        recorded_path = RESULTS_ROOT / name / label / f"seed{seed}" / "results.json"
        if not recorded_path.exists():
            out["runs"][label] = {"status": "no reported run", "checked_on": where}
            continue
        recorded = json.loads(recorded_path.read_text())
        with tempfile.TemporaryDirectory() as tmp:
            values = {**doc.get("base", {}), **over, **tuning["runs"][label]["chosen"], "seed": seed,
                      "out-dir": tmp, "checkpoint": False, "overwrite": True}
            again = simulate(planned_config(values), num_supernodes=num_partitions)
        entry = compare_rounds(recorded["rounds"], again["rounds"])
        out["runs"][label] = {**entry, "recorded_commit": (recorded.get("stack") or {}).get("git"),
                              "recorded_platform": (recorded.get("stack") or {}).get("platform"),
                              "checked_on": where}
        print(f"check {label}: {entry['status']} (max |diff| by key {entry['max_abs_difference_by_key']})",
              flush=True)
        write_check(path, out)   # after every run: what finished stays if the check is stopped
    write_check(path, out)
    return out


def write_check(path: Path, doc: dict[str, Any]) -> None:
    """Write a check's document (near-ties/chosen_check*.json, tuning/trial_check.json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
