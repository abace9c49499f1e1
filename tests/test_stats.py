"""The ledger's statistics (experiments/stats.py): Student-t interval and p against scipy and by hand, and the
verdict read off the interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from experiments.stats import PairedGain, paired_gain, rule, verdict


def test_interval_and_p_by_hand():
    # differences 1, 2, 3, 4, 5: mean 3, sample sd sqrt(2.5), se sqrt(0.5); t_{0.975, 4} = 2.776445105
    g = paired_gain([1, 2, 3, 4, 5])
    assert (g.n, g.mean) == (5, 3.0)
    assert g.sd == pytest.approx(math.sqrt(2.5), rel=1e-12)
    half = 2.7764451051977987 * math.sqrt(0.5)
    assert g.ci == pytest.approx((3 - half, 3 + half), rel=1e-12)
    # t = 3 / sqrt(0.5) = 4.2426; two-sided p with 4 df = 0.013236 (tables)
    assert g.p == pytest.approx(0.0132356, abs=1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_matches_scipy_paired_t_test(seed):
    rng = np.random.default_rng(seed)
    base = rng.normal(80, 5, size=3 + seed)
    meth = base + rng.normal(1.0, 2.0, size=base.size)
    g = paired_gain((meth - base).tolist())
    ref = stats.ttest_rel(meth, base)
    assert g.p == pytest.approx(ref.pvalue, rel=1e-10)
    lo, hi = stats.t.interval(0.95, base.size - 1, loc=np.mean(meth - base), scale=stats.sem(meth - base))
    assert g.ci == pytest.approx((lo, hi), rel=1e-10)
    assert g.sd == pytest.approx(np.std(meth - base, ddof=1), rel=1e-12)


def test_no_spread_and_bad_input():
    assert paired_gain([2.0, 2.0, 2.0]) == PairedGain(3, 2.0, 0.0, (2.0, 2.0), 0.0)
    assert paired_gain([0.0, 0.0]).p == 1.0
    with pytest.raises(ValueError, match="at least 2"):
        paired_gain([1.0])
    with pytest.raises(ValueError, match="finite"):
        paired_gain([1.0, float("nan")])
    with pytest.raises(ValueError, match="confidence"):
        paired_gain([1.0, 2.0], confidence=1.0)


def _g(lo: float, hi: float) -> PairedGain:
    return PairedGain(5, (lo + hi) / 2, 1.0, (lo, hi), 0.01)


@pytest.mark.parametrize("lo,hi,paper,want", [
    (1.0, 5.0, 4.0, "reproduced"),            # mean 3 >= half of 4
    (1.0, 3.0, 4.0, "reproduced"),            # mean 2 == half of 4: at least half
    (0.5, 3.0, 4.0, "smaller than claimed"),  # mean 1.75 < 2
    (0.1, 0.3, None, "reproduced"),           # no paper figure: above 0 suffices
    (-0.5, 3.0, 4.0, "inconclusive"),
    (0.0, 3.0, 4.0, "inconclusive"),          # an end at 0 contains 0
    (-3.0, 0.0, 4.0, "inconclusive"),
    (-3.0, -0.1, 4.0, "contradicted")])
def test_verdict_from_the_interval(lo, hi, paper, want):
    assert verdict(_g(lo, hi), paper) == want


def test_the_rule_states_every_verdict_and_the_method():
    text = rule()
    for word in ("reproduced", "smaller than", "inconclusive", "contradicted", "95 %", "ddof = 1", "half"):
        assert word in text


def test_holm_by_hand_and_monotone():
    from experiments.stats import holm

    # m = 4: sorted 0.01, 0.02, 0.03, 0.5 -> 0.04, 0.06, 0.06 (monotone: max(0.06, 0.03 x 2)), min(1, 0.5)
    assert holm([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    assert holm([0.4, 0.6]) == pytest.approx([0.8, 0.8])          # capped monotone: max(0.8, 0.6)
    assert holm([0.9, 0.95, 0.99]) == [1.0, 1.0, 1.0]
    assert holm([]) == []
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([0.1, 1.5])


def test_holm_matches_its_definition_on_random_p():
    import numpy as np

    from experiments.stats import holm

    p = np.random.default_rng(3).uniform(size=9)
    order = np.argsort(p)
    want = np.maximum.accumulate(np.minimum(1, (9 - np.arange(9)) * p[order]))
    got = np.array(holm(list(p)))[order]
    assert np.allclose(got, want)
