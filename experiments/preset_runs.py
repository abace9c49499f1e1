"""Which paper presets have been run, and how far from the paper's values (RESULTS.md, "Paper-scale presets").

A preset (flcore/paper_presets.py) is one paper setting: data, partition, model, clients and method, plus the
paper's budget and hyper-parameters. A reported run (``results/<experiment>/<label>/seed*/results.json``, tuning
trials excluded) is *in a preset's setting* when its recorded run config has the preset's method and the
preset's value of every setting key the preset sets (:data:`SETTING_KEYS`) and, where the run records it
(client_split.json), the preset's number of clients. A run in the setting of several presets (FedBC's Table 1
columns differ only in E) counts for the one whose budget and hyper-parameters it differs from in the fewest keys.
For each (experiment, run label) the status names the keys where the run departs from the preset's resolved
config (defaults < method recipe < preset), so a CPU-budget or tuned run is never shown as the paper's own.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

# The keys that make a federation what it is: a run that differs in one of them is another setting.
SETTING_KEYS = ("method", "dataset", "partition", "dirichlet-alpha", "shards-per-client", "classes-per-client",
                "power-law-exponent", "synthetic-alpha", "synthetic-beta", "synthetic-prior-scale",
                "synthetic-max-samples", "rotation-step-deg", "model")
# Budget keys compared whether or not a preset sets them (a step cap or a precision changes what a run measures).
BUDGET_KEYS = ("num-server-rounds", "local-epochs", "max-local-steps", "batch-size", "fraction-train", "lr",
               "momentum", "weight-decay", "local-test-fraction", "precision")


class _NotRecorded:
    def __repr__(self) -> str:
        return "not recorded"


NOT_RECORDED = _NotRecorded()  # a key the run's results.json does not hold (it predates the key)


@dataclass(frozen=True)
class PresetRun:
    """The reported runs of one (experiment, label) in a preset's setting: ``differs`` maps each departing key to
    (the runs' value, the preset's value)."""

    experiment: str
    label: str
    seeds: int
    differs: Mapping[str, tuple[Any, Any]]


def _compared_keys(preset_values: Mapping[str, Any]) -> list[str]:
    """The preset's own non-setting keys (its method's knobs among them), then the budget keys it leaves out."""
    keys = [k for k in preset_values if k not in SETTING_KEYS]
    return keys + [k for k in BUDGET_KEYS if k not in keys]


def in_setting(run_config: Mapping[str, Any], clients: int | None, preset_values: Mapping[str, Any],
               num_supernodes: int) -> bool:
    """Whether a run (its recorded config, its number of clients or None) is in the preset's setting."""
    if any(run_config.get(k) != v for k, v in preset_values.items() if k in SETTING_KEYS):
        return False
    return clients is None or not num_supernodes or clients == num_supernodes


def departures(run_config: Mapping[str, Any], resolved: Mapping[str, Any],
               preset_values: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """key -> (run's value, preset's value) where the run departs from the preset's resolved config; a key the
    run did not record (a run older than the key) departs as :data:`NOT_RECORDED`."""
    return {k: (run_config.get(k, NOT_RECORDED), resolved[k]) for k in _compared_keys(preset_values)
            if k in resolved and run_config.get(k, NOT_RECORDED) != resolved[k]}


def _reported_runs(results_root: Path) -> list[tuple[str, str, dict[str, Any], int | None]]:
    """(experiment, label, run config, clients or None) of every reported run under results_root."""
    out = []
    for f in sorted(results_root.glob("*/*/seed*/results.json")):
        experiment, label = f.parts[-4], f.parts[-3]
        config = json.loads(f.read_text()).get("run_config") or {}
        split = f.parent / "client_split.json"
        clients = json.loads(split.read_text()).get("num_partitions") if split.exists() else None
        out.append((experiment, label, config, clients))
    return out


def preset_runs(results_root: Path) -> dict[str, list[PresetRun]]:
    """preset name -> the reported (experiment, label) groups in its setting, each counted for one preset only."""
    from flcore.config import resolve_run_config
    from flcore.presets import presets

    table = presets()
    resolved = {name: resolve_run_config({"preset": name}) for name in table}
    groups: dict[tuple[str, str, str], list[dict[str, tuple[Any, Any]]]] = defaultdict(list)
    for experiment, label, config, clients in _reported_runs(results_root):
        fits = [(len(d), name, d) for name, p in table.items()
                if in_setting(config, clients, p.values, p.num_supernodes)
                for d in [departures(config, resolved[name], p.values)]]
        if fits:
            _, name, differs = min(fits, key=lambda t: (t[0], t[1]))
            groups[(name, experiment, label)].append(differs)
    out: dict[str, list[PresetRun]] = defaultdict(list)
    for (name, experiment, label), runs in sorted(groups.items()):
        keys = sorted({k for d in runs for k in d},
                      key=lambda k: (BUDGET_KEYS.index(k) if k in BUDGET_KEYS else len(BUDGET_KEYS), k))
        theirs = resolved[name]
        merged = {k: (" / ".join(sorted({_show(d[k][0] if k in d else theirs[k]) for d in runs})), _show(theirs[k]))
                  for k in keys}
        out[name].append(PresetRun(experiment, label, len(runs), merged))
    return dict(out)


def _show(value: Any) -> str:
    if value is NOT_RECORDED:
        return "not recorded"
    return json.dumps(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


def status(runs: list[PresetRun]) -> str:
    """The table cell: the (experiment, label) groups run in the preset's setting, or not run."""
    if not runs:
        return "**not run**"
    return "setting run: " + ", ".join(f"`{r.experiment}` {r.label} ({r.seeds} seed{'s' * (r.seeds > 1)})"
                                       for r in runs)


def departures_lines(name: str, runs: list[PresetRun]) -> list[str]:
    """One list item per group: how its runs depart from preset ``name`` (values over its seeds joined by /)."""
    lines = []
    for r in runs:
        how = "; ".join(f"{k} {ours} (preset {theirs})" for k, (ours, theirs) in r.differs.items())
        lines.append(f"- `{name}` in `{r.experiment}` {r.label}: " + (how or "the preset's values throughout"))
    return lines
