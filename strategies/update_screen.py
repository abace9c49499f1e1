"""Rejecting bad client updates before they reach aggregation (pure functions).

:func:`check_update` returns the problem and the update's norm ``||params - reference||`` as an
:class:`UpdateNorm`, so the round driver computes each norm once (the relative screen,
``update-norm-factor``, reuses it). It reaches the same verdicts as the check-by-check definition
(:func:`_check_in_order`) with less work:

- when names, shapes and dtypes all match, the norm comes first, and a finite norm proves every tensor
  finite (a NaN or Inf in ``params`` makes its delta, hence the sum of squares, non-finite); only an update
  with a non-finite norm or a structural mismatch goes through the in-order checks, which name the first
  problem exactly as before;
- for float32 models the norm is first bracketed cheaply (float32 differences and dot products, with a
  rigorous error bound: ``lo <= exact <= hi``). A decision the bracket settles (``hi <= max-update-norm``;
  every update's ``hi`` at most the factor times the median of the ``lo``s) is the exact decision; anything
  else (a rejection, a near tie) computes the exact float64 norm, bit for bit the old one
  (``flat_norm(deltas(reference, params))``), and decides with it. Verdicts, reasons and norms named in
  them are unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from flcore.named_arrays import Arrays
from strategies.aggregation import a_norm, deltas, flat_norm



def update_problem(params: Arrays, reference: Arrays, max_update_norm: float) -> str | None:
    """Why ``params`` cannot be aggregated against the global ``reference``, or None if it can.

    Checks: same tensor names, shapes and dtypes; finite values; ||params - reference|| <= max_update_norm.
    """
    return check_update(params, reference, max_update_norm)[0]


def as_float64(reference: Arrays) -> "Float64View":
    """``reference`` in float64, each tensor converted on first use and kept (one conversion per exchange,
    none when no exact norm is needed)."""
    return Float64View(reference)


class Float64View(Mapping):
    """Read-only float64 copies of ``reference``'s tensors, made on first access."""

    def __init__(self, reference: Arrays) -> None:
        self._ref = reference
        self._memo: dict[str, np.ndarray] = {}

    def __getitem__(self, key: str) -> np.ndarray:
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = np.asarray(self._ref[key], np.float64)
        return hit

    def __iter__(self):  # noqa: ANN204
        return iter(self._ref)

    def __len__(self) -> int:
        return len(self._ref)


class UpdateNorm:
    """``||params - reference||``: ``lo <= exact <= hi``, and :meth:`exact` the float64 value
    ``flat_norm(deltas(reference, params))`` (computed on first use, bit for bit that expression)."""

    __slots__ = ("lo", "hi", "_value", "_params", "_ref64")

    def __init__(self, lo: float, hi: float, value: float | None = None, params: Arrays | None = None,
                 ref64: Arrays | None = None) -> None:
        self.lo, self.hi, self._value, self._params, self._ref64 = lo, hi, value, params, ref64

    @classmethod
    def known(cls, value: float) -> "UpdateNorm":
        return cls(value, value, value)

    def exact(self) -> float:
        if self._value is None:
            assert self._params is not None and self._ref64 is not None  # kept by check_update with no value
            self._value = _exact_norm(self._params, self._ref64)
            self._params = self._ref64 = None
        return self._value

    def __repr__(self) -> str:
        return f"UpdateNorm(lo={self.lo!r}, hi={self.hi!r}, exact={self._value!r})"


def check_update(params: Arrays, reference: Arrays, max_update_norm: float,
                 reference64: Arrays | None = None) -> tuple[str | None, UpdateNorm | None]:
    """(why ``params`` cannot be aggregated or None, its update norm or None where a check before the norm
    failed). ``reference64``: :func:`as_float64` of ``reference``, shared by an exchange's updates."""
    if len(params) != len(reference) or not all(k in params for k in reference):
        return _checked_in_order(params, reference, max_update_norm)
    for k, ref in reference.items():
        p = params[k]
        if (not isinstance(p, np.ndarray) or p.shape != ref.shape or p.dtype != ref.dtype
                or p.dtype.kind not in "fiub"):
            return _checked_in_order(params, reference, max_update_norm)
    ref64 = reference64 if reference64 is not None else as_float64(reference)
    bracket = _bracket(params, reference)
    if bracket is not None and bracket[1] <= max_update_norm:  # within the limit, whatever the exact value
        return None, UpdateNorm(bracket[0], bracket[1], None, params, ref64)
    norm = _exact_norm(params, ref64)
    if not math.isfinite(norm):
        return _checked_in_order(params, reference, max_update_norm)
    if not norm <= max_update_norm:
        return f"update norm {norm:.4g} exceeds max-update-norm {max_update_norm:.4g}", UpdateNorm.known(norm)
    return None, UpdateNorm.known(norm)


def _exact_norm(params: Arrays, ref64: Arrays) -> float:
    """``flat_norm(deltas(reference, params))`` bit for bit (the same float64 differences, squares, sums)."""
    with np.errstate(all="ignore"):  # a non-finite update is named by the in-order checks
        return float(np.sqrt(sum(_squared_distance(params[k], ref64[k]) for k in ref64)))


def _squared_distance(p: np.ndarray, ref64: np.ndarray) -> float:
    """``float(np.sum((np.asarray(p, np.float64) - ref64) ** 2))`` (flat_norm(deltas(...))'s arithmetic:
    the same float64 differences, squares and sum) with one temporary array instead of three."""
    d = np.subtract(p, ref64, dtype=np.float64)
    np.square(d, out=d)
    return float(np.sum(d))


_U32 = 2.0 ** -24       # unit roundoff of float32
_BRACKET_MAX = 1 << 20  # elements per tensor: beyond, the float32 error bound is too loose to be useful
_MARGIN = 1e-9          # float64 rounding in the exact norm and in these sums (relative; <= 2^20 * 2^-53 each)


def _bracket(params: Arrays, reference: Arrays) -> tuple[float, float] | None:
    """``(lo, hi)`` with ``lo <= ||params - reference|| <= hi`` (the exact float64 norm), from float32
    arithmetic; None when a tensor is not float32, too large, or anything is not finite (then only the exact
    path can say what is wrong).

    Per tensor of n elements, with u = 2^-24: each float32 difference is the exact one times (1 + e), |e| <= u;
    its square adds a factor (1 + e'), and a sum of n non-negative terms in any order (BLAS's dot, FMA or not)
    is off by at most n u / (1 - n u) of the exact sum; products that underflow are off by at most 2^-149
    each. So s_float32 lies within (n + 4) 2^-23 relative plus n 2^-140 absolute of the exact sum of squares
    (about twice the bound); the exact float64 value differs from that real number by < 2^20 2^-53 relative.
    A finite float32 sum also proves every difference, hence every value of ``params``, finite."""
    lo = hi = 0.0
    with np.errstate(all="ignore"):  # (entered once per update: ~1 us each time)
        for key, ref in reference.items():
            p = params[key]
            n = p.size
            if p.dtype != np.float32 or n > _BRACKET_MAX:
                return None
            d = np.subtract(p, ref).ravel()
            s = float(np.dot(d, d))
            if not math.isfinite(s):
                return None
            rel, slack = (n + 4) * 2 * _U32, n * 2.0 ** -140
            lo += max(s * (1.0 - rel) - slack, 0.0)
            hi += s * (1.0 + rel) + slack
    return math.sqrt(lo * (1.0 - _MARGIN)), math.sqrt(hi * (1.0 + _MARGIN))


def _checked_in_order(params: Arrays, reference: Arrays, max_update_norm: float
                      ) -> tuple[str | None, UpdateNorm | None]:
    problem, norm = _check_in_order(params, reference, max_update_norm)
    return problem, None if norm is None else UpdateNorm.known(norm)


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


# ------------------------------------------------------------------------------ the relative screen
def step_scale(samples: int, epochs: int, batch_size: int, max_steps: int, momentum: float) -> float:
    """How far ``samples`` registered training samples can legitimately move a client's model, relative to
    one plain SGD step: ||a||_1 of the local steps they allow (``epochs`` x ceil(samples / batch_size), capped
    at ``max_steps`` when > 0) under heavy-ball ``momentum`` (FedNova's ||a_k||_1, strategies/methods/fednova.py).
    An update of s steps with gradients of norm at most G has norm at most lr G ||a||_1, so this is the
    largest factor by which honest updates grow with a client's data. ``samples`` is
    ``ClientRegistry.screen_samples``: the client's own claim in simulation (the server's own partition); under
    node bindings the size the operator declared, or for an undeclared client at most the median claim, so an
    unverified count never widens the screen beyond the median client's."""
    steps = int(epochs) * math.ceil(max(int(samples), 0) / int(batch_size))
    if max_steps > 0:
        steps = min(steps, int(max_steps))
    return a_norm(steps, momentum)


def relative_limits(norms: list[float], scales: list[float], factor: float) -> list[float]:
    """Each update's limit: ``factor`` x the round's median update norm, times ``scale / median scale`` for
    a client whose data allow more local progress than the round's median client (never less than the
    plain ``factor`` x median: a light client is screened as before)."""
    median = float(np.median(norms))
    typical = max(float(np.median(scales)), 1.0)  # ||a||_1 of one step is 1: a floor for rounds of tiny clients
    return [factor * median * max(1.0, s / typical) for s in scales]


def relative_screen(norms: list[float], scales: list[float], factor: float) -> list[tuple[bool, float]]:
    """(rejected, limit) per update under :func:`relative_limits` (an update exactly at its limit is kept)."""
    return [(n > lim, lim) for n, lim in zip(norms, relative_limits(norms, scales, factor))]
