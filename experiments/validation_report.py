"""Summary of an experiment judged on validation data (results/<name>/<label>/seed<k>/results.json).

    python -m experiments.validation_report results/fedbr-maxstep-validation
    python -m experiments.validation_report results/fedbc-uniform-validation

Per run label, over its finished seeds: validation accuracy (the union of the clients' validation splits,
never the test set) at the last round, at its best round and the mean of the last 5 rounds (mean +/- std over
seeds); then, per round, the method's mechanism metrics (strategy metrics in results.json, averaged over seeds):
FedBR: L_con before and after the max step and at the end of local training, and the two cosines inside L_con;
FedBC: lambda over the round's clients, the largest gamma, the L1 gaps between the weights used and the sample /
uniform weights, the mean penalty lambda_k (||x_k - z||^2 - gamma_k).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

MECHANISMS = {
    "fedbr": ("fedbr-max-con-loss", "fedbr-con-loss", "fedbr-con-end", "fedbr-sim-global", "fedbr-sim-real"),
    "fedbc": ("fedbc-round-lambda-mean", "fedbc-round-lambda-max", "fedbc-gamma-max", "fedbc-weights-l1-vs-samples",
              "fedbc-weights-l1-vs-uniform", "fedbc-penalty-mean"),
}


def load(root: Path) -> dict[str, list[dict]]:
    """label -> the results.json documents of its finished seeds (every round of the run config done)."""
    out: dict[str, list[dict]] = {}
    for path in sorted(root.glob("*/seed*/results.json")):
        doc = json.loads(path.read_text())
        if len(doc["rounds"]) == doc["run_config"]["num-server-rounds"]:
            out.setdefault(path.parent.parent.name, []).append(doc)
    if not out:
        raise SystemExit(f"no results under {root}")
    return out


def accuracy_table(runs: dict[str, list[dict]]) -> list[str]:
    lines = ["| run | seeds | rounds | val acc, last round | best round | mean of last 5 rounds |",
             "|---|---|---|---|---|---|"]
    for label, docs in runs.items():
        acc = np.array([[r["val_accuracy"] for r in d["rounds"]] for d in docs], np.float64)
        cells = [acc[:, -1], acc.max(axis=1), acc[:, -5:].mean(axis=1)]
        lines.append(f"| {label} | {len(docs)} | {acc.shape[1]} | "
                     + " | ".join(f"{c.mean():.4f} +/- {c.std(ddof=1) if len(c) > 1 else 0.0:.4f}" for c in cells) + " |")
    return lines


def mechanism_table(runs: dict[str, list[dict]], keys: tuple[str, ...],
                    rounds: tuple[int, ...] = (1, 2, 5, 10, 20, 30)) -> list[str]:
    lines = ["| run | round | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for label, docs in runs.items():
        if not any(k in docs[0]["rounds"][0]["strategy"] for k in keys):
            continue
        for rnd in rounds:
            rows = [d["rounds"][rnd - 1]["strategy"] for d in docs if len(d["rounds"]) >= rnd]
            if not rows:
                continue
            vals = [float(np.mean([r[k] for r in rows])) if all(k in r for r in rows) else None for k in keys]
            lines.append(f"| {label} | {rnd} | " + " | ".join("-" if v is None else f"{v:.4g}" for v in vals) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="results/<experiment name>")
    runs = load(Path(ap.parse_args(argv).root))
    lines = accuracy_table(runs)
    for keys in MECHANISMS.values():
        table = mechanism_table(runs, keys)
        if len(table) > 2:
            lines += [""] + table
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
