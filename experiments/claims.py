"""The claims ledger at the top of docs/RESULTS.md: each paper's headline claim against our measurement.

The claims are declared in experiments/claims.toml (paper figure, the experiment and the two runs compared,
and — written after looking at the results — the measured reason when a claim does not hold). The numbers and
the verdict are computed here from the result files:

- gain = mean over seeds of (method - baseline) G-FL accuracy, paired by seed, each run scored by its mean over
  the last k rounds with k the experiment's tuning ``last-rounds`` (the rule its choices were selected by; the
  final round for an untuned experiment), with its Student-t 95 %
  interval and two-sided p (experiments/stats.py); a claim needs ``min-seeds`` paired seeds (default 5; a
  row whose setting cannot afford that, e.g. full Fashion-MNIST on this CPU, may declare 3 and the table
  says so), else it is "not run";
- the verdict is read off the interval (experiments/stats.py: reproduced, smaller than claimed, inconclusive,
  contradicted), and the rule is printed above the ledger;
- the reason may quote statistics of per-round metrics as ``{{label:metric:min|median|max|mean}}`` (over all
  rounds of all seeds) or ``{{label:metric:last}}`` (the median over seeds of each seed's last round), and the
  row's paired differences as ``{{gain:min|max|positive|n}}`` (smallest / largest per-seed gain, the number of
  seeds with a positive gain, the number of seeds), and another run of the experiment against the row's baseline,
  under the row's score rule, as ``{{vs:label:mean|ci|p}}``.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
import numpy as np

from experiments.near_ties import WORST_FIRST, arm_choices, choice_dir, load_tuning, pair_summary
from experiments.stats import PairedGain, holm, paired_gain, rule, verdict as ci_verdict
from flcore.config import PROJECT_ROOT

CLAIMS = PROJECT_ROOT / "experiments" / "claims.toml"
INTRO = PROJECT_ROOT / "docs" / "templates" / "RESULTS_claims.md"  # the ledger's prose
MIN_SEEDS = 5       # paired seeds a claim needs unless it declares fewer (never below FLOOR_SEEDS)
FLOOR_SEEDS = 3
METRIC = "global_accuracy"
METRICS = {"global_accuracy": "G-FL", "local_accuracy": "P-FL"}  # a claim's `metric`: what the row scores


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
    min_seeds: int = MIN_SEEDS
    metric: str = METRIC          # global_accuracy (G-FL, the global model on the test set) or local_accuracy (P-FL)


@dataclass(frozen=True)
class Measured:
    seeds: int
    baseline: tuple[float, float]   # mean, sample std (ddof = 1) over the paired seeds (%)
    method: tuple[float, float]
    gain: PairedGain                # of the paired differences (percentage points)


def load_claims(path: Path = CLAIMS) -> list[Claim]:
    with path.open("rb") as fh:
        doc = tomllib.load(fh)
    out = []
    for c in doc.get("claim", []):
        min_seeds = c.get("min-seeds", MIN_SEEDS)
        if not isinstance(min_seeds, int) or isinstance(min_seeds, bool) or min_seeds < FLOOR_SEEDS:
            raise ValueError(f"{path}: claim '{c.get('id')}': min-seeds must be an integer >= {FLOOR_SEEDS}, "
                             f"got {min_seeds!r}")
        metric = c.get("metric", METRIC)
        if metric not in METRICS:
            raise ValueError(f"{path}: claim '{c.get('id')}': metric must be one of {', '.join(METRICS)}, "
                             f"got {metric!r}")
        out.append(Claim(c["id"], c["paper"], c["claim"], c["paper-figure"], c.get("paper-gain"),
                         c["experiment"], c["baseline"], c["method"], c.get("reason", "").strip(), min_seeds,
                         metric))
    return out


def score_rounds(results_root: Path, experiment: str) -> int:
    """How many last rounds a row's score averages: the experiment's tuning ``last-rounds`` (the rule its trials
    were selected by, experiments/tuning.py's default 3 when unset), 1 (the final round) for an untuned one."""
    path = results_root / experiment / "experiment.toml"
    if not path.exists():
        return 1
    with path.open("rb") as fh:
        table = tomllib.load(fh).get("tuning")
    return 1 if table is None else int(table.get("last-rounds", 3))


def final_by_seed(results_root: Path, experiment: str, label: str, last: int | None = None,
                  metric: str = METRIC) -> dict[int, float]:
    """seed -> the row's score (%) of every finished run of ``experiment/label``: the mean of ``metric`` (G-FL
    accuracy by default, :data:`METRICS`) over its last ``last`` rounds (default :func:`score_rounds`: the same
    rule the tuning selected on; 1 = final)."""
    k = score_rounds(results_root, experiment) if last is None else last
    out: dict[int, float] = {}
    for f in sorted((results_root / experiment / label).glob("seed*/results.json")):
        doc = json.loads(f.read_text())
        if len(doc["rounds"]) < int(doc["run_config"].get("num-server-rounds", 0)):
            continue
        if k == 1:
            value = doc["final"].get(metric)
        else:
            values = [row.get(metric) for row in doc["rounds"][-k:]]
            value = None if len(values) < k or any(v is None for v in values) else float(np.mean(values))
        if value is not None:
            out[int(f.parent.name[4:])] = 100.0 * float(value)
    return out


_PLACEHOLDER = re.compile(r"\{\{([a-z0-9_.-]+):([a-z0-9_.-]+):(min|median|max|mean|last)\}\}")


def round_values(results_root: Path, experiment: str, label: str, key: str, last: bool = False) -> list[float]:
    """Every finite value of ``key`` in the per-round records (the row, or its ``strategy`` metrics) of every
    finished seed of ``experiment/label``; with ``last``, each seed's value in its last round that has one."""
    out: list[float] = []
    for f in sorted((results_root / experiment / label).glob("seed*/results.json")):
        seed: list[float] = []
        for row in json.loads(f.read_text())["rounds"]:
            value = row.get(key, (row.get("strategy") or {}).get(key))
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                seed.append(float(value))
        out += seed[-1:] if last else seed
    return out


_GAIN = re.compile(r"\{\{gain:(min|max|positive|n)\}\}")
_VS = re.compile(r"\{\{vs:([a-z0-9_.-]+):(mean|ci|p)\}\}")  # another run of the experiment against the baseline


def paired_differences(results_root: Path, claim: Claim) -> list[float]:
    """Per-seed gains (method - baseline, percentage points) over the seeds run for both."""
    base = final_by_seed(results_root, claim.experiment, claim.baseline, metric=claim.metric)
    meth = final_by_seed(results_root, claim.experiment, claim.method, metric=claim.metric)
    return [meth[s] - base[s] for s in sorted(set(base) & set(meth))]


def fill_reason(results_root: Path, claim: Claim) -> str:
    """The claim's reason with each ``{{label:metric:stat}}`` replaced by that statistic over all rounds and
    seeds of run ``label`` in the claim's experiment, and each ``{{gain:stat}}`` by that statistic of the
    row's per-seed gains (so the reason's numbers come from the result files)."""
    diffs = paired_differences(results_root, claim)

    def gain(m: re.Match) -> str:
        if not diffs:
            return "(no paired seeds)"
        stat = m.group(1)
        if stat in ("positive", "n"):
            return str(sum(d > 0 for d in diffs) if stat == "positive" else len(diffs))
        return f"{(min if stat == 'min' else max)(diffs):+.2f}"

    def one(m: re.Match) -> str:
        values = round_values(results_root, claim.experiment, m.group(1), m.group(2), last=m.group(3) == "last")
        if not values:
            return f"(no '{m.group(2)}' recorded for {m.group(1)})"
        stat = {"min": np.min, "median": np.median, "max": np.max, "mean": np.mean,
                "last": np.median}[m.group(3)](values)
        return f"{stat:.3g}"

    def versus(m: re.Match) -> str:
        base = final_by_seed(results_root, claim.experiment, claim.baseline, metric=claim.metric)
        other = final_by_seed(results_root, claim.experiment, m.group(1), metric=claim.metric)
        seeds = sorted(set(base) & set(other))
        if len(seeds) < 2:
            return f"(no paired seeds of {m.group(1)})"
        g = paired_gain([other[k] - base[k] for k in seeds])
        return {"mean": f"{g.mean:+.2f}", "ci": f"[{g.ci[0]:+.2f}, {g.ci[1]:+.2f}]", "p": _p(g.p)}[m.group(2)]

    return _PLACEHOLDER.sub(one, _VS.sub(versus, _GAIN.sub(gain, claim.reason)))


def measure(results_root: Path, claim: Claim) -> Measured | None:
    """Paired-by-seed comparison, or None with fewer than the claim's ``min_seeds`` seeds run for both."""
    base = final_by_seed(results_root, claim.experiment, claim.baseline, metric=claim.metric)
    meth = final_by_seed(results_root, claim.experiment, claim.method, metric=claim.metric)
    seeds = sorted(set(base) & set(meth))
    if len(seeds) < claim.min_seeds:
        return None
    b = np.array([base[s] for s in seeds])
    m = np.array([meth[s] for s in seeds])
    return Measured(len(seeds), (float(b.mean()), float(b.std(ddof=1))), (float(m.mean()), float(m.std(ddof=1))),
                    paired_gain((m - b).tolist()))


CHOSEN = " (chosen)"   # the mark a near-tie pair's slug carries for an arm's chosen (reported) choice


@dataclass(frozen=True)
class NearTies:
    """A claim's verdict over the near-tie pairs (experiments/near_ties.py): every baseline choice x every method
    choice, paired by seed. ``pairs``: (baseline slug, method slug, gain or None while not run, verdict word)."""

    pairs: list[tuple[str, str, PairedGain | None, str]]

    @property
    def run(self) -> list[tuple[str, str, PairedGain | None, str]]:
        return [p for p in self.pairs if p[2] is not None]

    @property
    def has_near_tie_runs(self) -> bool:
        """Whether a run pair has a near-tie choice on either side: runs made for the near-tie verdict, on the
        machine and code of the near-tie runs; the chosen x chosen pair is the reported runs' alone."""
        return any(not (b.endswith(CHOSEN) and m.endswith(CHOSEN)) for b, m, *_ in self.run)

    def summary(self) -> tuple[str, str]:
        """(the worst run pair's word, the text of the ledger's near-tie column)."""
        words = [w for *_, w in self.run]
        head, text = pair_summary(words)
        if len(self.run) < len(self.pairs):
            counts = ", ".join(f"{w} in {words.count(w)}" for w in dict.fromkeys(sorted(words, key=_worst_first)))
            text = f"{len(self.run)} of {len(self.pairs)} pairs run" + (f" ({counts})" if words else "")
        return head, text


def _worst_first(word: str) -> int:
    return WORST_FIRST.index(word)


def near_ties(results_root: Path, claim: Claim) -> NearTies | None:
    """The claim's near-tie pairs, or None when its experiment has no tuning (nothing to be near)."""
    tuning = load_tuning(results_root, claim.experiment)
    if tuning is None or not {claim.baseline, claim.method} <= set(tuning.get("runs", {})):
        return None
    arms = {label: [(c.slug + (CHOSEN if c.chosen else ""),
                     final_by_seed(results_root, claim.experiment,
                                   str(choice_dir(results_root, claim.experiment, label, c)
                                       .relative_to(results_root / claim.experiment)), metric=claim.metric))
                    for c in arm_choices(tuning, label)] for label in (claim.baseline, claim.method)}
    # a pair counts once it has every seed of the chosen pair (the reported seeds), never a subset
    reported = set(arms[claim.baseline][0][1]) & set(arms[claim.method][0][1])
    pairs = []
    for b_slug, base in arms[claim.baseline]:
        for m_slug, meth in arms[claim.method]:
            seeds = sorted(set(base) & set(meth) & reported)
            if len(seeds) < max(len(reported), claim.min_seeds):
                pairs.append((b_slug, m_slug, None, f"not run ({len(seeds)} of {len(reported)} seeds)"))
                continue
            gain = paired_gain([meth[k] - base[k] for k in seeds])
            pairs.append((b_slug, m_slug, gain, ci_verdict(gain, claim.paper_gain)))
    return NearTies(pairs)


def chosen_check_caveat(results_root: Path, experiment: str) -> str:
    """Where the near-tie runs' machine did not reproduce a chosen (reported) run (near-ties/chosen_check.json,
    ``--check-chosen``): the caveat that the pairs then mix the difference of the two runs with the choice."""
    path = results_root / experiment / "near-ties" / "chosen_check.json"
    if not path.exists():
        return ""
    check = json.loads(path.read_text())
    bad = {k: r for k, r in check.get("runs", {}).items() if r.get("status") == "differs"}
    if not bad:
        return ""
    stack = check.get("stack") or {}
    cpu = f"{stack.get('cpu_capability', '?')} CPU kernels" if stack else "another stack"
    worst = max(float(r.get("max_abs_difference") or 0.0) for r in bad.values())
    return (f"caveat: the chosen run re-run where the near-tie runs ran ({cpu}, seed {check.get('seed')}) differs "
            f"from the reported one ({', '.join(sorted(bad))}; largest per-round difference in G-FL accuracy or "
            f"loss {worst:.3f}): a near-tie pair there also carries what differs between the two runs (the machine's "
            f"rounding, code changed since the reported run), not only the choice")


def verdict(measured: Measured | None, paper_gain: float | None) -> str:
    return "not run" if measured is None else ci_verdict(measured.gain, paper_gain)


def _pm(pair: tuple[float, float]) -> str:
    return f"{pair[0]:.2f} ± {pair[1]:.2f}"


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def ledger(results_root: Path, claims: list[Claim], titles: dict[str, str]) -> str:
    """The markdown section (table + reasons)."""
    lines = [INTRO.read_text().rstrip("\n"), "", rule(), "",
             "| claim | paper | paper's figure | our setting | baseline | method | n | gain (pp) | 95 % CI | p | "
             "p (Holm) | near-tie pairs | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    reasons = []
    measured = {c.id: measure(results_root, c) for c in claims}
    run = [cid for cid, m in measured.items() if m is not None]
    adjusted = dict(zip(run, holm([measured[cid].gain.p for cid in run])))
    pair_lines = []
    for c in claims:
        m = measured[c.id]
        v = verdict(m, c.paper_gain)
        ties = near_ties(results_root, c) if m is not None else None
        tie_cell = "– (untuned)" if ties is None else ties.summary()[1]
        if ties is not None and ties.run:
            worst = ties.summary()[0]
            v_pair = v
            v = worst
            pair_lines.append(f"- **{c.id}** (chosen pair: {v_pair}; headline: the worst pair's, {worst}):")
            # a re-run that differs matters only where a pair mixes the reported runs with near-tie runs
            caveat = chosen_check_caveat(results_root, c.experiment) if ties.has_near_tie_runs else ""
            if caveat:
                pair_lines.append(f"  - {caveat}")
            for b_slug, m_slug, gain, word in ties.pairs:
                shown = (word if gain is None else
                         f"{gain.mean:+.2f} [{gain.ci[0]:+.2f}, {gain.ci[1]:+.2f}], p {_p(gain.p)}, n {gain.n}: {word}")
                pair_lines.append(f"  - {c.baseline} {b_slug} x {c.method} {m_slug}: {shown}")
        k = score_rounds(results_root, c.experiment)
        setting = (f"{titles.get(c.experiment, c.experiment)} ([section](#{_anchor(titles.get(c.experiment, c.experiment))}))"
                   + (f"; score: last {k} rounds" if k > 1 else "")
                   + (f"; {METRICS[c.metric]} (clients' own models, own test splits)" if c.metric != METRIC else ""))
        if m is None:
            cells = ["–", "–", "0", "–", "–", "–", "–", "–"]
        else:
            g = m.gain
            n = f"{m.seeds}" + (f" (min-seeds {c.min_seeds})" if c.min_seeds < MIN_SEEDS else "")
            cells = [f"{c.baseline}: {_pm(m.baseline)}", f"{c.method}: {_pm(m.method)}", n, f"{g.mean:+.2f}",
                     f"[{g.ci[0]:+.2f}, {g.ci[1]:+.2f}]", _p(g.p), _p(adjusted[c.id]), tie_cell]
        lines.append(f"| {c.claim} | {c.paper} | {c.paper_figure} | {setting} | " + " | ".join(cells) + f" | **{v}** |")
        if v == "not run":
            reasons.append(f"- **{c.id}** (not run): results/{c.experiment}/ has fewer than {c.min_seeds} finished "
                           f"seeds of both '{c.baseline}' and '{c.method}'")
        elif v != "reproduced" or c.reason:  # a reproduced claim's reason is a caveat the verdict needs
            reasons.append(f"- **{c.id}** ({v}): " + (fill_reason(results_root, c) or "measured reason not yet "
                                                              "written in experiments/claims.toml"))
    if reasons:
        lines += ["", "Why, where a claim does not hold (measured), and a caveat where one holds:", "", *reasons]
    if pair_lines:
        lines += ["", "Near-tie pairs (experiments/near_ties.py: every near-tie choice of the baseline x every one of "
                  "the method, the reported seeds, paired by seed; gain in points, 95 % CI, raw p):", "", *pair_lines]
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
