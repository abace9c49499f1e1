"""FedBC's server-side math as pure functions (seed 001, "FL beyond consensus", Sec. 3).

Problem (7): min_{x_k, z} sum_k f_k(x_k)  s.t.  ||x_k - z||^2 <= gamma_k.
Lagrangian (8): L = sum_k [ f_k(x_k) + lambda_k (||x_k - z||^2 - gamma_k) ].

Server steps of Algorithm 1 for the clients k that returned a valid update in round t:
    d_k        = ||x_k - z_t||^2                                   (constraint value)
    lambda_k  <- Proj_[0, lambda_max](lambda_k + eta_l * (d_k - gamma_k))          Eq. (11)
    gamma_k   <- gamma_k - eta_g * dL/dgamma_k = gamma_k + eta_g * lambda_k      ("Selection of gamma")
    z_{t+1}    = sum_k lambda_k x_k / sum_k lambda_k                              Eq. (12)/(13)
Two forms of the heavy-ball dual step (run-config key ``fedbc.dual-step``):
- ``per-client`` (:func:`dual_ascent`, :func:`gamma_step`): each client's lambda_k and gamma_k keep their own
  buffer, buf <- beta * buf + g; value <- value + eta * buf, taken only when client k returns an update;
- ``code`` (:func:`code_dual_step`): the authors' code (chenfan95/FedBC main_fed.py __main__, "Update lamb (dual
  ascent)") holds lambda and gamma of ALL devices as two vectors under one torch.optim.SGD(lr=lamb_lr,
  momentum=lamb_momentum) and steps it after each client: the gradient is zero except at that client, but the
  momentum buffers of every device decay and move their multipliers at every step, sampled or not; lambda is
  clamped to >= 0 afterwards (all entries). Eq. 11 in the paper is the plain projected step of one client.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Mapping, Sequence

import numpy as np

from strategies.aggregation import weighted_average


def squared_distance(params: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """||x_k - z||^2 summed over every floating-point tensor (float64; integer buffers are skipped).

    This is the constraint function of problem (7); buffers that never change (e.g. a fixed ETF head)
    contribute zero.
    """
    total = 0.0
    for key, ref in reference.items():
        ref = np.asarray(ref)
        if not np.issubdtype(ref.dtype, np.floating):
            continue
        diff = np.asarray(params[key], np.float64) - ref.astype(np.float64)
        total += float(np.sum(diff * diff))
    return total


def project(value: float, upper: float | None) -> float:
    """Euclidean projection onto [0, upper] (upper None: onto [0, inf), as in the authors' code)."""
    value = max(float(value), 0.0)
    return value if upper is None else min(value, float(upper))


def dual_ascent(lam: float, violation: float, eta: float, upper: float | None,
                momentum: float = 0.0, buf: float = 0.0) -> tuple[float, float]:
    """One projected (heavy-ball) ascent step on lambda_k, Eq. (11).

    ``violation`` is dL/dlambda_k = ||x_k - z||^2 - gamma_k. Returns (new lambda, new momentum buffer):
    buf' = momentum * buf + violation; lambda' = Proj_[0, upper](lambda + eta * buf').
    With momentum = 0 this is exactly lambda' = Proj(lambda + eta * violation).
    """
    new_buf = momentum * buf + violation
    return project(lam + eta * new_buf, upper), new_buf


def gamma_step(gamma: float, lam: float, eta: float, momentum: float = 0.0,
               buf: float = 0.0) -> tuple[float, float]:
    """Gradient-descent step on gamma_k (paper, "Selection of gamma"): dL/dgamma_k = -lambda_k.

    ``lam`` is the multiplier at which the gradient is taken (the pre-update value: lambda and gamma take
    their step on L simultaneously). Returns (new gamma, new buffer):
    buf' = momentum * buf + lam; gamma' = gamma + eta * buf'. Since lambda >= 0, gamma never decreases.
    """
    new_buf = momentum * buf + lam
    return gamma + eta * new_buf, new_buf


def code_dual_step(lam: np.ndarray, gamma: np.ndarray, lam_buf: np.ndarray, gamma_buf: np.ndarray, k: int,
                   sq_dist: float, eta_lambda: float, eta_gamma: float, momentum: float, upper: float | None,
                   fix_gamma: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One step of the authors' dual optimizer after client ``k`` (index into the all-device vectors).

    The loss the code differentiates is L_k = (||x_k - z||^2 - gamma_k) lambda_k (no gradient through the
    models); lambda's gradient is negated (ascent). With the buffers kept in ascent form (torch's buffer times -1,
    zero before the first step, which equals torch's buf = grad on its first step; dampening 0, no Nesterov):
        g_lambda = e_k (d_k - gamma_k),  g_gamma = e_k lambda_k        (both at the pre-step values)
        b_lambda <- beta b_lambda + g_lambda;   lambda <- Proj_[0, upper](lambda + eta_lambda b_lambda)  (every entry)
        b_gamma  <- beta b_gamma + g_gamma;     gamma  <- gamma + eta_gamma b_gamma
    With ``fix_gamma`` gamma is not in the optimizer (the code's --fix_gamma): gamma and its buffer stay.
    Returns new arrays (lambda, gamma, lambda buffer, gamma buffer); the inputs are not modified."""
    lam, gamma = np.asarray(lam, np.float64), np.asarray(gamma, np.float64)
    lam_buf, gamma_buf = np.asarray(lam_buf, np.float64), np.asarray(gamma_buf, np.float64)
    if not lam.shape == gamma.shape == lam_buf.shape == gamma_buf.shape or lam.ndim != 1:
        raise ValueError(f"lambda, gamma and their buffers must be vectors of one length, got shapes {lam.shape}, "
                         f"{gamma.shape}, {lam_buf.shape}, {gamma_buf.shape}")
    if not 0 <= k < lam.size:
        raise ValueError(f"client index {k} is outside the {lam.size} devices' dual vectors")
    g_lam = np.zeros_like(lam)
    g_lam[k] = float(sq_dist) - gamma[k]
    new_lam_buf = momentum * lam_buf + g_lam
    new_lam = lam + eta_lambda * new_lam_buf
    new_lam = np.maximum(new_lam, 0.0) if upper is None else np.clip(new_lam, 0.0, float(upper))
    if fix_gamma:
        return new_lam, gamma.copy(), new_lam_buf, gamma_buf.copy()
    g_gam = np.zeros_like(gamma)
    g_gam[k] = lam[k]
    new_gamma_buf = momentum * gamma_buf + g_gam
    return new_lam, gamma + eta_gamma * new_gamma_buf, new_lam_buf, new_gamma_buf


def dual_weights(lambdas: Sequence[float], num_examples: Sequence[int]) -> tuple[np.ndarray, bool]:
    """Aggregation weights of Eq. (12): lambda_k / sum lambda over the clients that returned updates.

    If sum lambda = 0 (e.g. every multiplier is still at its initial 0, or eta_lambda = 0 with
    lambda-init = 0) the dual average is undefined; fall back to the sample-size weights n_k / sum n
    (FedAvg). Returns (normalised weights, fallback_taken).
    """
    lam = np.asarray(lambdas, np.float64)
    if lam.ndim != 1 or lam.size == 0 or len(num_examples) != lam.size:
        raise ValueError(f"need one lambda per client, got {lam.size} lambdas and {len(num_examples)} sizes")
    if not np.all(np.isfinite(lam)) or np.any(lam < 0):
        raise ValueError(f"Lagrange multipliers must be finite and >= 0, got {lam.tolist()}")
    total = float(lam.sum())
    if total > 0:
        return lam / total, False
    n = np.asarray(num_examples, np.float64)
    return n / n.sum(), True


def uniform_average(params: Sequence[Mapping[str, np.ndarray]]) -> tuple["OrderedDict[str, np.ndarray]", np.ndarray]:
    """z = (1/M) sum_k x_k over the M returned models: the ``fedbc-uniform`` control's server step (the same
    local objective and dual updates as FedBC, without the dual weights of Eq. 12). Returns (z, weights)."""
    if len(params) == 0:
        raise ValueError("uniform averaging needs at least one set of parameters")
    weights = np.full(len(params), 1.0 / len(params))
    return weighted_average(params, weights), weights


def weight_gaps(weights: Sequence[float] | np.ndarray, num_examples: Sequence[int]) -> dict[str, float]:
    """How far the aggregation weights used are from the two textbook choices (L1 distances in [0, 2]):
    ``vs-samples`` = sum_k |w_k - n_k / sum n| (FedAvg), ``vs-uniform`` = sum_k |w_k - 1/M|. Zero means the
    dual weighting did nothing beyond that choice this round."""
    w = np.asarray(weights, np.float64)
    n = np.asarray(num_examples, np.float64)
    if w.shape != n.shape or w.size == 0:
        raise ValueError(f"need one weight per client, got {w.size} weights and {n.size} sizes")
    return {"vs-samples": float(np.abs(w - n / n.sum()).sum()), "vs-uniform": float(np.abs(w - 1.0 / w.size).sum())}


def stats(values: Sequence[float]) -> dict[str, float]:
    """mean/min/max of a non-empty list (what results.json records per round for lambda and gamma)."""
    v = np.asarray(values, np.float64)
    if v.size == 0:
        raise ValueError("stats of an empty list")
    return {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max())}


def dual_weighted_average(params: Sequence[Mapping[str, np.ndarray]], lambdas: Sequence[float],
                          num_examples: Sequence[int]) -> tuple["OrderedDict[str, np.ndarray]", np.ndarray, bool]:
    """z = sum_k lambda_k x_k / sum_k lambda_k (Eq. 12), with the sum-lambda = 0 fallback of :func:`dual_weights`.

    Returns (new global params, the weights used, fallback_taken).
    """
    weights, fallback = dual_weights(lambdas, num_examples)
    return weighted_average(params, weights), weights, fallback
