"""The tuning protocol: every run of an experiment, FedAvg included, gets the same budget over the same lr grid
(plus its own knobs), chosen on validation data carved from the training clients' data, never on test accuracy.

An experiment config opts in with a ``[tuning]`` table::

    [tuning]
    seed = 100                      # the tuning federation's seed: not one of the reported seeds
                                    # (or seeds = [100, 101, 102]: a trial scores its mean over them)
    validation-fraction = 0.2       # of each client's training data, held out during tuning only
    lr = [0.003, 0.01, 0.03, 0.1]   # the grid every run shares
    last-rounds = 3                 # score = mean validation accuracy of the global model over the last rounds
    metric = "val_accuracy"         # or a table per run label: [tuning.metric] ditto = "local_accuracy" (P-FL)
    max-extend = 2                  # edge extensions of the lr grid allowed per side (0: the grid is fixed)
    inert-tolerance = 0.005         # a knob moving no score by more than this is inert (see below)
    [tuning.knobs.fedavg]           # per run label: its own knob grid (same size for every run: equal budget)
    weight-decay = [0.0, 5e-4]
    [tuning.knobs.fedprox]
    "fedprox.mu" = [0.01, 0.1]

Each trial runs with ``test-evaluation = false``: the global test set is not even evaluated, so no test number
can leak into the choice; and with ``pfl-eval-split = 'validation'``: a client's own evaluation (P-FL) reads its
validation split, not its local test split. The score is the global model's validation accuracy
(``val_accuracy``, G-FL) or, for a run whose ``metric`` is ``local_accuracy``, the clients' own models on their
own validation splits (P-FL: a personalized method is chosen by what it is for).

Two rules keep the comparison fair (issue 31):

- **Edges.** While some run's chosen lr sits on an edge of the shared grid, the grid grows by one value beyond
  that edge (the edge's own geometric step: edge x edge / neighbour, 3 significant digits), for every run, so
  budgets stay equal; at most ``max-extend`` values per side. A choice still on the edge then is reported as such.
- **Knob edges.** Likewise a run's own knob grid (float values: weight decay, a loss weight, ...) grows by one
  value beyond the edge its chosen value sits on (same step; a low edge of 0 is the knob's bound and stays), at
  most ``max-extend`` values per side; the other runs then get make-up lr values (below) so budgets stay equal.
- **Inert knobs.** A knob is inert for a run when, at every other value of the trial (lr and the other knobs),
  its values' validation scores differ by at most ``inert-tolerance`` (0.005 = half a point of accuracy; 0:
  identical scores only). An inert knob adds trials but no choice, so it does not count: a run's effective
  budget is the number of its distinct settings of the knobs that are not inert. A run whose effective budget
  falls short of the largest gets make-up lr values (log-midpoints of its lr values, wide gaps near its choice
  first: ``makeup_lrs``; inert knobs at their first value) until it reaches it.

**Several tuning seeds.** One federation's validation score is noisy: on digits Dir(0.1) a single seed chose
an lr for GNE at which 230 of 3,000 client updates were rejected on the reported seeds. With ``seeds = [...]``
every trial runs on each tuning federation (its partition, validation split and initialisation) and scores the
mean of their scores; a trial that diverges on one of them scores NaN and never wins (``mean_score``). The
first seed's trial runs in the trial's own folder, so a single-seed tuning's trials are reused when seeds are
added; the others in ``seed=<s>/`` inside it.

``python -m experiments.tune <config>`` writes every trial under
``results/<name>/tuning/<label>/<trial>/`` and the choices to ``results/<name>/tuning.json``; the reported runs
(``python -m experiments.run``) then train on all training data (no validation split) with the chosen values.
"""

from __future__ import annotations

import itertools
import json
import math
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from flcore.config import ConfigError, check_value

TUNING_FILE = "tuning.json"
METRIC = "val_accuracy"
METRICS = {"val_accuracy": "the global model's validation accuracy (G-FL)",
           "local_accuracy": "the clients' own models on their own validation splits (P-FL)"}


@dataclass(frozen=True)
class TuningPlan:
    seeds: tuple[int, ...]   # the tuning federations; a trial's score is its mean over them
    validation_fraction: float
    lr: tuple[float, ...]
    last_rounds: int
    knobs: Mapping[str, Mapping[str, tuple[Any, ...]]]   # run label -> key -> grid
    max_extend: int = 2
    inert_tolerance: float = 0.005
    metrics: Mapping[str, str] = dataclasses.field(default_factory=dict)   # run label -> metric (default METRIC)

    def metric(self, label: str) -> str:
        """The per-round key ``label``'s trials are scored on."""
        return self.metrics.get(label, METRIC)

    @property
    def seed(self) -> int:
        """The first tuning seed: its trials live in the trial's own folder (the others in seed=<s>/ below it)."""
        return self.seeds[0]

    def trials(self, label: str, lr: tuple[float, ...] | None = None) -> list[dict[str, Any]]:
        """Every trial of ``label``: the lr grid (``lr``, default the plan's) x its knob grid, in a fixed order
        (ties go to the first)."""
        grid = dict(self.knobs.get(label, {}))
        keys = list(grid)
        out = []
        for value in self.lr if lr is None else lr:
            for combo in itertools.product(*(grid[k] for k in keys)):
                out.append({"lr": value, **dict(zip(keys, combo))})
        return out


def trial_name(values: Mapping[str, Any]) -> str:
    return "-".join(f"{k}={v}" for k, v in values.items()).replace("/", "_")


def parse_plan(table: Mapping[str, Any], labels: list[str], source: str) -> TuningPlan:
    """The ``[tuning]`` table, checked: known keys with valid values, every run tuned, equal budgets."""
    allowed = {"seed", "seeds", "validation-fraction", "lr", "last-rounds", "knobs", "max-extend", "inert-tolerance",
               "metric"}
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
    if len(set(lr)) != len(lr) or list(lr) != sorted(lr):
        raise ConfigError(f"{source}: [tuning] lr grid {list(lr)} must be increasing without repeats")
    max_extend = table.get("max-extend", 2)
    if not isinstance(max_extend, int) or isinstance(max_extend, bool) or not 0 <= max_extend <= 5:
        raise ConfigError(f"{source}: [tuning] max-extend must be an integer in [0, 5], got {max_extend!r}")
    tol = table.get("inert-tolerance", 0.005)
    if not isinstance(tol, (int, float)) or isinstance(tol, bool) or not 0 <= tol < 0.1:
        raise ConfigError(f"{source}: [tuning] inert-tolerance must be a number in [0, 0.1), got {tol!r}")
    plan = TuningPlan(_tuning_seeds(table, source), vf, lr, int(table.get("last-rounds", 3)), knobs, max_extend,
                      float(tol), _metrics(table.get("metric", METRIC), labels, source))
    budgets = {label: len(plan.trials(label)) for label in labels}
    if len(set(budgets.values())) != 1:
        raise ConfigError(f"{source}: unequal tuning budgets {budgets}: every run (the baseline too) must get the "
                          "same number of trials; give each run a knob grid of the same size")
    return plan


def _metrics(raw: Any, labels: list[str], source: str) -> dict[str, str]:
    """``metric = "<key>"`` (every run) or a table run label -> key; each key one of :data:`METRICS`."""
    per_label = {label: raw for label in labels} if isinstance(raw, str) else raw
    if not isinstance(per_label, Mapping):
        raise ConfigError(f"{source}: [tuning] metric must be a string or a table of run label = metric, "
                          f"got {raw!r}")
    for label, key in per_label.items():
        if label not in labels:
            raise ConfigError(f"{source}: [tuning.metric] names no run '{label}' (runs: {', '.join(labels)})")
        if key not in METRICS:
            raise ConfigError(f"{source}: [tuning] metric {key!r} of run '{label}' is not one of "
                              f"{', '.join(METRICS)}")
    return {label: str(key) for label, key in per_label.items() if key != METRIC}


def _tuning_seeds(table: Mapping[str, Any], source: str) -> tuple[int, ...]:
    """``seed = s`` (one tuning federation, default 100) or ``seeds = [s1, s2, ...]`` (a trial scores the mean
    over these federations: one federation's validation score is noisy enough to pick an lr that diverges on
    others)."""
    if "seed" in table and "seeds" in table:
        raise ConfigError(f"{source}: [tuning] has both 'seed' and 'seeds'; give one")
    raw = table["seeds"] if "seeds" in table else [table.get("seed", 100)]
    if not isinstance(raw, list) or not raw or any(isinstance(v, bool) or not isinstance(v, int) for v in raw):
        raise ConfigError(f"{source}: [tuning] seeds must be a non-empty list of integers, got {raw!r}")
    if len(set(raw)) != len(raw):
        raise ConfigError(f"{source}: [tuning] seeds {raw} repeat a seed")
    return tuple(int(v) for v in raw)


def mean_score(scores: list[float]) -> float:
    """A trial's score over its tuning seeds: their mean, NaN when any is NaN (a trial that diverged on one
    federation never wins); one seed's score unchanged."""
    if any(not math.isfinite(s) for s in scores):
        return float("nan")
    return scores[0] if len(scores) == 1 else float(sum(scores) / len(scores))


def _flatten(grid: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in grid.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def score(doc: Mapping[str, Any], last_rounds: int, metric: str = METRIC) -> float:
    """Mean validation accuracy (``metric``: the global model's by default, :data:`METRICS`) over the last
    ``last_rounds`` rounds (NaN if a round lacks it: a diverged trial never wins)."""
    rows = doc["rounds"][-last_rounds:]
    vals = [r.get(metric) for r in rows]
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


def _sig3(x: float) -> float:
    return float(f"{x:.3g}")


def extend_grid(grid: tuple[float, ...], chosen: list[float], extended: dict[str, int],
                max_extend: int) -> tuple[float, ...] | None:
    """The lr grid grown by one value beyond each edge some ``chosen`` lr sits on (``extended`` counts the
    values added per side, 'low' / 'high', and is updated); None when nothing is to grow (no choice on an edge,
    or that side has ``max_extend`` values already, or the next value is outside the lr key's bounds)."""
    new = list(grid)
    for side, edge, inner in (("low", grid[0], grid[1] if len(grid) > 1 else None),
                              ("high", grid[-1], grid[-2] if len(grid) > 1 else None)):
        if edge not in chosen or extended.get(side, 0) >= max_extend:
            continue
        step = edge / inner if inner is not None else (10 ** 0.5 if side == "high" else 10 ** -0.5)
        value = _sig3(edge * step)
        try:
            check_value("lr", value)
        except ConfigError:
            continue
        if value <= 0 or value in new:
            continue
        new.append(value)
        extended[side] = extended.get(side, 0) + 1
    return tuple(sorted(new)) if len(new) > len(grid) else None


def on_edge(grid: tuple[float, ...], lr: float) -> bool:
    return len(grid) > 1 and lr in (grid[0], grid[-1])


def growable(values: tuple[Any, ...]) -> bool:
    """A knob grid that can grow past an edge (its smallest or largest value): two or more distinct float values
    (a categorical, boolean or integer knob cannot: no step to take)."""
    return len(values) > 1 and all(isinstance(v, float) for v in values) and len(set(values)) == len(values)


def knob_edges(values: tuple[float, ...]) -> tuple[float, float]:
    """(smallest, largest) value of a growable knob grid, whatever order the config lists them in."""
    return min(values), max(values)


def extend_knob(key: str, values: tuple[float, ...], chosen: float, extended: dict[str, int],
                max_extend: int) -> tuple[float, ...] | None:
    """The knob grid ``values`` of ``key`` grown by one value beyond the edge ``chosen`` sits on, by the edge's
    geometric step (edge x edge / neighbour, 3 significant digits; from a 0 neighbour: x sqrt(10) upwards); none
    below 0 (a low edge of 0 is the knob's bound, not the grid's), nor outside ``key``'s bounds, nor past
    ``max_extend`` values per side (``extended`` counts them and is updated). None when nothing grows."""
    if not growable(values) or chosen not in knob_edges(values):
        return None
    ordered = sorted(values)
    side = "low" if chosen == ordered[0] else "high"
    if extended.get(side, 0) >= max_extend:
        return None
    edge, inner = (ordered[0], ordered[1]) if side == "low" else (ordered[-1], ordered[-2])
    if edge <= 0:
        return None
    value = _sig3(edge * 10 ** 0.5) if inner == 0 else _sig3(edge * edge / inner)
    try:
        check_value(key, value)
    except ConfigError:
        return None
    if value <= 0 or value in values:
        return None
    extended[side] = extended.get(side, 0) + 1
    return tuple(sorted((*values, value)))  # sorted: a grid listed in decreasing order grows in increasing order


def inert_knobs(trials: list[tuple[dict[str, Any], float]], knobs: list[str], tolerance: float) -> list[str]:
    """The knobs whose values move no validation score by more than ``tolerance``: for each setting of the
    other values (lr and the other knobs) with two or more values of the knob tried, the scores' range is at
    most ``tolerance``, and every such score is finite (a diverged trial is a difference)."""
    out = []
    for knob in knobs:
        groups: dict[tuple, list[float]] = {}
        for values, s in trials:
            rest = tuple(sorted((k, repr(v)) for k, v in values.items() if k != knob))
            groups.setdefault(rest, []).append(s)
        compared = [g for g in groups.values() if len(g) > 1]
        if compared and all(all(math.isfinite(s) for s in g) and max(g) - min(g) <= tolerance for g in compared):
            out.append(knob)
    return out


def effective_budget(trials: list[tuple[dict[str, Any], float]], inert: list[str]) -> int:
    """The number of distinct settings of the trials' values, the inert knobs left out."""
    return len({tuple(sorted((k, repr(v)) for k, v in values.items() if k not in inert)) for values, _ in trials})


def makeup_lrs(lrs: list[float], chosen: float, count: int) -> list[float]:
    """``count`` new lr values, one at a time: the log-midpoint (3 significant digits) of the two neighbouring
    values of the run's lr set that maximise gap / (1 + distance), in natural-log units, where gap is the pair's
    log-ratio and distance that of the midpoint from the chosen lr: wide gaps near the choice are filled first."""
    have = sorted(set(lrs))
    out: list[float] = []
    while len(out) < count and len(have) > 1:
        pairs = [(math.log(b / a), _sig3(math.sqrt(a * b))) for a, b in zip(have, have[1:])]
        pairs = [(gap, mid) for gap, mid in pairs if mid not in have]
        if not pairs:
            break
        _, best = max(pairs, key=lambda p: (p[0] / (1 + abs(math.log(p[1] / chosen))), -p[1]))
        out.append(best)
        have = sorted(have + [best])
    return out
