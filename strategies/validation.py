"""Rejecting bad client updates before they reach aggregation (pure functions).

:func:`check_update` returns the problem and the update's norm ``||params - reference||``, so the round
driver computes each norm once (the relative screen, ``update-norm-factor``, reuses it). It reaches the
same verdicts as the check-by-check definition (:func:`_check_in_order`) with less work: when names,
shapes and dtypes all match it computes the norm first, and a finite norm proves every tensor finite
(a NaN or Inf in ``params`` makes its delta, hence the sum of squares, non-finite); only an update with
a non-finite norm or a structural mismatch goes through the in-order checks, which name the first
problem exactly as before.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from strategies.aggregation import deltas, flat_norm

Arrays = Mapping[str, np.ndarray]


def update_problem(params: Arrays, reference: Arrays, max_update_norm: float) -> str | None:
    """Why ``params`` cannot be aggregated against the global ``reference``, or None if it can.

    Checks: same tensor names, shapes and dtypes; finite values; ||params - reference|| <= max_update_norm.
    """
    return check_update(params, reference, max_update_norm)[0]


def as_float64(reference: Arrays) -> dict[str, np.ndarray]:
    """``reference`` in float64, once per exchange (:func:`check_update` subtracts it from every update)."""
    return {k: np.asarray(g, np.float64) for k, g in reference.items()}


def check_update(params: Arrays, reference: Arrays, max_update_norm: float,
                 reference64: Arrays | None = None) -> tuple[str | None, float | None]:
    """(why ``params`` cannot be aggregated or None, its update norm or None where a check before the norm
    failed). ``reference64``: :func:`as_float64` of ``reference`` (computed here when not given)."""
    if len(params) != len(reference) or not all(k in params for k in reference):
        return _check_in_order(params, reference, max_update_norm)
    for k, ref in reference.items():
        p = params[k]
        if (not isinstance(p, np.ndarray) or p.shape != ref.shape or p.dtype != ref.dtype
                or p.dtype.kind not in "fiub"):
            return _check_in_order(params, reference, max_update_norm)
    ref64 = reference64 if reference64 is not None else as_float64(reference)
    with np.errstate(all="ignore"):  # a non-finite update is named by the in-order checks below
        norm = float(np.sqrt(sum(_squared_distance(params[k], ref64[k]) for k in reference)))
    if not math.isfinite(norm):
        return _check_in_order(params, reference, max_update_norm)
    if not norm <= max_update_norm:
        return f"update norm {norm:.4g} exceeds max-update-norm {max_update_norm:.4g}", norm
    return None, norm


def _squared_distance(p: np.ndarray, ref64: np.ndarray) -> float:
    """``float(np.sum((np.asarray(p, np.float64) - ref64) ** 2))`` (flat_norm(deltas(...))'s arithmetic:
    the same float64 differences, squares and sum) with one temporary array instead of three."""
    d = np.subtract(p, ref64, dtype=np.float64)
    np.square(d, out=d)
    return float(np.sum(d))


def _check_in_order(params: Arrays, reference: Arrays, max_update_norm: float) -> tuple[str | None, float | None]:
    """The checks one by one: names, then per tensor shape, dtype and finite values, then the norm."""
    missing = [k for k in reference if k not in params]
    if missing:
        return f"missing tensors {missing[:3]}{'...' if len(missing) > 3 else ''}", None
    extra = [k for k in params if k not in reference]
    if extra:
        return f"unexpected tensors {extra[:3]}{'...' if len(extra) > 3 else ''}", None
    for k, ref in reference.items():
        p = np.asarray(params[k])
        if p.shape != ref.shape:
            return f"tensor '{k}' has shape {p.shape}, expected {ref.shape}", None
        if p.dtype != ref.dtype:
            return f"tensor '{k}' has dtype {p.dtype}, expected {ref.dtype}", None
        if np.issubdtype(p.dtype, np.floating) and not np.all(np.isfinite(p)):
            return f"tensor '{k}' contains NaN or Inf", None
    norm = flat_norm(deltas(reference, params))
    if not norm <= max_update_norm:
        return f"update norm {norm:.4g} exceeds max-update-norm {max_update_norm:.4g}", norm
    return None, norm
