"""Re-run check of tuning trials (issue 43 item 4: trials re-run at today's code unless a recorded check shows
them bit-identical).

A tuning trial written before results named their stack (no ``stack.code`` digest in its results.json) says
nothing about the code it came from. This re-runs such trials, each on its tuning seed with the values the tuning
plans for it now (experiments/tune.py's trial config: validation split, no test evaluation), in a temporary folder,
and compares every round's figures with the recorded ones (experiments/near_ties.compare_rounds on
:func:`compared_keys`: the validation accuracy and loss, and the tuning's metric): ``identical``, ``accuracy
identical`` or ``differs``. The findings go to results/<exp>/tuning/trial_check.json, each entry with the commit, code digest,
machine and CPU-kernel environment it was checked on (a bit-exact re-run needs the kernels the trial ran on: on an
AVX512 machine, ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` takes the AVX2
code paths, tests/known_outputs.py KERNEL_ENV). RESULTS.md's section of the experiment says what it found.

    python -m experiments.trial_check experiments/configs/<name>.toml [--only LABEL ...] [--all]

``--all`` re-runs every finished trial, not only those without a code digest. The exit code is 1 when a trial
re-run now differs. The files of the trials are not touched: a trial that differs is a finding to report (then
re-tune at today's code: ``experiments.tune --force``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from experiments.near_ties import checked_on, compare_rounds, write_check

CHECK_FILE = "trial_check.json"


def compared_keys(metric: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(accuracies, losses) a trial's re-run is compared on: what the tuning reads (its metric, the validation
    accuracy by default) and the validation loss. Not the P-FL figures: trials recorded before ``pfl-eval-split``
    (issue 43 item 3) evaluated the clients' local test splits, today's evaluate their validation splits, so those
    figures differ by design, not by the code's numbers (unless the metric is one of them: then the score moved)."""
    return tuple(dict.fromkeys(("val_accuracy", metric))), ("val_loss",)


def unrecorded(doc: dict[str, Any]) -> bool:
    """Whether a trial's results.json names no code digest (written before results named their code)."""
    return not ((doc.get("stack") or {}).get("code") or {}).get("digest")


def trials_to_check(doc: dict[str, Any], root: Path, tuning: dict[str, Any], only: list[str] | None,
                    every: bool) -> list[tuple[str, dict[str, Any], int, Path]]:
    """(label, trial values, tuning seed, trial folder) of every finished trial to re-run, in tuning.json's order:
    those without a code digest, or all with ``every``."""
    from experiments.tune import finished, trial_dir

    plan = doc["tuning"]
    out = []
    for label, run in tuning.get("runs", {}).items():
        if label not in doc["runs"] or (only and label not in only):
            continue
        for trial in run.get("trials", []):
            for seed in plan.seeds:
                folder = trial_dir(root, label, trial["values"], plan, seed)
                if not finished(root, label, trial["values"], doc, plan, seed):
                    continue
                if every or unrecorded(json.loads((folder / "results.json").read_text())):
                    out.append((label, trial["values"], seed, folder))
    return out


def check_trials(doc: dict[str, Any], root: Path, jobs: list[tuple[str, dict[str, Any], int, Path]]) -> dict[str, Any]:
    """Re-run each job in a temporary folder, compare it with its recorded results.json and write
    results/<exp>/tuning/trial_check.json after each (entries of trials not re-run now are kept)."""
    from experiments.run import planned_config
    from experiments.simulate import simulate
    from experiments.tune import num_partitions, trial_values
    from flcore.stack import stack_info

    plan = doc["tuning"]
    path = root / "tuning" / CHECK_FILE
    stack = stack_info()
    where = checked_on(stack)
    out: dict[str, Any] = {"stack": stack, "trials": {}}
    if path.exists():
        out["trials"] = dict(json.loads(path.read_text()).get("trials", {}))
    for i, (label, trial, seed, folder) in enumerate(jobs):
        recorded = json.loads((folder / "results.json").read_text())
        with tempfile.TemporaryDirectory() as tmp:
            values = {**trial_values(doc, plan, root, label, trial, seed), "out-dir": tmp}
            again = simulate(planned_config(values), num_supernodes=num_partitions(doc))
        entry = compare_rounds(recorded["rounds"], again["rounds"], *compared_keys(plan.metric(label)))
        key = str(folder.relative_to(root / "tuning"))
        out["trials"][key] = {**entry, "recorded_code": ((recorded.get("stack") or {}).get("code") or {}).get("digest"),
                              "checked_on": where}
        print(f"[{i + 1}/{len(jobs)}] {key}: {entry['status']} (max |diff| by key "
              f"{entry['max_abs_difference_by_key']})", flush=True)
        write_check(path, out)   # after every trial: what finished stays if the check is stopped
    return out


def main(argv: list[str] | None = None) -> int:
    from experiments.run import RESULTS_ROOT, load_experiment
    from experiments.near_ties import load_tuning

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", type=Path)
    ap.add_argument("--only", nargs="*", help="run labels (default: every tuned run)")
    ap.add_argument("--all", action="store_true", help="every finished trial, not only those without a code digest")
    args = ap.parse_args(argv)
    doc = load_experiment(args.config)
    if doc["tuning"] is None:
        raise SystemExit(f"{args.config}: no [tuning] table, no trials to check")
    name = doc["experiment"]["name"]
    tuning = load_tuning(RESULTS_ROOT, name)
    if tuning is None:
        raise SystemExit(f"results/{name}/tuning.json does not exist: no trials to check")
    root = RESULTS_ROOT / name
    jobs = trials_to_check(doc, root, tuning, args.only, args.all)
    print(f"{len(jobs)} trial(s) to re-run", flush=True)
    out = check_trials(doc, root, jobs) if jobs else {"trials": {}}
    now = {str(folder.relative_to(root / "tuning")) for _, _, _, folder in jobs}
    return 1 if any(out["trials"][k]["status"] == "differs" for k in now) else 0   # what this check re-ran


if __name__ == "__main__":
    raise SystemExit(main())
