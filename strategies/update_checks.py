"""Small helpers the baseline strategies share (issue 3): method-specific update checks, float/int split.

Baselines need more than the arrays in a reply (SCAFFOLD's delta c_i, FedNova's step count, q-FedAvg's
loss). A reply that lacks them cannot be aggregated; it is rejected for the round like any malformed update
(named in the log and in the round's failures), and the federation goes on with the others.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from strategies.aggregation import weighted_average
from strategies.exchange import Failure

log = logging.getLogger("noniid_fl")


def is_float(arr: np.ndarray) -> bool:
    return bool(np.issubdtype(np.asarray(arr).dtype, np.floating))


def reject_updates(server_round: int, updates: list, rejected: list[Failure],
                   problem: Callable[[Any], str | None], phase: str = "train") -> tuple[list, list[Failure]]:
    """Move every update for which ``problem(update)`` returns a reason into the rejected list."""
    kept = []
    for u in updates:
        reason = problem(u)
        if reason is None:
            kept.append(u)
            continue
        rejected.append(Failure(u.cid, phase, "rejected", reason))
        log.warning("round %s: update of client %s rejected: %s", server_round, u.cid, reason)
    return kept, rejected


def metric_problem(metrics: Mapping[str, Any], key: str, minimum: float = 0.0,
                   strictly_greater: bool = False) -> str | None:
    """Why metric ``key`` is unusable (missing, not a finite number, below ``minimum``), or None."""
    if key not in metrics:
        return f"metric '{key}' missing from the reply"
    try:
        value = float(metrics[key])
    except (TypeError, ValueError):
        return f"metric '{key}' is not a number: {metrics[key]!r}"
    if not math.isfinite(value):
        return f"metric '{key}' is not finite: {value}"
    if value < minimum or (strictly_greater and value <= minimum):
        op = ">" if strictly_greater else ">="
        return f"metric '{key}' must be {op} {minimum}, got {value}"
    return None


def arrays_problem(arrays: Mapping[str, np.ndarray] | None, reference: Mapping[str, np.ndarray],
                   what: str) -> str | None:
    """Why ``arrays`` (a method record such as delta c_i) does not fit ``reference``, or None."""
    if arrays is None:
        return f"record '{what}' missing from the reply"
    for k, v in arrays.items():
        if k not in reference:
            return f"record '{what}' has unknown tensor '{k}'"
        v = np.asarray(v)
        if v.shape != np.asarray(reference[k]).shape:
            return f"record '{what}' tensor '{k}' has shape {v.shape}, expected {np.asarray(reference[k]).shape}"
        if not is_float(v) or not np.all(np.isfinite(v)):
            return f"record '{what}' tensor '{k}' is not finite floating point"
    return None


def average_non_float(params: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float],
                      keys: Sequence[str]) -> "OrderedDict[str, np.ndarray]":
    """Weighted average of the integer entries ``keys`` (counters/buffers that no optimizer rule covers)."""
    if not keys:
        return OrderedDict()
    return weighted_average([{k: p[k] for k in keys} for p in params], weights)


def as_float64(params: Mapping[str, np.ndarray]) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict((k, np.asarray(v, dtype=np.float64)) for k, v in params.items())
