"""FedBC's Lagrange multipliers from a run's results.json (after the paper's Figure 3(b)/(c) and 7(e)).

    python -m experiments.plot_fedbc runs/<run>/results.json [-o fedbc_lambda.png]

Panels: (a) aggregation coefficient lambda_k / sum_j lambda_j of the min-data and max-data client per
round, next to their data-size coefficient n_k / sum_j n_j; (b) the final coefficients of every client
against its data size; (c) mean/min/max of lambda and gamma over rounds; (d) local (P-FL) accuracy as the paper
defines it for its Tables 1 and 3 ("each device's local model ... using its own test data and take the average
across all devices": ``local_accuracy_all_devices``, each device's last local model, the devices never sampled
left out and counted beside it) next to the mean over the round's sampled clients (``local_accuracy``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np


def lambda_series(results: dict[str, Any]) -> dict[str, Any]:
    """Per-round arrays from results.json: rounds, cids, sizes, lambda (R x K) and gamma (R x K)."""
    rows = [r for r in results["rounds"] if "fedbc-lambda" in (r.get("strategy") or {})]
    if not rows:
        raise ValueError("results.json has no 'fedbc-lambda' in its rounds' strategy metrics (not a FedBC run?)")
    cids = rows[-1]["strategy"]["fedbc-cids"]
    sizes = np.asarray(rows[-1]["strategy"]["fedbc-num-examples"], np.float64)
    lam = np.full((len(rows), len(cids)), np.nan)
    gam = np.full_like(lam, np.nan)
    col = {c: i for i, c in enumerate(cids)}
    for r, row in enumerate(rows):
        s = row["strategy"]
        for c, lv, gv in zip(s["fedbc-cids"], s["fedbc-lambda"], s["fedbc-gamma"]):
            lam[r, col[c]], gam[r, col[c]] = lv, gv
    return {"rounds": np.array([row["round"] for row in rows]), "cids": cids, "sizes": sizes,
            "lambda": lam, "gamma": gam}


def pfl_series(results: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per-round P-FL from results.json: rounds, the all-devices mean (NaN where no device has a local model yet
    or the run predates the metric), how many devices it averages, the registered devices, and the sampled
    clients' mean. Raises ValueError when no round records ``local_accuracy_all_devices`` (a run from before
    issue 40)."""
    rows = results["rounds"]
    if not any("local_accuracy_all_devices" in r for r in rows):
        raise ValueError("results.json has no 'local_accuracy_all_devices' in its rounds (recorded before issue 40)")
    nan = float("nan")

    def col(key: str) -> np.ndarray:
        return np.array([nan if r.get(key) is None else float(r[key]) for r in rows])

    return {"rounds": col("round"), "all_devices": col("local_accuracy_all_devices"),
            "devices_with_model": col("local_accuracy_all_devices_n"), "registered": col("num_registered"),
            "sampled": col("local_accuracy")}


def coefficients(lam: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lambda_k / sum lambda per row, n_k / sum n); rows with sum lambda = 0 are NaN."""
    total = np.nansum(lam, axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        coef = np.where(total > 0, lam / total, np.nan)
    return coef, sizes / sizes.sum()


def plot(results_path: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads(results_path.read_text())
    data = lambda_series(doc)  # (a)-(c)
    coef, size_coef = coefficients(data["lambda"], data["sizes"])
    lo, hi = int(np.argmin(data["sizes"])), int(np.argmax(data["sizes"]))
    rounds = data["rounds"]
    pfl = pfl_series(doc) if any("local_accuracy_all_devices" in r for r in doc["rounds"]) else None
    fig, ax = plt.subplots(1, 4 if pfl is not None else 3, figsize=(20 if pfl is not None else 15, 4))
    for idx, name, color in ((lo, "min user", "tab:red"), (hi, "max user", "tab:green")):
        ax[0].plot(rounds, coef[:, idx], color=color, label=f"{name}: lambda coefficient")
        ax[0].axhline(size_coef[idx], color=color, ls="--", label=f"{name}: data-size coefficient")
    ax[0].set(xlabel="round", ylabel="aggregation coefficient", yscale="log", title="(a) min/max user")
    ax[0].legend(fontsize=7)
    ax[1].scatter(data["sizes"], coef[-1], label="lambda_k / sum lambda (final)")
    ax[1].scatter(data["sizes"], size_coef, marker="x", label="n_k / sum n")
    ax[1].set(xlabel="client data size", ylabel="coefficient", xscale="log", title="(b) final coefficients")
    ax[1].legend(fontsize=7)
    for name, arr, color in (("lambda", data["lambda"], "tab:blue"), ("gamma", data["gamma"], "tab:orange")):
        ax[2].plot(rounds, np.nanmean(arr, 1), color=color, label=f"{name} mean")
        ax[2].fill_between(rounds, np.nanmin(arr, 1), np.nanmax(arr, 1), color=color, alpha=0.2)
    ax[2].set(xlabel="round", title="(c) dual variables (mean, min-max band)")
    ax[2].legend(fontsize=7)
    if pfl is not None:
        ax[3].plot(pfl["rounds"], pfl["all_devices"], label="all devices' last local models (paper)")
        ax[3].plot(pfl["rounds"], pfl["sampled"], ls="--", label="this round's sampled clients")
        twin = ax[3].twinx()
        twin.plot(pfl["rounds"], pfl["devices_with_model"], color="grey", lw=0.8, label="devices with a model")
        twin.set_ylabel("devices with a local model", fontsize=8)
        ax[3].set(xlabel="round", ylabel="local (P-FL) accuracy", title="(d) P-FL as the paper defines it")
        ax[3].legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("-o", "--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or args.results.with_name("fedbc_lambda.png")
    print(plot(args.results, out))


if __name__ == "__main__":
    main()
