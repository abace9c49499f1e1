"""The claims ledger's statistics: a paired comparison over seeds and the verdict it supports (issue 31).

Pure functions, no files: ``paired_gain`` turns the per-seed differences (method - baseline, same seed) into
the mean gain with a Student-t confidence interval (sample standard deviation, ddof = 1) and the two-sided
p-value of the paired t-test; ``verdict`` reads the verdict off the interval:

- **reproduced**: the interval lies above 0 and the mean gain is at least half the paper's gain (a claim
  without a paper figure: the interval above 0 is enough);
- **smaller than claimed**: the interval lies above 0, the mean gain is below half the paper's;
- **inconclusive**: the interval contains 0 (an end exactly at 0 counts as containing it);
- **contradicted**: the interval lies below 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

CONFIDENCE = 0.95
VERDICTS = ("reproduced", "smaller than claimed", "inconclusive", "contradicted")


@dataclass(frozen=True)
class PairedGain:
    n: int                   # seeds (pairs)
    mean: float              # mean difference
    sd: float                # sample standard deviation of the differences (ddof = 1)
    ci: tuple[float, float]  # Student-t interval for the mean difference at ``confidence``
    p: float                 # two-sided p-value of the paired t-test (H0: mean difference = 0)
    confidence: float = CONFIDENCE


def paired_gain(differences: Sequence[float], confidence: float = CONFIDENCE) -> PairedGain:
    """Mean of ``differences`` with its Student-t interval (n - 1 degrees of freedom) and two-sided p.

    With no spread at all (every difference equal) the interval is the point itself and p is 0 for a
    non-zero mean, 1 for a zero one (the t statistic is infinite or undefined there)."""
    d = [float(v) for v in differences]
    if len(d) < 2:
        raise ValueError(f"a paired interval needs at least 2 differences, got {len(d)}")
    if not all(math.isfinite(v) for v in d):
        raise ValueError(f"differences must be finite, got {d}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1))
    se = sd / math.sqrt(n)
    if se == 0:
        return PairedGain(n, mean, 0.0, (mean, mean), 0.0 if mean != 0 else 1.0, confidence)
    from scipy import stats as _st  # 1 s to import: only when an interval is computed, not on every collection

    half = float(_st.t.ppf(0.5 + confidence / 2, n - 1)) * se
    p = float(2 * _st.t.sf(abs(mean) / se, n - 1))
    return PairedGain(n, mean, sd, (mean - half, mean + half), p, confidence)


def verdict(gain: PairedGain, paper_gain: float | None) -> str:
    """The verdict the interval supports (module docstring); ``paper_gain`` in the same units as the gain,
    None (or not a positive number) when the paper states no comparable figure."""
    lo, hi = gain.ci
    if hi < 0:
        return "contradicted"
    if lo <= 0:
        return "inconclusive"
    has_figure = paper_gain is not None and math.isfinite(paper_gain) and paper_gain > 0
    if has_figure and gain.mean < 0.5 * float(paper_gain):
        return "smaller than claimed"
    return "reproduced"


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``pvalues`` (in their order): the i-th smallest p times (m - i + 1),
    made monotone and capped at 1. It controls the family-wise error rate, the chance of any false verdict
    among the ledger's rows, under any dependence between them; the ledger states each row's verdict on its
    own, so this (not Benjamini-Hochberg's false discovery rate) is the error it must bound."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        p = float(pvalues[i])
        if not 0 <= p <= 1:
            raise ValueError(f"p-values must be in [0, 1], got {p}")
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def rule(confidence: float = CONFIDENCE) -> str:
    """The verdict rule in words, printed above the ledger."""
    pct = f"{100 * confidence:g} %"
    return (f"Verdict from the paired gain's {pct} Student-t confidence interval (per-seed differences, ddof = 1; "
            f"p: two-sided paired t-test): **reproduced** — the interval lies above 0 and the mean gain is at least "
            f"half the paper's gain (a claim without a paper figure: the interval above 0); **smaller than "
            f"claimed** — above 0, mean below half the paper's gain; **inconclusive** — the interval contains 0; "
            f"**contradicted** — the interval lies below 0. p (Holm): the raw p adjusted by Holm's step-down method over the "
            f"ledger's measured rows (the family-wise error of all its verdicts together); the verdict words are "
            f"read off the unadjusted interval.")
