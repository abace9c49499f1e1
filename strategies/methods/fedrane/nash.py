"""Nash-bargaining aggregation weights (FedRANE's GNE, seed 000, Sec. 3.4), as pure functions.

Given the deltas Delta_k = theta_k - theta_t of the K sampled clients (columns of G, d x K), GNE looks for
the update Delta = G p that maximises sum_k log(Delta_k^T Delta) on a ball (paper Eq. 12). Its KKT
conditions (Eq. 14) give

    G^T G p = 1 / p   (elementwise),  i.e.  p_k (M p)_k = 1 for every k,  M = G^T G.        (Eq. 15)

Two solvers are offered:

* :func:`solve_nash_cvxpy` -- the paper's (and Nash-MTL's) sequence of convex programs, Eq. 16: with
  M_hat = M / c, c = ||M||_F, linearise phi(p) = sum_k log p_k + log (M_hat p)_k at the previous iterate
  and solve  min sum_k (M_hat p)_k + grad phi(p_prev)^T (p - p_prev) / c
             s.t. -log(c p_k) - log((M_hat p)_k) <= 0  (<=> p_k (M p)_k >= 1),  p >= 0.
* :func:`solve_nash_newton` -- beyond the paper: M p = 1/p is exactly the stationarity condition of
  f(p) = 1/2 p^T M p - sum_k log p_k, smooth and strictly convex on p > 0 (Hessian M + diag(1/p^2)),
  minimised by a damped Newton method with a positivity-keeping backtracking line search.

A minimiser exists iff no non-negative, non-zero combination of the deltas vanishes
(min over the simplex of v^T M v > 0); :func:`nash_degenerate` checks this before solving.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
from scipy.optimize import nnls

from flcore.named_arrays import Arrays


STATUS_CONVERGED = "converged"
STATUS_MAX_ITER = "max-iter"
STATUS_SOLVER_FAILED = "solver-failed"


@dataclass(frozen=True)
class NashSolution:
    """Weights p (original scale: p_k (M p)_k ~ 1), iterations used, residual ||p * Mp - 1||, status."""

    p: np.ndarray
    iterations: int
    residual: float
    status: str
    message: str = ""


# ------------------------------------------------------------------------------------------ Gram matrix
def _delta_blocks(global_params: Arrays, client_params: Sequence[Arrays], key: str, chunk_elems: int
                  ) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (start, stop, block) over one flattened tensor: block[k] = Delta_k[start:stop] in float64.

    One float64 buffer of at most ``chunk_elems`` values is reused across chunks, so the peak extra memory
    is O(chunk_elems) rather than O(K d); the float32 -> float64 subtraction is exact.
    """
    k = len(client_params)
    ref = np.asarray(global_params[key]).ravel()
    step = max(1, chunk_elems // k)
    buf = np.empty((k, min(step, ref.size)), dtype=np.float64)
    for start in range(0, ref.size, step):
        stop = min(ref.size, start + step)
        block = buf[:, : stop - start]
        for i, params in enumerate(client_params):
            flat = np.asarray(params[key]).ravel()
            if flat.size != ref.size:
                raise ValueError(f"client {i}: tensor {key!r} has {flat.size} values, the global model {ref.size}")
            np.subtract(flat[start:stop], ref[start:stop], out=block[i], dtype=np.float64)
        yield start, stop, block


def delta_gram(global_params: Arrays, client_params: Sequence[Arrays], keys: Sequence[str] | None = None,
               chunk_elems: int = 1 << 22) -> np.ndarray:
    """M = G^T G for the deltas Delta_k = theta_k - theta_t, accumulated layer by layer in float64.

    Never materialises G: each tensor is flattened and processed in chunks of at most ``chunk_elems``
    values across all K clients (:func:`_delta_blocks`). ``block @ block.T`` is a symmetric rank-n update
    (numpy hands it to BLAS ``syrk``). ``keys`` defaults to every floating-point tensor of ``global_params``.
    """
    k = len(client_params)
    if k == 0:
        raise ValueError("delta_gram needs at least one client")
    keys = list(keys) if keys is not None else floating_keys(global_params)
    gram = np.zeros((k, k), dtype=np.float64)
    for key in keys:
        for _, _, block in _delta_blocks(global_params, client_params, key, chunk_elems):
            gram += block @ block.T
    return 0.5 * (gram + gram.T)


def combine_deltas(global_params: Arrays, client_params: Sequence[Arrays], coef: np.ndarray,
                   chunk_elems: int = 1 << 22) -> "OrderedDict[str, np.ndarray]":
    """theta_t + sum_k coef_k (theta_k - theta_t), per tensor in float64, cast back to each dtype (Eq. 10).

    Floating tensors are combined chunk by chunk as one matrix-vector product coef @ block over the
    same float64 delta blocks as :func:`delta_gram`; integer buffers are rounded back to integers.
    """
    coef = np.asarray(coef, dtype=np.float64)
    if coef.shape != (len(client_params),):
        raise ValueError(f"need one coefficient per client, got {coef.shape} for {len(client_params)} clients")
    out: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for key, g in global_params.items():
        base = np.asarray(g)
        acc: np.ndarray = base.astype(np.float64).ravel()  # a fresh copy
        for start, stop, block in _delta_blocks(global_params, client_params, key, chunk_elems):
            acc[start:stop] += coef @ block
        acc = acc.reshape(base.shape)
        out[key] = np.rint(acc).astype(base.dtype) if np.issubdtype(base.dtype, np.integer) else acc.astype(base.dtype)
    return out


def floating_keys(params: Arrays) -> list[str]:
    return [k for k, v in params.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]


# ------------------------------------------------------------------------------------------ diagnostics
def nash_residual(gram: np.ndarray, p: np.ndarray) -> float:
    """||p * (M p) - 1||_2: zero exactly at the Nash-bargaining solution (Eq. 15); scale-free."""
    p = np.asarray(p, dtype=np.float64)
    return float(np.linalg.norm(p * (gram @ p) - 1.0))


def simplex_min_quadratic(gram: np.ndarray) -> tuple[float, np.ndarray]:
    """min_{v in simplex} v^T M v and its minimiser, exactly, by non-negative least squares.

    With M = R^T R, minimising ||R v||^2 + (1^T v - 1)^2 over v >= 0 has its minimiser on the ray of the
    simplex minimiser u (on the ray v = s u the value is q s^2 + (s - 1)^2, whose minimum q / (1 + q)
    increases with q = u^T M u), so v / sum(v) solves the simplex problem.
    """
    m = np.asarray(gram, dtype=np.float64)
    k = m.shape[0]
    evals, evecs = np.linalg.eigh(0.5 * (m + m.T))
    r = np.sqrt(np.clip(evals, 0.0, None))[:, None] * evecs.T      # R^T R = M (PSD part)
    a = np.vstack([r, np.ones((1, k))])
    b = np.zeros(k + 1)
    b[-1] = 1.0
    v, _ = nnls(a, b, maxiter=50 * k)
    if v.sum() <= 0:
        v = np.full(k, 1.0 / k)
    u = v / v.sum()
    return float(u @ m @ u), u


def nash_degenerate(gram: np.ndarray, tol: float = 1e-10) -> str | None:
    """Why Eq. 15 has no solution (a non-negative combination of the deltas is ~0), or None if it has one.

    Tested relative to the largest squared delta norm: min_{v in simplex} v^T M v <= tol * max_k M_kk.
    """
    m = np.asarray(gram, dtype=np.float64)
    diag = np.diag(m)
    scale = float(diag.max()) if diag.size else 0.0
    if not np.all(np.isfinite(m)):
        return "Gram matrix has NaN/Inf entries"
    if scale <= 0.0:
        return "all deltas are zero"
    zero = np.flatnonzero(diag <= tol * scale)
    if zero.size:
        return f"delta(s) of client position(s) {zero.tolist()} are zero"
    value, u = simplex_min_quadratic(m / scale)
    if value <= tol:
        support = np.flatnonzero(u > 1e-8).tolist()
        return (f"a non-negative combination of the deltas (positions {support}) vanishes: "
                f"min over the simplex of v^T M v / max ||Delta_k||^2 = {value:.3g}")
    return None


def _scaled_start(gram: np.ndarray, p0: np.ndarray | None) -> np.ndarray:
    """A positive start on the ray of p0 (default: uniform) at the scale minimising f along that ray.

    Along p = s v, f(s v) = s^2/2 v^T M v - K log s - sum log v is minimal at s = sqrt(K / v^T M v).
    """
    k = gram.shape[0]
    v = np.full(k, 1.0 / k) if p0 is None else np.asarray(p0, dtype=np.float64).copy()
    if v.shape != (k,) or not np.all(np.isfinite(v)) or np.any(v <= 0):
        v = np.full(k, 1.0 / k)
    q = float(v @ gram @ v)
    if not q > 0:
        return v
    return v * math.sqrt(k / q)


def _validate(gram: np.ndarray) -> np.ndarray:
    m = np.asarray(gram, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or m.shape[0] == 0:
        raise ValueError(f"Gram matrix must be square and non-empty, got shape {m.shape}")
    return 0.5 * (m + m.T)


# ------------------------------------------------------------------------------------------ Newton
def solve_nash_newton(gram: np.ndarray, p0: np.ndarray | None = None, tol: float = 1e-12,
                      max_iter: int = 100) -> NashSolution:
    """Minimise f(p) = 1/2 p^T M p - sum_k log p_k by damped Newton; its stationary point solves Eq. 15.

    Works on M_hat = M / c (c = ||M||_F) and maps back with p = p_hat / sqrt(c) (if M_hat p_hat = 1/p_hat
    then M p = c M_hat p_hat / sqrt(c) = 1/p). f is self-concordant (a convex quadratic plus a log
    barrier), so the classical damped Newton step needs no line search: with the Newton direction
    d = -(M_hat + diag(1/p^2))^{-1} (M_hat p - 1/p) and decrement lam = sqrt(-grad^T d), take
    p <- p + d / (1 + lam) while lam >= 1/4 and the full step after; each step stays inside p > 0
    (Dikin ellipsoid) and the final phase converges quadratically. Stops when
    ||p * M_hat p - 1|| < ``tol`` or lam < 1e-14. The caller must rule out the degenerate case
    (:func:`nash_degenerate`); there f is unbounded below and no step count suffices.
    """
    m = _validate(gram)
    c = float(np.linalg.norm(m))
    if not c > 0:
        raise ValueError("Gram matrix is zero: no Nash-bargaining solution")
    mh = m / c
    p = _scaled_start(mh, None if p0 is None else np.asarray(p0) * math.sqrt(c))
    status, it = STATUS_MAX_ITER, 0
    for it in range(max_iter + 1):
        mp = mh @ p
        if np.linalg.norm(p * mp - 1.0) < tol:
            status = STATUS_CONVERGED
            break
        if it == max_iter:
            break
        grad = mp - 1.0 / p
        hess = mh + np.diag(1.0 / p ** 2)
        try:
            d = -np.linalg.solve(hess, grad)
        except np.linalg.LinAlgError:
            d = -np.linalg.lstsq(hess, grad, rcond=None)[0]
        lam = math.sqrt(max(-float(grad @ d), 0.0))
        if lam < 1e-14:
            status = STATUS_CONVERGED
            break
        t = 1.0 / (1.0 + lam) if lam >= 0.25 else 1.0
        neg = d < 0
        if np.any(neg):  # guard against round-off: never leave p > 0
            t = min(t, 0.99 * float(np.min(-p[neg] / d[neg])))
        p = p + t * d
    p_orig = p / math.sqrt(c)
    return NashSolution(p_orig, it, nash_residual(m, p_orig), status)


# ------------------------------------------------------------------------------------------ cvxpy CCP
def solve_nash_cvxpy(gram: np.ndarray, p0: np.ndarray | None = None, max_iter: int = 20, tol: float = 1e-3,
                     step_tol: float = 1e-6, solver: str = "CLARABEL") -> NashSolution:
    """The paper's sequential convex approximation of Eq. 16 (Nash-MTL's programme), solved with cvxpy.

    With c = ||M||_F, M_hat = M / c and the normalised weights p_hat = sqrt(c) p (so that
    p_hat_k (M_hat p_hat)_k = p_k (M p)_k), iterate from p_hat_prev:
        p_hat = argmin_{p_hat >= 0}  sum_k (M_hat p_hat)_k + grad phi(p_hat_prev)^T (p_hat - p_hat_prev)
                s.t.  -log(p_hat_k) - log((M_hat p_hat)_k) <= 0   for every k,
    where phi(p) = sum_k log p_k + log (M_hat p)_k (grad phi = 1/p + M_hat^T (1 / M_hat p)).
    Deviation from Nash-MTL's code, which keeps p in original units and divides the gradient term by c:
    that weighting is not scale invariant, and for ||M||_F >> 1 it converged to points with residual
    ~1e3 in our tests; on the normalised problem the programme is scale free and lands at residual ~1e-6.

    Starts from p0 (e.g. sample fractions or last round's weights), put on the optimal scale along its ray;
    if (M_hat p0)_k <= 0 for some k the linearisation is undefined and the start becomes
    argmax_{p in simplex} phi(p) (one extra convex programme). Stops after ``max_iter`` programmes, or
    when ||M_hat p_hat - 1/p_hat|| < ``tol`` or ||p_hat - p_hat_prev|| < ``step_tol``. A solver failure
    (exception, non-optimal status, non-finite values) ends the loop and returns the last good iterate
    with status "solver-failed" and the reason in ``message``; it never raises.
    """
    import cvxpy as cp  # local import: cvxpy is only needed on the server with gne-solver = cvxpy

    m = _validate(gram)
    k = m.shape[0]
    c = float(np.linalg.norm(m))
    if not c > 0:
        raise ValueError("Gram matrix is zero: no Nash-bargaining solution")
    mh = m / c
    sq = math.sqrt(c)
    ph_prev = _scaled_start(mh, None if p0 is None else np.asarray(p0) * sq)
    message = ""
    if np.any(mh @ ph_prev <= 0):
        ph_prev, message = _central_start(mh, solver)

    ph_var = cp.Variable(k, nonneg=True)
    lin_par = cp.Parameter(k)
    mh_p = mh @ ph_var
    problem = cp.Problem(cp.Minimize(cp.sum(mh_p) + lin_par @ ph_var),   # constant term dropped
                         [-cp.log(ph_var) - cp.log(mh_p) <= 0])

    status, it = STATUS_MAX_ITER, 0
    for it in range(1, max_iter + 1):
        q_prev = np.maximum(mh @ ph_prev, 1e-12)
        lin_par.value = 1.0 / ph_prev + mh.T @ (1.0 / q_prev)
        try:
            problem.solve(solver=solver, warm_start=True)
            ph_new = None
            if problem.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) and ph_var.value is not None:
                ph_new = np.asarray(ph_var.value, dtype=np.float64)
                if not np.all(np.isfinite(ph_new)) or np.any(ph_new <= 0):
                    ph_new = None
            if ph_new is None:
                message = f"cvxpy status '{problem.status}' at iteration {it}"
        except Exception as exc:  # noqa: BLE001 - any solver failure keeps the last good weights
            ph_new, message = None, f"{type(exc).__name__}: {exc} at iteration {it}"
        if ph_new is None:
            status, it = STATUS_SOLVER_FAILED, it - 1
            break
        step = float(np.linalg.norm(ph_new - ph_prev))
        ph_prev = ph_new
        if np.linalg.norm(mh @ ph_new - 1.0 / ph_new) < tol or step < step_tol:
            status = STATUS_CONVERGED
            break
    p = ph_prev / sq
    return NashSolution(p, it, nash_residual(m, p), status, message)


def _central_start(mh: np.ndarray, solver: str) -> tuple[np.ndarray, str]:
    """argmax_{p in simplex} sum_k log p_k + log (M_hat p)_k, rescaled; a start with M_hat p > 0.

    Such a point exists whenever Eq. 15 has a solution (there M_hat p = 1/p > 0). Falls back to the
    uniform start (and says so) if the programme fails.
    """
    import cvxpy as cp

    k = mh.shape[0]
    v = cp.Variable(k, nonneg=True)
    try:
        cp.Problem(cp.Maximize(cp.sum(cp.log(v)) + cp.sum(cp.log(mh @ v))), [cp.sum(v) == 1]).solve(solver=solver)
        start = None if v.value is None else np.maximum(np.asarray(v.value, dtype=np.float64), 1e-12)
    except Exception:  # noqa: BLE001
        start = None
    if start is None or np.any(mh @ start <= 0):
        return _scaled_start(mh, None), "start point had (M p)_k <= 0 and the central start failed"
    return _scaled_start(mh, start), "start point had (M p)_k <= 0: started from argmax phi on the simplex"


SOLVERS = {"cvxpy": solve_nash_cvxpy, "newton": solve_nash_newton}
