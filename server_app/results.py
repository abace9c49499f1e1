"""Run outputs: results.json (schema below), metrics.csv, accuracy-vs-round PNG, final model.

results.json = {
  "run_config": {...every run-config key...},
  "rounds": [{"round", "global_accuracy", "global_loss", "val_accuracy", "val_loss", "local_accuracy", "local_accuracy_best",
              "local_accuracy_worst", "local_accuracy_std", "wall_time_s", "bytes_sent", "bytes_received",
              "num_sampled", "num_updates", "failures": [{"cid", "phase", "kind", "reason"}],
              "global_feature_erank", "global_feature_corr", "global_feature_dim" (the global model's
              representations on the G-FL test set: models/representation.py),
              "client_eval": {...} | null, "strategy": {...method metrics...}}, ...],
  "final": {"global_accuracy", "global_loss", "local_accuracy", ..., "best_global_accuracy",
            "rounds_to_target", "target_accuracy", "total_wall_time_s", "mean_round_time_s",
            "total_bytes_sent", "total_failures", "num_clients"},
  "stack": {python, packages {flwr, torch, torchvision, numpy, scipy, cvxpy, clarabel, ray, scikit-learn},
            torch_cuda, cudnn, device, cpu_capability, deterministic {...}, lock {matches, digest, differences},
            code {digest, files}, git {commit, tree, dirty, code_dirty}, ...}
            (flcore.stack.stack_info, read when the run starts; code: flcore/code_digest.py)
}
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from flcore.common import CommonConfig
from flcore.config import RunConfig
from flcore.stack import stack_info
from server_app.tensorboard_log import tensorboard_log

SCALAR_COLUMNS = ("round", "global_accuracy", "global_loss", "val_accuracy", "val_loss", "local_accuracy", "local_accuracy_best",
                  "local_accuracy_worst", "local_accuracy_std", "local_accuracy_all_devices",
                  "local_accuracy_all_devices_n", "client_accuracy_mean", "client_accuracy_worst",
                  "client_accuracy_std", "min_data_client_accuracy", "max_data_client_accuracy",
                  "wall_time_s", "bytes_sent", "bytes_received", "num_sampled", "num_updates", "num_failures")


def spread(values: list[float]) -> dict[str, float | None]:
    """mean / best / worst / std of per-client accuracies (None when there are none)."""
    if not values:
        return {"mean": None, "best": None, "worst": None, "std": None}
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "best": float(arr.max()), "worst": float(arr.min()), "std": float(arr.std())}


def rounds_to_target(rounds: list[dict[str, Any]], target: float) -> int | None:
    """First round whose global accuracy reaches ``target`` (None if never)."""
    for row in rounds:
        acc = row.get("global_accuracy")
        if acc is not None and acc >= target:
            return int(row["round"])
    return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def scalar_of(row: dict[str, Any], column: str) -> Any:
    """The value of ``column`` in a round row; ``strategy.<key>`` reads the method's metrics."""
    if column.startswith("strategy."):
        return (row.get("strategy") or {}).get(column[len("strategy."):])
    return row.get(column)


def csv_columns(rounds: list[dict[str, Any]]) -> list[str]:
    """Every per-round scalar of results.json: SCALAR_COLUMNS, then any other scalar key of a round (e.g.
    ``client_accuracy_best``, ``min_data_client``, ``num_evaluated``), then the method's scalar metrics as
    ``strategy.<key>``, each in first-seen order. Lists and maps (sampled, failures, per-client values) are not
    scalars; a key is a column when it is a scalar in every round that has it."""
    seen: dict[str, bool] = {c: True for c in SCALAR_COLUMNS}
    for row in rounds:
        items = [(k, v) for k, v in row.items() if k != "strategy"]
        items += [(f"strategy.{k}", v) for k, v in (row.get("strategy") or {}).items()]
        for key, value in items:
            seen[key] = seen.get(key, True) and _is_scalar(value)
    return [c for c, ok in seen.items() if ok]


# Rewrite results.json after a round only when this many seconds have passed since the last write (and
# always at the end): rounds slower than this are written every round as before, while a run of
# millisecond rounds does not spend most of its time rewriting (and renaming) the file.
def recorded_target(run_config: Mapping[str, Any]) -> float:
    """The target accuracy of a recorded run (results.json's "run_config"): its ``target-accuracy``, or the
    declared default (flcore/common.py) for a record without the key."""
    return float(run_config.get("target-accuracy", CommonConfig.default_of("target-accuracy")))


def summarize(rounds: list[dict[str, Any]], target: float, num_clients: int = 0) -> dict[str, Any]:
    """results.json's "final": the last round's scalars plus the run's summary over ``rounds`` (best accuracy,
    rounds to ``target`` accuracy, time, bytes, failures). Pure: the report also applies it to the first N rounds
    of a recorded run (with :func:`recorded_target` of its run config)."""
    if not rounds:
        return {}
    last = rounds[-1]
    accs = [r["global_accuracy"] for r in rounds if r.get("global_accuracy") is not None]
    times = [r["wall_time_s"] for r in rounds]
    keys = [c for c in SCALAR_COLUMNS if c not in ("round", "wall_time_s", "bytes_sent", "bytes_received",
                                                    "num_sampled", "num_updates", "num_failures")]
    out = {k: last.get(k) for k in keys}
    out.update({
        "rounds": len(rounds),
        "best_global_accuracy": max(accs) if accs else None,
        "target_accuracy": target,
        "rounds_to_target": rounds_to_target(rounds, target),
        "total_wall_time_s": float(sum(times)),
        "mean_round_time_s": float(np.mean(times)),
        "total_bytes_sent": int(sum(r["bytes_sent"] for r in rounds)),
        "total_failures": int(sum(len(r.get("failures", [])) for r in rounds)),
        "num_clients": num_clients,
    })
    return out


# run-config keys that say where and how a run was written or polled, not what it computed
NOT_COMPARED = frozenset({"out-dir", "overwrite", "resume-from", "checkpoint", "client-state-dir",
                          "reply-poll-interval",
                          # bookkeeping: whether a preset or method recipe was applied (its values are compared)
                          "preset-applied"})


def recorded_config_changes(out_dir: Path, cfg: RunConfig) -> list[str]:
    """What differs between the run config ``out_dir/results.json`` was recorded with and ``cfg`` (the run now
    planned there), as ``"key: recorded -> planned"``; [] when they agree or nothing is recorded. Compared: the
    common keys and the running method's own section (other methods' sections do not reach its run); not
    compared: bookkeeping keys (NOT_COMPARED) and keys the record lacks (added to the project after the run). A finished run with a change is not the planned run:
    an experiment runner re-runs it rather than report it under the new config."""
    path = out_dir / "results.json"
    try:
        recorded = json.loads(path.read_text())["run_config"]
    except (OSError, ValueError, KeyError):
        return []
    own = cfg.method_section
    prefix = None if own is None else f"{own.NAME}."
    planned = json.loads(json.dumps(_jsonable(cfg.to_dict())))
    return [f"{k}: {recorded[k]!r} -> {v!r}" for k, v in sorted(planned.items())
            if k not in NOT_COMPARED and k in recorded and recorded[k] != v
            and ("." not in k or (prefix is not None and k.startswith(prefix)))]


WRITE_INTERVAL_S = 1.0


class ResultsWriter:
    """results.json, metrics.csv, the accuracy plot and the TensorBoard log of one run: the writer of the run
    config's echo (``run_config``, the flat form results.json and the checkpoint record)."""

    def __init__(self, out_dir: Path, cfg: RunConfig, write_interval: float = WRITE_INTERVAL_S) -> None:
        self.out_dir = out_dir
        self.cfg = cfg
        self.run_config = cfg.to_dict()
        self.rounds: list[dict[str, Any]] = []
        self.write_interval = write_interval
        self._last_write = float("-inf")
        self.stack = stack_info()  # the stack this run's numbers come from (issue 30)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.tensorboard = tensorboard_log(out_dir, cfg.tensorboard)  # run-config key tensorboard (issue 33)

    def add_round(self, row: dict[str, Any]) -> None:
        self.rounds.append(_jsonable(row))
        if self.tensorboard is not None:
            self.tensorboard.add_round(self.rounds[-1])
        if time.monotonic() - self._last_write >= self.write_interval:
            self.write()  # keep results.json current: a killed run leaves its rounds but the last second's

    def final(self, num_clients: int) -> dict[str, Any]:
        return summarize(self.rounds, self.cfg.target_accuracy, num_clients)

    def close(self) -> None:
        """Close what stays open between rounds (the TensorBoard writer and its thread); the runner calls it
        when the run ends, however it ends."""
        if self.tensorboard is not None:
            self.tensorboard.close()

    def write(self, num_clients: int = 0) -> Path:
        path = self.out_dir / "results.json"
        doc = {"run_config": _jsonable(self.run_config), "rounds": self.rounds, "final": self.final(num_clients),
               "stack": self.stack}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(path)
        self._last_write = time.monotonic()
        return path

    def write_csv(self) -> Path:
        """metrics.csv: one row per round, a column per scalar of results.json's rounds (see csv_columns)."""
        path = self.out_dir / "metrics.csv"
        columns = csv_columns(self.rounds)
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=columns)
            w.writeheader()
            for row in self.rounds:
                w.writerow({c: scalar_of(row, c) for c in columns})
        return path


def plot_accuracy(rounds: list[dict[str, Any]], title: str, path: Path) -> Path | None:
    """accuracy.png of a run's rounds: G-FL, validation and P-FL accuracy per round (the lines a run has). Drawn
    by the ServerApp after the loop (server_app/app.py), not by run_federation: about 50 ms of matplotlib, the
    largest cost of a tiny run, that the library's callers (tests, benchmarks) do not look at."""
    if not rounds:
        return None
    from matplotlib.figure import Figure  # no pyplot: no global figure manager, no backend switch

    x = [r["round"] for r in rounds]
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.12, top=0.92)  # fixed margins: tight_layout cost 40 %
    for key, label in (("global_accuracy", "G-FL (global model, global test)"),
                       ("val_accuracy", "global model, validation splits"),
                       ("local_accuracy", "P-FL (local models, local test)")):
        y = [r.get(key) for r in rounds]
        if any(v is not None for v in y):
            ax.plot(x, [v if v is not None else float("nan") for v in y], marker="o", ms=3, label=label)
    ax.set_xlabel("round")
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=100)
    return path
