"""Paired equivalence tables: is arm A as accurate as arm B, seed by seed? (issue 44's bf16 against fp32.)

An experiment lists ``paired = [["a", "b"], ...]`` and ``paired-margin = m`` (points) in its [experiment] table.
Per pair, the seeds both arms finished give the differences of final G-FL accuracy (a - b, in points, seed k
against seed k: the same partition, initial model and sampling); their mean, Student-t 95 % interval and paired
t-test p come from experiments/stats.py. Verdict: **equivalent within ±m** when the interval lies inside
[-m, +m]; **not shown equivalent** when it reaches past either end (too few seeds or a real difference: the
interval says which); **different** when it lies wholly outside [-m, +m].
"""

from __future__ import annotations

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
