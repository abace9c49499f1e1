"""Put runs side by side: ``noniid-fl compare RUN_OR_DIR ...`` (issue 33).

Inputs are run folders (``runs/<name>/results.json``, server_app/results.py) and experiment result folders
(``results/<experiment>/``, ``results/<experiment>/<label>/``, ``.../seed<k>/``); a folder without a
results.json is searched below for them (a ``tuning/`` folder's trials only when named). Runs whose run
config is equal but for the seed and the keys that do not change the numbers (``NOT_CONFIG``) form one
group: per round the mean over its seeds with a band (min–max, or mean ± std with ``band='std'``). Runs
are compared only on one test set: the dataset and every key that shapes its G-FL test set must agree
(``test_set_identity``), else :class:`CompareError` names the runs and the key.

The figure is experiments/compare_plot.py; the table, :func:`table_text`.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from experiments.legacy import current_run_config
from flcore.config import ConfigError, defaults
from flcore.stack import ROOT, describe
from server_app.results import recorded_target

# keys that name where or how a run ran, not what it computed: runs differing only in these (and the seed)
# are seeds of one configuration
NOT_CONFIG = frozenset({"seed", "out-dir", "overwrite", "resume-from", "checkpoint", "client-state-dir",
                        "data-root", "download", "device", "engine", "engine-workers", "preset-applied",
                        "round-timeout", "reply-poll-interval", "target-accuracy", "tensorboard"})
POOLED = ("mnist-5k", "digits", "rotated-mnist")  # offline pools: global-test-fraction of the pool is the test set
# the commit from which the G-FL test split is fixed per dataset (issue 31 item 7); before it, it followed the seed
FIXED_SPLIT_COMMIT = "3d987425f2e924c2c06018f4d59a6fe08c58380c"
SPLIT_MARKER = "test_split.json"  # experiments/run.py writes it beside experiment.toml since that commit
FIXED, BY_SEED, UNKNOWN = "fixed per dataset", "drawn with the run seed (before issue 31)", "unknown"
BANDS = ("minmax", "std")


class CompareError(ValueError):
    """Runs that cannot be compared, or a path that holds no run."""


@dataclass
class Run:
    """One results.json: where it is, the label it is shown under, its run config (today's key names, every
    key) and rounds, its stack, and which test split scheme produced its G-FL numbers."""

    path: Path
    label: str
    run_config: dict[str, Any]
    rounds: list[dict[str, Any]]
    stack: dict[str, Any] | None
    split: str
    final: dict[str, Any] = field(default_factory=dict)


@dataclass
class Group:
    """Runs of one configuration (seeds)."""

    label: str
    runs: list[Run] = field(default_factory=list)

    @property
    def seeds(self) -> list[int]:
        return [int(r.run_config["seed"]) for r in self.runs]


# ---------------------------------------------------------------- finding and reading runs

def find_results(path: Path) -> list[Path]:
    """The results.json files ``path`` names: its own, or every one below it (``tuning/`` folders skipped
    unless ``path`` is inside one), sorted."""
    if path.is_file() and path.name == "results.json":
        return [path]
    if not path.is_dir():
        raise CompareError(f"{path}: no such run folder (expected a folder holding results.json, or one above such folders)")
    if (path / "results.json").is_file():
        return [path / "results.json"]
    inside_tuning = "tuning" in path.resolve().parts
    found = [p for p in path.rglob("results.json")
             if inside_tuning or "tuning" not in p.relative_to(path).parts]
    if not found:
        raise CompareError(f"{path}: no results.json in this folder or below it")
    return sorted(found)


def experiment_dir(results_json: Path) -> Path | None:
    """``results/<experiment>`` for ``results/<experiment>/<label>/seed<k>/results.json``, else None."""
    seed_dir = results_json.parent
    if seed_dir.name.startswith("seed") and (seed_dir.parent.parent / "experiment.toml").is_file():
        return seed_dir.parent.parent
    return None


def label_of(results_json: Path) -> str:
    """``<experiment>/<label>`` for an experiment's seed folder, else the run folder's name."""
    exp = experiment_dir(results_json)
    if exp is not None:
        return f"{exp.name}/{results_json.parent.parent.name}"
    return results_json.parent.name


def commit_has_fixed_split(commit: str, repo: Path = ROOT) -> bool | None:
    """Whether ``commit`` contains FIXED_SPLIT_COMMIT (None: this checkout cannot tell, e.g. no git or a commit
    it does not have)."""
    try:
        proc = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", FIXED_SPLIT_COMMIT, commit],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {0: True, 1: False}.get(proc.returncode)


def split_scheme(results_json: Path, stack: dict[str, Any] | None) -> str:
    """How the run's G-FL test split was drawn: an experiment's marker file says it for its runs; a lone run
    is told by the commit its stack names (a run without a stack predates the stack and so the fix)."""
    exp = experiment_dir(results_json)
    if exp is not None:
        return FIXED if (exp / SPLIT_MARKER).is_file() else BY_SEED
    if not stack:
        return BY_SEED
    commit = (stack.get("git") or {}).get("commit")
    has = commit_has_fixed_split(commit) if commit else None
    return UNKNOWN if has is None else FIXED if has else BY_SEED


def load_run(results_json: Path) -> Run:
    """Read one results.json (run-config keys renamed since under their current names, keys added since at
    their declared defaults)."""
    try:
        doc = json.loads(results_json.read_text())
        recorded = doc["run_config"]
        rounds = doc["rounds"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CompareError(f"{results_json}: not a run's results.json ({exc})") from None
    try:
        rc = {**defaults(), **current_run_config(recorded, str(results_json))}
    except ConfigError as exc:
        raise CompareError(str(exc)) from None
    return Run(results_json.parent, label_of(results_json), rc, rounds, doc.get("stack"),
               split_scheme(results_json, doc.get("stack")), doc.get("final") or {})


def collect(paths: Iterable[Path]) -> list[Run]:
    """Every run the paths name, each once (``runs/latest`` and the run it links are one run)."""
    seen: dict[Path, Run] = {}
    for path in paths:
        for f in find_results(Path(path)):
            key = f.resolve()
            if key not in seen:
                seen[key] = load_run(f)
    if not seen:
        raise CompareError("no runs given")
    return list(seen.values())


# ---------------------------------------------------------------- the test set and grouping

def test_set_identity(run: Run) -> dict[str, Any]:
    """The keys that fix a run's G-FL test set (data-root does not: it says where the files are). The
    torchvision datasets use their official test set; an offline pool holds out global-test-fraction of it;
    rotated-mnist rotates test image i by client (i mod K)'s angle; synthetic's test set is the union of K
    clients' held-out parts; a hf: dataset (its columns in the name) uses its test split, or without one
    global-test-fraction of its train split. Before issue 31 the pools' and synthetic's test split followed the run seed."""
    rc = run.run_config
    dataset = rc["dataset"]
    ident: dict[str, Any] = {"dataset": dataset}
    if str(dataset).startswith("hf:"):  # its test split, or (none) global-test-fraction held out of train
        ident["global-test-fraction (hf: datasets without a test split)"] = rc["global-test-fraction"]
        return ident
    if dataset not in POOLED and dataset != "synthetic":
        return ident
    ident["test split"] = run.split
    if run.split == BY_SEED:
        ident["seed"] = rc["seed"]
    if dataset in POOLED:
        ident["global-test-fraction"] = rc["global-test-fraction"]
    if dataset in ("rotated-mnist", "synthetic"):
        ident["number of clients"] = num_clients(run)
    if dataset == "rotated-mnist":
        ident["rotation-step-deg"] = rc["rotation-step-deg"]
    if dataset == "synthetic":
        ident["synthetic-alpha"] = rc["synthetic-alpha"]
        ident["synthetic-beta"] = rc["synthetic-beta"]
        # issue 40's generator options; a run recorded before them drew with 'variance' and the 2000 cap
        ident["synthetic-prior-scale"] = rc.get("synthetic-prior-scale", "variance")
        if ident["synthetic-alpha"] == ident["synthetic-beta"] == 1.0:  # both readings draw the same data
            ident["synthetic-prior-scale"] = "std = variance (alpha = beta = 1)"
        ident["synthetic-max-samples"] = rc.get("synthetic-max-samples", 2000)
        held = rc["local-test-fraction"] or rc["global-test-fraction"]
        ident["held-out fraction (local-test-fraction, else global-test-fraction)"] = held
    return ident


def num_clients(run: Run) -> int | None:
    """The number of clients: results.json's final.num_clients (written at the end of a run)."""
    n = run.final.get("num_clients")
    return int(n) if n else None


def check_same_test_set(runs: list[Run]) -> None:
    """Refuse runs measured on different test sets, naming two such runs and the first key that differs."""
    first = runs[0]
    ref = test_set_identity(first)
    for run in runs[1:]:
        ident = test_set_identity(run)
        for key in [*ref, *(k for k in ident if k not in ref)]:
            if ref.get(key) != ident.get(key):
                raise CompareError(
                    f"runs {first.path} and {run.path} were measured on different test sets: {key} is "
                    f"{ref.get(key)!r} vs {ident.get(key)!r}; compare runs of one dataset and test split only")


def own_section(method: str) -> str | None:
    """The config section ``method`` reads (None: none, or a method this version does not know)."""
    from flcore.registry import methods

    decl = methods().get(method)
    return decl.config.NAME if decl is not None and decl.config is not None else None


def config_of(run: Run) -> tuple[tuple[str, str], ...]:
    """The run config as a hashable, order-free key: the common keys but NOT_CONFIG, and the keys of the
    run's method's own section (other methods' sections do not change its numbers)."""
    section = own_section(str(run.run_config["method"]))
    return tuple(sorted((k, repr(v)) for k, v in run.run_config.items()
                        if k not in NOT_CONFIG and ("." not in k or k.split(".", 1)[0] == section)))


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs with equal configs (but for NOT_CONFIG) as groups, in the order first seen. A group's label is its
    runs' common label, else its first run's label with '+N' for the others; labels are made unique."""
    groups: dict[tuple, Group] = {}
    for run in runs:
        groups.setdefault(config_of(run), Group("")).runs.append(run)
    out = list(groups.values())
    used: dict[str, int] = {}
    for g in out:
        labels = sorted({r.label for r in g.runs})
        base = labels[0] if len(labels) == 1 else f"{labels[0]} +{len(labels) - 1}"
        used[base] = used.get(base, 0) + 1
        g.label = base if used[base] == 1 else f"{base} ({used[base]})"
    return out


def differing_keys(groups: list[Group]) -> list[str]:
    """The config keys whose value differs between groups (what the comparison varies); a method section's
    key, between the groups whose method reads it."""
    configs = [dict(config_of(g.runs[0])) for g in groups]
    keys = sorted({k for c in configs for k in c}, key=lambda k: ("." in k, k))
    return [k for k in keys if len({c[k] for c in configs if k in c}) > 1]


# ---------------------------------------------------------------- per-round series and the table

def column_values(run: Run, column: str) -> dict[int, float]:
    """round -> value of ``column`` (rounds where it is missing or None left out)."""
    return {int(r["round"]): float(r[column]) for r in run.rounds if r.get(column) is not None}


def series(group: Group, column: str, band: str = "minmax") -> tuple[np.ndarray, ...]:
    """(rounds, mean, low, high) of ``column`` over the group's runs, at every round at least one run has it.
    band 'minmax': low/high are the min and max over the runs; 'std': mean -/+ the standard deviation (ddof 0)."""
    if band not in BANDS:
        raise CompareError(f"band must be one of {', '.join(BANDS)}, got {band!r}")
    per_run = [column_values(r, column) for r in group.runs]
    rounds = sorted({k for v in per_run for k in v})
    mean, low, high = [], [], []
    for rnd in rounds:
        vals = np.array([v[rnd] for v in per_run if rnd in v])
        mean.append(vals.mean())
        if band == "minmax":
            low.append(vals.min())
            high.append(vals.max())
        else:
            low.append(vals.mean() - vals.std())
            high.append(vals.mean() + vals.std())
    return tuple(np.asarray(a, dtype=float) for a in (rounds, mean, low, high))


def run_summary(run: Run, target: float | None = None) -> dict[str, Any]:
    """From the run's rounds: final and best G-FL accuracy, rounds to the target (the run's target-accuracy
    unless ``target``), mean seconds per round, rounds done."""
    acc = column_values(run, "global_accuracy")
    tgt = recorded_target(run.run_config) if target is None else float(target)
    last = max(acc) if acc else None
    times = [float(r["wall_time_s"]) for r in run.rounds if r.get("wall_time_s") is not None]
    return {"final": acc[last] if last is not None else None, "best": max(acc.values()) if acc else None,
            "to_target": next((k for k in sorted(acc) if acc[k] >= tgt), None), "target": tgt,
            "time": float(np.mean(times)) if times else None, "rounds": len(run.rounds)}


def _stat(values: list[float | None], scale: float, decimals: int, missing_word: str = "without it") -> str:
    """mean ± sample std of the values given, and how many runs had none (e.g. '(1 never)')."""
    vals = [v * scale for v in values if v is not None]
    if not vals:
        return "–"
    text = f"{np.mean(vals):.{decimals}f}"
    if len(vals) > 1:
        text += f" ± {np.std(vals, ddof=1):.{decimals}f}"
    missing = len(values) - len(vals)
    return text + (f" ({missing} {missing_word})" if missing else "")


def stacks(groups: list[Group]) -> list[str]:
    """The distinct stacks the runs name (flcore.stack.describe), in order first seen."""
    out: list[str] = []
    for g in groups:
        for r in g.runs:
            line = describe(r.stack)
            if line not in out:
                out.append(line)
    return out


HEADERS = ("run", "seeds", "rounds", "final G-FL %", "best G-FL %", "rounds to target", "s/round", "setting", "stack")


def table_rows(groups: list[Group], target: float | None = None) -> list[list[str]]:
    """One row per group: mean ± std (sample std, ddof 1) over its seeds; 'never' counts runs that did not
    reach the target; setting: the group's values of the keys that differ between groups; stack: the
    number(s) of :func:`stacks`."""
    known = stacks(groups)
    varies = differing_keys(groups)
    rows = []
    for g in groups:
        sums = [run_summary(r, target) for r in g.runs]
        targets = sorted({s["target"] for s in sums})
        reached = [float(s["to_target"]) if s["to_target"] is not None else None for s in sums]
        to_target = _stat(reached, 1, 1, "never") + f" (≥{'/'.join(f'{100 * t:g}' for t in targets)}%)"
        rows.append([g.label, ",".join(map(str, sorted(g.seeds))), "/".join(map(str, sorted({s["rounds"] for s in sums}))),
                     _stat([s["final"] for s in sums], 100, 2), _stat([s["best"] for s in sums], 100, 2),
                     to_target, _stat([s["time"] for s in sums], 1, 2),
                     " ".join(f"{k}={g.runs[0].run_config[k]}" for k in varies if k in dict(config_of(g.runs[0])))
                     or "–",
                     ",".join(f"[{i}]" for i in sorted({known.index(describe(r.stack)) + 1 for r in g.runs}))])
    return rows


def table_text(groups: list[Group], markdown: bool = False, target: float | None = None) -> str:
    """The comparison table (aligned text, or Markdown), then what varies between groups and the stacks."""
    rows = table_rows(groups, target)
    if markdown:
        lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths)).rstrip()]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    varies = differing_keys(groups)
    lines += ["", "mean ± std over seeds (sample std); varies between runs: " + (", ".join(varies) or "nothing but the seed")]
    lines += [f"stack [{i}]: {s}" for i, s in enumerate(stacks(groups), 1)]
    return "\n".join(lines) + "\n"


def compare(paths: Iterable[Path]) -> list[Group]:
    """Collect, check one test set, group."""
    runs = collect(paths)
    check_same_test_set(runs)
    return group_runs(runs)
