"""The tuning protocol: every run of an experiment, FedAvg included, gets the same budget over the same lr grid
(plus its own knobs), chosen on validation data carved from the training clients' data, never on test accuracy.

An experiment config opts in with a ``[tuning]`` table::

    [tuning]
    seed = 100                      # the tuning federation's seed: not one of the reported seeds
    validation-fraction = 0.2       # of each client's training data, held out during tuning only
    lr = [0.003, 0.01, 0.03, 0.1]   # the grid every run shares
    last-rounds = 3                 # score = mean validation accuracy of the global model over the last rounds
    [tuning.knobs.fedavg]           # per run label: its own knob grid (same size for every run: equal budget)
    weight-decay = [0.0, 5e-4]
    [tuning.knobs.fedprox]
    "fedprox.mu" = [0.01, 0.1]

Each trial runs with ``test-evaluation = false``: the global test set is not even evaluated, so no test number
can leak into the choice. ``python -m experiments.tune <config>`` writes every trial under
``results/<name>/tuning/<label>/<trial>/`` and the choices to ``results/<name>/tuning.json``; the reported runs
(``python -m experiments.run``) then train on all training data (no validation split) with the chosen values.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from flcore.config import ConfigError, check_value

TUNING_FILE = "tuning.json"
METRIC = "val_accuracy"


@dataclass(frozen=True)
class TuningPlan:
    seed: int
    validation_fraction: float
    lr: tuple[float, ...]
    last_rounds: int
    knobs: Mapping[str, Mapping[str, tuple[Any, ...]]]   # run label -> key -> grid

    def trials(self, label: str) -> list[dict[str, Any]]:
        """Every trial of ``label``: the lr grid x its knob grid, in a fixed order (ties go to the first)."""
        grid = dict(self.knobs.get(label, {}))
        keys = list(grid)
        out = []
        for lr in self.lr:
            for combo in itertools.product(*(grid[k] for k in keys)):
                out.append({"lr": lr, **dict(zip(keys, combo))})
        return out


def trial_name(values: Mapping[str, Any]) -> str:
    return "-".join(f"{k}={v}" for k, v in values.items()).replace("/", "_")


def parse_plan(table: Mapping[str, Any], labels: list[str], source: str) -> TuningPlan:
    """The ``[tuning]`` table, checked: known keys with valid values, every run tuned, equal budgets."""
    allowed = {"seed", "validation-fraction", "lr", "last-rounds", "knobs"}
    extra = set(table) - allowed
    if extra:
        raise ConfigError(f"{source}: [tuning] has unknown key(s) {sorted(extra)}; allowed: {sorted(allowed)}")
    lr = tuple(float(check_value("lr", v)) for v in table.get("lr", ()))
    if not lr:
        raise ConfigError(f"{source}: [tuning] needs an lr grid (lr = [...])")
    vf = float(check_value("validation-fraction", table.get("validation-fraction", 0.2)))
    if vf <= 0:
        raise ConfigError(f"{source}: [tuning] validation-fraction must be > 0 (tuning selects on it)")
    knobs: dict[str, dict[str, tuple[Any, ...]]] = {}
    for label, grid in dict(table.get("knobs", {})).items():
        if label not in labels:
            raise ConfigError(f"{source}: [tuning.knobs.{label}] names no run (runs: {', '.join(labels)})")
        flat = _flatten(grid)
        for key, values in flat.items():
            if key in ("lr", "seed", "validation-fraction", "test-evaluation"):
                raise ConfigError(f"{source}: [tuning.knobs.{label}] may not tune '{key}' (the protocol owns it)")
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{source}: [tuning.knobs.{label}] '{key}' must be a non-empty list")
            flat[key] = tuple(check_value(key, v) for v in values)
        knobs[label] = flat
    plan = TuningPlan(int(table.get("seed", 100)), vf, lr, int(table.get("last-rounds", 3)), knobs)
    budgets = {label: len(plan.trials(label)) for label in labels}
    if len(set(budgets.values())) != 1:
        raise ConfigError(f"{source}: unequal tuning budgets {budgets}: every run (the baseline too) must get the "
                          "same number of trials; give each run a knob grid of the same size")
    return plan


def _flatten(grid: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in grid.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def score(doc: Mapping[str, Any], last_rounds: int) -> float:
    """Mean validation accuracy of the global model over the last ``last_rounds`` rounds (NaN if a round
    lacks it: a diverged trial never wins)."""
    rows = doc["rounds"][-last_rounds:]
    vals = [r.get(METRIC) for r in rows]
    if not vals or any(v is None or not math.isfinite(float(v)) for v in vals):
        return float("nan")
    return float(sum(vals) / len(vals))


def choose(trials: list[tuple[dict[str, Any], float]]) -> tuple[dict[str, Any], float]:
    """The trial with the best score (the first on ties; NaN scores lose)."""
    best: tuple[dict[str, Any], float] | None = None
    for values, s in trials:
        if math.isfinite(s) and (best is None or s > best[1]):
            best = (values, s)
    if best is None:
        raise ConfigError("every tuning trial diverged (no finite validation accuracy)")
    return best


def load_choices(root: Path, labels: list[str]) -> dict[str, dict[str, Any]]:
    """label -> chosen values, from ``root/tuning.json``; a clear error when tuning has not run."""
    path = root / TUNING_FILE
    if not path.exists():
        raise ConfigError(f"{path} does not exist: this experiment has a [tuning] table; run "
                          f"`python -m experiments.tune <config>` first")
    doc = json.loads(path.read_text())
    missing = [label for label in labels if label not in doc.get("runs", {})]
    if missing:
        raise ConfigError(f"{path}: no tuning result for run(s) {', '.join(missing)}; run experiments.tune again")
    return {label: dict(doc["runs"][label]["chosen"]) for label in labels}
