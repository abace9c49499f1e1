"""Pure aggregation math shared by strategies (and the float / integer split of a model's tensors)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Mapping, Sequence

import numpy as np

from flcore.named_arrays import Arrays


def weighted_average(params: Sequence[Arrays], weights: Sequence[float] | np.ndarray) -> "OrderedDict[str, np.ndarray]":
    """sum_k w_k x_k / sum_k w_k per tensor (FedAvg, McMahan et al. 2017, Alg. 1).

    Sums in float64 and casts back to each tensor's dtype (integer buffers are rounded).
    """
    if len(params) == 0:
        raise ValueError("weighted_average needs at least one set of parameters")
    w = np.asarray(weights, dtype=np.float64)
    if w.shape[0] != len(params) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero, got {w.tolist()}")
    w = w / w.sum()
    out: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for key, ref in params[0].items():
        acc = np.zeros(ref.shape, dtype=np.float64)
        for wk, p in zip(w, params):
            acc += wk * p[key]
        out[key] = np.rint(acc).astype(ref.dtype) if np.issubdtype(ref.dtype, np.integer) else acc.astype(ref.dtype)
    return out


def is_float(arr: np.ndarray) -> bool:
    """Whether ``arr`` holds floating-point values (integer buffers such as BatchNorm's counter do not)."""
    return bool(np.issubdtype(np.asarray(arr).dtype, np.floating))


def average_non_float(params: Sequence[Arrays], weights: Sequence[float],
                      keys: Sequence[str]) -> "OrderedDict[str, np.ndarray]":
    """Weighted average of the integer entries ``keys`` (counters/buffers that no optimizer rule covers)."""
    if not keys:
        return OrderedDict()
    return weighted_average([{k: p[k] for k in keys} for p in params], weights)


def deltas(global_params: Arrays, params: Arrays) -> "OrderedDict[str, np.ndarray]":
    """x_k - theta_t per tensor, in float64."""
    return OrderedDict((k, np.asarray(params[k], np.float64) - np.asarray(g, np.float64))
                       for k, g in global_params.items())


def apply_update(global_params: Arrays, update: Mapping[str, np.ndarray | float], scale: float = 1.0
                 ) -> "OrderedDict[str, np.ndarray]":
    """theta + scale * update, cast back to each tensor's dtype."""
    out: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for k, g in global_params.items():
        val = np.asarray(g, np.float64) + scale * np.asarray(update[k], np.float64)
        out[k] = np.rint(val).astype(g.dtype) if np.issubdtype(g.dtype, np.integer) else val.astype(g.dtype)
    return out


def flat_norm(params: Arrays) -> float:
    """The L2 norm of all entries together, in float64; inf where squares overflow float64 (no warning: an
    infinite norm is the answer, which the update checks reject by name)."""
    with np.errstate(over="ignore"):
        return float(np.sqrt(sum(float(np.sum(np.asarray(v, np.float64) ** 2)) for v in params.values())))


def a_norm(steps: int, momentum: float = 0.0) -> float:
    """||a_k||_1 for ``steps`` local SGD steps with heavy-ball momentum rho (rho = 0: the step count): how far
    those steps move a model relative to one plain SGD step (FedNova's normaliser, strategies/methods/fednova.py; the
    update screen's step scale, strategies/update_screen.py)."""
    if steps < 0 or not 0 <= momentum < 1:
        raise ValueError(f"need steps >= 0 and 0 <= momentum < 1, got steps={steps}, momentum={momentum}")
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)
