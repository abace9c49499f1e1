"""What a client may send back, checked before any server code reads it (docs/PROTOCOL.md's reply columns).

A reply is content from a participant the server does not control: a key it lacks, a list where a number
belongs, a NaN count or an extra record must never reach ``int(...)``/``float(...)`` in the registry, the state
ledger, the aggregation or the results, where it would raise inside the ServerApp and end the run for everyone.
Each function here is pure: it takes the reply's records (already plain Python: a ConfigRecord / MetricRecord is
a mapping) and returns the first problem found, naming the key, or None. Callers turn a problem into a recorded
``rejected`` failure of that client (strategies/update_checks.py for training replies,
strategies/round_driver.py for evaluation replies, strategies/client_registry.py for registrations) and the
round goes on with the others.

The schema: the base protocol's keys (flcore/protocol.py) with their types and bounds, below, plus the keys the
running method declares (``Payload.metrics`` / ``Payload.reply_records``): a declared metric must be a number,
finite or NaN (a metric over an empty local test split is NaN); the method's own checks add its bounds where it
reads it (strategies/update_checks.py ``metric_problem``: FedBC's ||x_k - z||^2, FedNova's step count) and a
record's shape (``arrays_problem``: SCAFFOLD's delta c_i). Any other key is refused:
only declared names may travel (tests/test_method_contract.py checks that honest clients send no other).
"""

from __future__ import annotations

from dataclasses import dataclass

import math
from typing import Any, Callable, Iterable, Mapping

from flcore import protocol

MAX_COUNT = 2**53  # a count beyond this is not an integer a float64 aggregation weight can hold exactly


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def count(v: Any) -> str | None:
    """A non-negative integer (a sample or step count)."""
    if not _is_int(v):
        return f"must be an integer, got {type(v).__name__} {v!r:.60}"
    if not 0 <= v <= MAX_COUNT:
        return f"must be an integer in [0, 2^53], got {v}"
    return None


def finite(v: Any) -> str | None:
    """A finite number."""
    if not _is_number(v):
        return f"must be a number, got {type(v).__name__} {v!r:.60}"
    if not math.isfinite(v):
        return f"must be finite, got {v}"
    return None


def finite_or_nan(v: Any) -> str | None:
    """A finite number, or NaN (SphereFed's calibration reply has no training loss; an empty local test split
    evaluates to NaN)."""
    if not _is_number(v):
        return f"must be a number, got {type(v).__name__} {v!r:.60}"
    return None if math.isnan(v) or math.isfinite(v) else f"must be finite (or NaN), got {v}"


def nonneg_or_nan(v: Any) -> str | None:
    """A number >= 0, or NaN (a client without a local test split reports NaN)."""
    if not _is_number(v):
        return f"must be a number, got {type(v).__name__} {v!r:.60}"
    if math.isnan(v):
        return None
    return None if 0 <= v < math.inf else f"must be >= 0 and finite (or NaN), got {v}"


def fraction_or_nan(v: Any) -> str | None:
    """An accuracy in [0, 1], or NaN (no local test split)."""
    if not _is_number(v):
        return f"must be a number, got {type(v).__name__} {v!r:.60}"
    return None if math.isnan(v) or 0 <= v <= 1 else f"must be in [0, 1] (or NaN), got {v}"


def fraction(v: Any) -> str | None:
    problem = fraction_or_nan(v)
    if problem is None and math.isnan(v):
        return "must be in [0, 1], got nan"
    return problem


Check = Callable[[Any], "str | None"]
TRAIN_METRICS: dict[str, Check] = {
    "cid": count, "num-examples": count, "train_loss": finite_or_nan, "local-steps": count,
    "local-accuracy": fraction_or_nan, "local-loss": nonneg_or_nan,
    "global-model-local-accuracy": fraction_or_nan, "global-model-local-loss": nonneg_or_nan,
    protocol.STATE_ENTRIES: count,
}
EVAL_METRICS: dict[str, Check] = {"cid": count, "num-examples": count, "num-test": count, "accuracy": fraction,
                                  "loss": nonneg_or_nan}
REQUIRED_TRAIN = ("num-examples",)
REQUIRED_EVAL = ("num-examples", "num-test", "accuracy", "loss")
assert set(TRAIN_METRICS) == set(protocol.TRAIN_METRICS) and set(EVAL_METRICS) == set(protocol.EVAL_METRICS)


def _declared(name: str, declared: Iterable[str]) -> bool:
    """``name`` is one of ``declared`` (a declared name ending in '.' is a prefix: ``fedufo.prior.``)."""
    return any(name == d or (d.endswith(".") and name.startswith(d)) for d in declared)


def metrics_problem(metrics: Mapping[str, Any], base: Mapping[str, Check], required: Iterable[str],
                    declared: Iterable[str], cid: int | None = None) -> str | None:
    """The first problem of a reply's metrics: a required key missing, a base key of the wrong type or out of
    bounds, a declared method metric that is not a finite number, an undeclared key; or None."""
    declared = tuple(declared)
    for key in required:
        if key not in metrics:
            return f"metric '{key}' missing"
    for key, value in metrics.items():
        if key in base:
            problem = base[key](value)
        elif _declared(key, declared):
            problem = finite_or_nan(value)
        else:
            return f"metric '{key}' is not in the protocol nor declared by the method"
        if problem is not None:
            return f"metric '{key}' {problem}"
    if cid is not None and "cid" in metrics and metrics["cid"] != cid:
        return f"metric 'cid' is {metrics['cid']}, but the message went to client {cid}"
    return None


def records_problem(content: Mapping[str, Any], allowed: Iterable[str], kinds: Mapping[str, type]) -> str | None:
    """The first problem of a reply's record names and kinds: a record that is not allowed (base or declared),
    or a base record of the wrong kind (``kinds``: name -> record class); or None."""
    allowed = tuple(allowed)
    for name, record in content.items():
        if name in kinds:
            if not isinstance(record, kinds[name]):
                return f"record '{name}' must be a {kinds[name].__name__}, got {type(record).__name__}"
        elif not _declared(name, allowed):
            return f"record '{name}' is not in the protocol nor declared by the method"
    return None


@dataclass(frozen=True)
class RegistrationInfo:
    """A registration's ``info``, checked by :func:`parse_info`."""

    cid: int
    num_examples: int
    class_counts: list[int]


def parse_info(info: Any, max_classes: int = 100_000) -> RegistrationInfo | str:
    """A registration's ``info`` as typed values, or its first problem (:func:`info_problem`)."""
    problem = info_problem(info, max_classes)
    if problem is not None:
        return problem
    return RegistrationInfo(int(info["cid"]), int(info["num-examples"]), [int(c) for c in info["class-counts"]])


def info_problem(info: Any, max_classes: int = 100_000) -> str | None:
    """The first problem of a registration's ``info`` (cid, num-examples, class-counts), or None: every key
    present and of its type, the class counts non-negative integers that add up to num-examples."""
    if not isinstance(info, Mapping):
        return f"record '{protocol.INFO}' missing or not a ConfigRecord ({type(info).__name__})"
    for key in protocol.QUERY_INFO_KEYS:
        if key not in info:
            return f"info '{key}' missing"
    for key in ("cid", "num-examples"):
        problem = count(info[key])
        if problem is not None:
            return f"info '{key}' {problem}"
    counts = info["class-counts"]
    if not isinstance(counts, list) or not 0 < len(counts) <= max_classes or not all(_is_int(c) and c >= 0
                                                                                    for c in counts):
        return f"info 'class-counts' must be a non-empty list of non-negative integers, got {counts!r:.80}"
    if sum(counts) != info["num-examples"]:
        return (f"info 'class-counts' add up to {sum(counts)}, but 'num-examples' is {info['num-examples']} (the "
                "training samples the counts describe)")
    extra = sorted(set(info) - set(protocol.QUERY_INFO_KEYS))
    if extra:
        return f"info has undeclared key(s) {', '.join(map(repr, extra))}"
    return None
