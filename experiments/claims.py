"""The claims ledger at the top of docs/RESULTS.md: each paper's headline claim against our measurement.

The claims are declared in experiments/claims.toml (paper figure, the experiment and the two runs compared,
and — written after looking at the results — the measured reason when a claim does not hold). The numbers and
the verdict are computed here from the result files:

- gain = mean over seeds of (method - baseline) final G-FL accuracy, paired by seed; +/- the std of those
  differences (>= 3 seeds required, else the claim is "not run");
- the reason may quote statistics of per-round metrics as ``{{label:metric:min|median|max|mean}}``;
- verdict: **reproduced** when gain - std > 0 and the gain is at least half the paper's; **partly** when the
  gain is positive but smaller than that or within one std; **not reproduced** when gain <= 0.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
import numpy as np

from flcore.config import PROJECT_ROOT

CLAIMS = PROJECT_ROOT / "experiments" / "claims.toml"
INTRO = PROJECT_ROOT / "docs" / "templates" / "RESULTS_claims.md"  # the ledger's prose
MIN_SEEDS = 3
METRIC = "global_accuracy"


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    claim: str
    paper_figure: str
    paper_gain: float | None      # percentage points, None when the paper states no comparable figure
    experiment: str
    baseline: str
    method: str
    reason: str = ""


@dataclass(frozen=True)
class Measured:
    seeds: int
    baseline: tuple[float, float]   # mean, std (%)
    method: tuple[float, float]
    gain: tuple[float, float]       # mean, std of paired differences (percentage points)


def load_claims(path: Path = CLAIMS) -> list[Claim]:
    with path.open("rb") as fh:
        doc = tomllib.load(fh)
    out = []
    for c in doc.get("claim", []):
        out.append(Claim(c["id"], c["paper"], c["claim"], c["paper-figure"], c.get("paper-gain"),
                         c["experiment"], c["baseline"], c["method"], c.get("reason", "").strip()))
    return out


def final_by_seed(results_root: Path, experiment: str, label: str) -> dict[int, float]:
    """seed -> final G-FL accuracy (%) of every finished run of ``experiment/label``."""
    out: dict[int, float] = {}
    for f in sorted((results_root / experiment / label).glob("seed*/results.json")):
        doc = json.loads(f.read_text())
        if len(doc["rounds"]) < int(doc["run_config"].get("num-server-rounds", 0)):
            continue
        value = doc["final"].get(METRIC)
        if value is not None:
            out[int(f.parent.name[4:])] = 100.0 * float(value)
    return out


_PLACEHOLDER = re.compile(r"\{\{([a-z0-9_.-]+):([a-z0-9_.-]+):(min|median|max|mean)\}\}")


def round_values(results_root: Path, experiment: str, label: str, key: str) -> list[float]:
    """Every finite value of ``key`` in the per-round records (the row, or its ``strategy`` metrics) of every
    finished seed of ``experiment/label``."""
    out: list[float] = []
    for f in sorted((results_root / experiment / label).glob("seed*/results.json")):
        for row in json.loads(f.read_text())["rounds"]:
            value = row.get(key, (row.get("strategy") or {}).get(key))
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                out.append(float(value))
    return out


def fill_reason(results_root: Path, claim: Claim) -> str:
    """The claim's reason with each ``{{label:metric:stat}}`` replaced by that statistic over all rounds and
    seeds of run ``label`` in the claim's experiment (so the reason's numbers come from the result files)."""
    def one(m: re.Match) -> str:
        values = round_values(results_root, claim.experiment, m.group(1), m.group(2))
        if not values:
            return f"(no '{m.group(2)}' recorded for {m.group(1)})"
        stat = {"min": np.min, "median": np.median, "max": np.max, "mean": np.mean}[m.group(3)](values)
        return f"{stat:.3g}"

    return _PLACEHOLDER.sub(one, claim.reason)


def measure(results_root: Path, claim: Claim) -> Measured | None:
    """Paired-by-seed comparison, or None with fewer than MIN_SEEDS seeds run for both."""
    base = final_by_seed(results_root, claim.experiment, claim.baseline)
    meth = final_by_seed(results_root, claim.experiment, claim.method)
    seeds = sorted(set(base) & set(meth))
    if len(seeds) < MIN_SEEDS:
        return None
    b = np.array([base[s] for s in seeds])
    m = np.array([meth[s] for s in seeds])
    d = m - b
    return Measured(len(seeds), (float(b.mean()), float(b.std())), (float(m.mean()), float(m.std())),
                    (float(d.mean()), float(d.std())))


def verdict(measured: Measured | None, paper_gain: float | None) -> str:
    if measured is None:
        return "not run"
    gain, std = measured.gain
    if gain <= 0:
        return "not reproduced"
    half = 0.5 * paper_gain if paper_gain is not None and math.isfinite(paper_gain) and paper_gain > 0 else 0.0
    if gain - std > 0 and gain >= half:
        return "reproduced"
    return "partly"


def _pm(pair: tuple[float, float], signed: bool = False) -> str:
    return f"{pair[0]:+.2f} ± {pair[1]:.2f}" if signed else f"{pair[0]:.2f} ± {pair[1]:.2f}"


def ledger(results_root: Path, claims: list[Claim], titles: dict[str, str]) -> str:
    """The markdown section (table + reasons)."""
    lines = [INTRO.read_text().rstrip("\n"), "",
             "| claim | paper | paper's figure | our setting | baseline | method | gain (pp) | seeds | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    reasons = []
    for c in claims:
        m = measure(results_root, c)
        v = verdict(m, c.paper_gain)
        setting = f"{titles.get(c.experiment, c.experiment)} ([section](#{_anchor(titles.get(c.experiment, c.experiment))}))"
        if m is None:
            cells = ["–", "–", "–", "0"]
        else:
            cells = [f"{c.baseline}: {_pm(m.baseline)}", f"{c.method}: {_pm(m.method)}", _pm(m.gain, True), str(m.seeds)]
        lines.append(f"| {c.claim} | {c.paper} | {c.paper_figure} | {setting} | " + " | ".join(cells) + f" | **{v}** |")
        if v == "not run":
            reasons.append(f"- **{c.id}** (not run): results/{c.experiment}/ has fewer than {MIN_SEEDS} finished seeds "
                           f"of both '{c.baseline}' and '{c.method}'")
        elif v != "reproduced":
            reasons.append(f"- **{c.id}** ({v}): " + (fill_reason(results_root, c) or "measured reason not yet "
                                                              "written in experiments/claims.toml"))
    if reasons:
        lines += ["", "Why, where a claim does not hold (measured):", "", *reasons]
    return "\n".join(lines)


def _anchor(title: str) -> str:
    keep = [ch.lower() if ch.isalnum() else ("-" if ch in " -" else "") for ch in title]
    return "".join(keep)


def titles_of(results_root: Path) -> dict[str, str]:
    out = {}
    for cfg in results_root.glob("*/experiment.toml"):
        with cfg.open("rb") as fh:
            out[cfg.parent.name] = tomllib.load(fh).get("experiment", {}).get("title", cfg.parent.name)
    return out


def ledger_for(results_root: Path, path: Path = CLAIMS) -> str:
    return ledger(results_root, load_claims(path), titles_of(results_root))
