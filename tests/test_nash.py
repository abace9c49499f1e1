"""Nash-bargaining solvers of FedRANE's GNE (strategies/methods/fedrane/nash.py): values, invariants, agreement,
failures."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest

from strategies.methods.fedrane.nash import (STATUS_CONVERGED, STATUS_SOLVER_FAILED, combine_deltas, delta_gram,
                             floating_keys, nash_degenerate, nash_residual, simplex_min_quadratic,
                             solve_nash_cvxpy, solve_nash_newton)


def random_gram(k: int, seed: int, d: int = 400, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Deltas with a shared drift plus client-specific parts of different sizes (G is d x K)."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(d, k)) * rng.uniform(0.2, 3.0, size=k) + rng.normal(size=(d, 1))
    g *= scale
    return g.T @ g, g


@pytest.mark.parametrize("k", [1, 2, 5, 20, 100])
def test_newton_solves_nash_equation_on_random_grams(k):
    m, _ = random_gram(k, seed=k)
    sol = solve_nash_newton(m)
    assert sol.status == STATUS_CONVERGED
    assert np.all(sol.p > 0)
    np.testing.assert_allclose(sol.p * (m @ sol.p), 1.0, atol=1e-10)  # Eq. 15: p_k (M p)_k = 1
    assert sol.residual < 1e-10


@pytest.mark.parametrize("k", [2, 20, 100])
def test_cvxpy_solves_nash_equation_and_agrees_with_newton(k):
    m, g = random_gram(k, seed=100 + k)
    cv = solve_nash_cvxpy(m)
    nt = solve_nash_newton(m)
    assert cv.status == STATUS_CONVERGED and 1 <= cv.iterations <= 20
    np.testing.assert_allclose(cv.p * (m @ cv.p), 1.0, atol=1e-4)
    np.testing.assert_allclose(cv.p, nt.p, rtol=1e-4)
    d_cv, d_nt = g @ cv.p, g @ nt.p
    assert d_cv @ d_nt / (np.linalg.norm(d_cv) * np.linalg.norm(d_nt)) > 1 - 1e-8


def test_one_client_closed_form():
    # K = 1: p^2 ||Delta||^2 = 1  ->  p = 1 / ||Delta|| = 1/2 for M = [[4]]
    for solve in (solve_nash_newton, solve_nash_cvxpy):
        np.testing.assert_allclose(solve(np.array([[4.0]])).p, [0.5], rtol=1e-6)


def test_orthogonal_equal_norm_deltas_get_equal_weights():
    a = 3.0
    m = np.diag([a * a, a * a])          # two orthogonal deltas of norm 3
    for solve in (solve_nash_newton, solve_nash_cvxpy):
        p = solve(m, p0=np.array([0.9, 0.1])).p   # an unbalanced start must not matter
        np.testing.assert_allclose(p, [1 / a, 1 / a], rtol=1e-6)


def test_orthogonal_deltas_give_equal_angles():
    # orthogonal deltas: p_k = 1/||Delta_k||, so G p = sum of unit vectors: the same angle to every client
    norms = np.array([0.5, 1.0, 4.0])
    m = np.diag(norms ** 2)
    p = solve_nash_newton(m).p
    np.testing.assert_allclose(p, 1 / norms, rtol=1e-10)
    cos = (m @ p) / (norms * math.sqrt(p @ m @ p))
    np.testing.assert_allclose(cos, 1 / math.sqrt(3), rtol=1e-10)


def test_identical_deltas_equal_weights_along_common_direction():
    delta = np.array([1.0, -2.0, 2.0])   # norm 3
    g = np.stack([delta] * 4, axis=1)
    sol = solve_nash_newton(g.T @ g)
    # p_k * 9 * sum(p) = 1 with equal p -> p = 1 / (3 * sqrt(4)) = 1/6
    np.testing.assert_allclose(sol.p, np.full(4, 1 / 6), rtol=1e-10)
    np.testing.assert_allclose(g @ sol.p, 2 * delta / 3, rtol=1e-10)  # along delta, norm sqrt(K) = 2


def test_scale_invariance():
    m, _ = random_gram(6, seed=3)
    p1 = solve_nash_newton(m).p
    for s in (1e-8, 1e6):
        np.testing.assert_allclose(solve_nash_newton(s * m).p, p1 / math.sqrt(s), rtol=1e-9)
        np.testing.assert_allclose(solve_nash_cvxpy(s * m).p, p1 / math.sqrt(s), rtol=1e-4)


def test_cvxpy_start_with_nonpositive_mp_uses_central_start():
    # the second delta is anti-correlated with the first: at the uniform start (M p)_2 < 0
    g = np.array([[1.0, -0.95], [0.0, 0.2]])
    m = g.T @ g
    assert (m @ np.ones(2))[1] < 0
    sol = solve_nash_cvxpy(m, p0=np.ones(2))
    assert sol.status == STATUS_CONVERGED and "argmax phi" in sol.message
    np.testing.assert_allclose(sol.p, solve_nash_newton(m).p, rtol=1e-4)


def test_cvxpy_failure_keeps_start_and_never_raises():
    m, _ = random_gram(5, seed=9)
    start = np.array([0.1, 0.2, 0.3, 0.2, 0.2])
    sol = solve_nash_cvxpy(m, p0=start, solver="NO-SUCH-SOLVER")
    assert sol.status == STATUS_SOLVER_FAILED and sol.iterations == 0 and "NO-SUCH-SOLVER" in sol.message
    # the start point, put on the optimal scale along its ray: s = sqrt(K / v^T M v)
    np.testing.assert_allclose(sol.p, start * math.sqrt(5 / (start @ m @ start)), rtol=1e-12)


def test_residual_definition():
    m = np.array([[2.0, 0.0], [0.0, 8.0]])
    assert nash_residual(m, np.array([1 / math.sqrt(2), 1 / math.sqrt(8)])) == pytest.approx(0.0, abs=1e-15)
    assert nash_residual(m, np.array([1.0, 1.0])) == pytest.approx(math.hypot(1.0, 7.0))


def test_degenerate_cases_are_detected():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=20), rng.normal(size=20)
    opposite = np.stack([a, -a, b], axis=1)
    assert "vanishes" in nash_degenerate(opposite.T @ opposite)
    zero = np.stack([a, np.zeros(20), b], axis=1)
    assert "zero" in nash_degenerate(zero.T @ zero)
    # three deltas at 120 degrees in a plane: their sum is zero
    star = np.array([[1.0, -0.5, -0.5], [0.0, math.sqrt(3) / 2, -math.sqrt(3) / 2]])
    assert nash_degenerate(star.T @ star) is not None
    assert nash_degenerate(np.zeros((3, 3))) == "all deltas are zero"
    # more clients than dimensions, but all within 90 degrees: a solution exists
    fan = np.array([[1.0, 0.8, 0.6], [0.0, 0.6, 0.8]])
    assert nash_degenerate(fan.T @ fan) is None
    np.testing.assert_allclose(solve_nash_newton(fan.T @ fan).residual, 0.0, atol=1e-10)
    for k in (2, 20, 100):
        assert nash_degenerate(random_gram(k, seed=k)[0]) is None


def test_simplex_min_quadratic_known_value():
    # M = diag(1, 4): min over the simplex of v1^2 + 4 v2^2 is at v = (4/5, 1/5), value 4/5
    value, u = simplex_min_quadratic(np.diag([1.0, 4.0]))
    assert value == pytest.approx(0.8, rel=1e-9)
    np.testing.assert_allclose(u, [0.8, 0.2], rtol=1e-9)


def _params(rng: np.random.Generator) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict([("conv.weight", rng.normal(size=(4, 3, 2, 2)).astype(np.float32)),
                        ("fc.bias", rng.normal(size=(7,)).astype(np.float32)),
                        ("steps", np.array(3, dtype=np.int64))])


def test_delta_gram_matches_explicit_gram_streaming_in_chunks():
    rng = np.random.default_rng(1)
    glob = _params(rng)
    clients = [_params(rng) for _ in range(5)]
    keys = floating_keys(glob)
    assert keys == ["conv.weight", "fc.bias"]  # integer buffers take no part
    g = np.stack([np.concatenate([(c[k].astype(np.float64) - glob[k]).ravel() for k in keys]) for c in clients], 1)
    for chunk in (3, 7, 1 << 22):  # chunks smaller than K, odd sizes, whole layers
        np.testing.assert_allclose(delta_gram(glob, clients, chunk_elems=chunk), g.T @ g, rtol=1e-12)


def test_combine_deltas_is_weighted_average_for_convex_coefficients():
    rng = np.random.default_rng(2)
    glob = _params(rng)
    clients = [_params(rng) for _ in range(3)]
    w = np.array([0.5, 0.3, 0.2])
    out = combine_deltas(glob, clients, w)
    expect = sum(wk * c["conv.weight"].astype(np.float64) for wk, c in zip(w, clients))
    np.testing.assert_allclose(out["conv.weight"], expect, rtol=1e-6)
    assert out["conv.weight"].dtype == np.float32 and out["steps"].dtype == np.int64
    # theta + sum c_k Delta_k with non-convex coefficients
    c = np.array([2.0, -1.0, 0.5])
    expect = glob["fc.bias"] + sum(ck * (cl["fc.bias"].astype(np.float64) - glob["fc.bias"]) for ck, cl in zip(c, clients))
    np.testing.assert_allclose(combine_deltas(glob, clients, c)["fc.bias"], expect, rtol=1e-5)
