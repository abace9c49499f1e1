"""Paired equivalence tables: is arm A as accurate as arm B, seed by seed? (issue 44's bf16 against fp32.)

An experiment lists ``paired = [["a", "b"], ...]`` and ``paired-margin = m`` (points) in its [experiment] table.
Per pair, the seeds both arms finished give the differences of final G-FL accuracy (a - b, in points, seed k
against seed k: the same partition, initial model and sampling); their mean, Student-t 95 % interval and paired
t-test p come from experiments/stats.py. Verdict: **equivalent within ±m** when the interval lies inside
[-m, +m]; **not shown equivalent** when it reaches past either end (too few seeds or a real difference: the
interval says which); **different** when it lies wholly outside [-m, +m].
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.stats import paired_gain


def final_accuracy(doc: dict[str, Any]) -> float:
    return 100.0 * float(doc["final"]["global_accuracy"])


def by_seed(docs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {int(d["run_config"]["seed"]): d for d in docs}


def equivalence(lo: float, hi: float, margin: float) -> str:
    """The verdict an interval [lo, hi] supports against the margin (module docstring)."""
    if -margin <= lo and hi <= margin:
        return f"equivalent within ±{margin:g}"
    if hi < -margin or lo > margin:
        return "different"
    return "not shown equivalent"


def paired_rows(runs: dict[str, list[dict[str, Any]]], pairs: list[list[str]], margin: float) -> list[dict[str, Any]]:
    """One row per pair whose arms share at least two finished seeds."""
    rows = []
    for a, b in pairs:
        da, db = by_seed(runs.get(a, [])), by_seed(runs.get(b, []))
        seeds = sorted(set(da) & set(db))
        if len(seeds) < 2:
            continue
        diffs = [final_accuracy(da[s]) - final_accuracy(db[s]) for s in seeds]
        g = paired_gain(diffs)
        rows.append({"a": a, "b": b, "seeds": seeds, "differences": diffs, "mean": g.mean, "ci": g.ci, "p": g.p,
                     "a_mean": sum(final_accuracy(da[s]) for s in seeds) / len(seeds),
                     "b_mean": sum(final_accuracy(db[s]) for s in seeds) / len(seeds),
                     "verdict": equivalence(g.ci[0], g.ci[1], margin)})
    return rows


def paired_table(runs: dict[str, list[dict[str, Any]]], pairs: list[list[str]], margin: float) -> list[str]:
    """The markdown lines of the pairs' table ([] when no pair has two shared seeds)."""
    rows = paired_rows(runs, pairs, margin)
    if not rows:
        return []
    lines = [f"**Paired differences** of final G-FL accuracy (points, first - second, seed against seed; 95 % "
             f"Student-t interval, paired t-test; equivalent when the interval lies within ±{margin:g}):", "",
             "| pair | n | first | second | difference | 95 % CI | p | per seed | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per_seed = ", ".join(f"{d:+.2f}" for d in r["differences"])
        lines.append(f"| {r['a']} − {r['b']} | {len(r['seeds'])} | {r['a_mean']:.2f} | {r['b_mean']:.2f} | "
                     f"{r['mean']:+.2f} | [{r['ci'][0]:+.2f}, {r['ci'][1]:+.2f}] | {r['p']:.3f} | {per_seed} | "
                     f"**{r['verdict']}** |")
    return lines + [""]


def versus_best_rows(root: Path, experiment: str, groups: list[list[str]], paper: dict[str, Any]) -> list[dict[str, Any]]:
    """Per group ``[method, baseline, baseline, ...]`` (a paper table's column): the method against the baseline
    with the highest mean score over the seeds both finished, seed against seed. The score is the claims ledger's
    (experiments/claims.py: mean G-FL accuracy over the tuning's last rounds, in %). Picking the best baseline by
    its reported mean is the comparison least favourable to the method. The verdict is the ledger's, with the
    paper's gain over its own best baseline of the same group (``paper``: ``[paper.g-fl]`` fractions)."""
    from experiments.claims import final_by_seed  # (claims imports nothing of this module)
    from experiments.stats import verdict

    rows = []
    figures = paper.get("g-fl") or {}
    for method, *baselines in groups:
        ours = final_by_seed(root, experiment, method)
        best = None
        for b in baselines:
            theirs = final_by_seed(root, experiment, b)
            seeds = sorted(set(ours) & set(theirs))
            if len(seeds) < 2:
                continue
            mean = sum(theirs[s] for s in seeds) / len(seeds)
            if best is None or mean > best[1]:
                best = (b, mean, theirs, seeds)
        if best is None:
            continue
        b, b_mean, theirs, seeds = best
        g = paired_gain([ours[s] - theirs[s] for s in seeds])
        known = [figures[x] for x in baselines if x in figures]
        paper_gain = 100 * (figures[method] - max(known)) if method in figures and known else None
        rows.append({"method": method, "baseline": b, "n": len(seeds), "method_mean": sum(ours[s] for s in seeds) /
                     len(seeds), "baseline_mean": b_mean, "gain": g, "paper_gain": paper_gain,
                     "verdict": verdict(g, paper_gain)})
    return rows


def versus_best_table(root: Path, experiment: str, groups: list[list[str]], paper: dict[str, Any]) -> list[str]:
    """The markdown lines of :func:`versus_best_rows` ([] when no group has two shared seeds)."""
    rows = versus_best_rows(root, experiment, groups, paper)
    if not rows:
        return []
    lines = ["**Against the best baseline** of each column (the baseline with the highest mean score over the "
             "shared seeds; score: mean G-FL accuracy over the tuning's last rounds, %; gain = method − baseline, "
             "seed against seed, 95 % Student-t interval, paired t-test; verdict as in the claims ledger, against the "
             "paper's gain over its own best baseline of the column):", "",
             "| method | best baseline | n | method | baseline | gain | 95 % CI | p | paper's gain | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r["gain"]
        paper_gain = f"{r['paper_gain']:+.2f}" if r["paper_gain"] is not None else "-"
        lines.append(f"| {r['method']} | {r['baseline']} | {r['n']} | {r['method_mean']:.2f} | {r['baseline_mean']:.2f} "
                     f"| {g.mean:+.2f} | [{g.ci[0]:+.2f}, {g.ci[1]:+.2f}] | {g.p:.3f} | {paper_gain} | "
                     f"**{r['verdict']}** |")
    return lines + [""]
