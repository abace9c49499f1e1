"""Checking a round's replies before they reach aggregation: the base's checks and those methods add.

:class:`UpdateChecks` is a part of the strategy (strategies/base.py composes it as ``strategy.checks``): given
the run config and the registered sample count of each client (a callable), :meth:`UpdateChecks.check` turns
replies into :class:`ClientUpdate` s and rejects malformed or absurd ones (structure, finite values,
``max-update-norm``, a ``num-examples`` that differs from the registration: the verdicts of
strategies/update_screen.py), and :meth:`UpdateChecks.screen` applies the relative screen
(``update-norm-factor`` x the round's median update norm). Every rejection is a :class:`Failure` naming why.

Methods need more than the arrays in a reply (SCAFFOLD's delta c_i, FedNova's step count, q-FedAvg's loss).
A reply that lacks them cannot be aggregated; :func:`reject_updates` with :func:`metric_problem` /
:func:`arrays_problem` rejects it for the round like any malformed update (named in the log and in the
round's failures), and the federation goes on with the others.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
from flwr.app import Message

from flwr.app import ArrayRecord, MetricRecord

from flcore.config import RunConfig
from flcore.declaration import Payload
from flcore.records import record_views
from strategies.aggregation import deltas, flat_norm, is_float
from strategies.exchange import Failure
from strategies.reply_schema import REQUIRED_TRAIN, TRAIN_METRICS, metrics_problem, records_problem
from strategies.update_screen import UpdateNorm, as_float64, check_update, relative_limits, relative_screen, step_scale

log = logging.getLogger("noniid_fl")


@dataclass
class ClientUpdate:
    cid: int
    params: "OrderedDict[str, np.ndarray]"
    num_examples: int  # its weight: the registered samples (ClientRegistry.weight_samples: capped under node bindings)
    metrics: dict[str, Any]
    records: dict[str, Any]


@dataclass
class CheckedReplies:
    """What :meth:`UpdateChecks.check` made of a round's replies (each list in client-id order)."""
    updates: list[ClientUpdate] = field(default_factory=list)  # passed the per-update checks
    rejected: list[Failure] = field(default_factory=list)
    norms: dict[int, UpdateNorm] = field(default_factory=dict)  # cid -> ||update - reference|| of each update
    metrics: dict[int, dict[str, Any]] = field(default_factory=dict)  # cid -> metrics of every well-formed reply


class UpdateChecks:
    """The base's checks of client updates: per update (:meth:`check`), then across the round (:meth:`screen`)."""

    def __init__(self, cfg: RunConfig, registered_samples: Callable[[int], int | None],
                 payload: Payload | None = None, weight_samples: Callable[[int], int | None] | None = None,
                 screen_samples: Callable[[int], int | None] | None = None) -> None:
        self.cfg = cfg
        self.registered_samples = registered_samples  # cid -> the training samples it registered, or None
        # cid -> the samples its weight and screen use (ClientRegistry.weight_samples: capped under node bindings)
        self.weight_samples = weight_samples or registered_samples
        # cid -> the samples that scale its screen limit (ClientRegistry.screen_samples: never above the median
        # claim for an unverified count)
        self.screen_samples = screen_samples or self.weight_samples
        self.payload = payload if payload is not None else Payload()  # what the method's replies may add

    def check(self, server_round: int, replies: Mapping[int, Message], reference: Mapping[str, np.ndarray],
              phase: str = "train") -> CheckedReplies:
        """Turn replies into updates; reject malformed or absurd ones (named in the log and the result)."""
        out = CheckedReplies()
        reference64 = as_float64(reference) if replies else None
        for cid in sorted(replies):
            content = replies[cid].content
            malformed = self.schema_problem(content, cid)
            if malformed is not None:
                out.rejected.append(Failure(cid, phase, "rejected", f"malformed reply: {malformed}"))
                log.warning("round %s: reply of client %s rejected: %s", server_round, cid, malformed)
                continue
            try:
                arrays, metric_record = content["arrays"], content["metrics"]
                # schema_problem checked both records' kinds and that num-examples is a count
                assert isinstance(arrays, ArrayRecord) and isinstance(metric_record, MetricRecord)
                params = record_views(arrays)  # read-only views of the reply's bytes: aggregation reads them
                metrics = dict(metric_record)
                num_examples = metrics["num-examples"]
                assert isinstance(num_examples, int)
                num = int(num_examples)
            except Exception as exc:  # noqa: BLE001 - anything malformed is a rejected update
                out.rejected.append(Failure(cid, phase, "rejected", f"malformed reply: {exc!r}"))
                continue
            out.metrics[cid] = metrics
            problem, norm = check_update(params, reference, self.cfg.max_update_norm, reference64)
            registered = self.registered_samples(cid)
            if problem is None and num != registered:
                problem = (f"reply claims num-examples={num}, but the client registered {registered} training "
                           "samples (aggregation weights come from registration)")
            if problem is not None:
                out.rejected.append(Failure(cid, phase, "rejected", problem))
                log.warning("round %s: update of client %s rejected: %s", server_round, cid, problem)
                continue
            records = {k: v for k, v in content.items() if k not in ("arrays", "metrics")}
            weight = self.weight_samples(cid)
            assert norm is not None  # check_update gives a norm with every passed update
            out.updates.append(ClientUpdate(cid, params, num if weight is None else weight, metrics, records))
            out.norms[cid] = norm
        return out

    def schema_problem(self, content: Mapping[str, Any], cid: int) -> str | None:
        """Why a training reply's records do not conform to the protocol and the method's declared payload
        (strategies/reply_schema.py), naming the key; or None."""
        problem = records_problem(content, self.payload.reply_records,
                                  {"arrays": ArrayRecord, "metrics": MetricRecord})
        if problem is None and ("arrays" not in content or "metrics" not in content):
            problem = f"record '{'arrays' if 'arrays' not in content else 'metrics'}' missing"
        if problem is None:
            problem = metrics_problem(content["metrics"], TRAIN_METRICS, REQUIRED_TRAIN, self.payload.metrics, cid)
        return problem

    def screen(self, server_round: int, updates: list[ClientUpdate], reference: Mapping[str, np.ndarray],
               rejected: list[Failure], phase: str, norms: Mapping[int, UpdateNorm] | None = None
               ) -> tuple[list[ClientUpdate], list[Failure]]:
        """Reject updates whose norm exceeds update-norm-factor x the round's median update norm, the limit
        scaled up for a client whose registered samples allow more local steps than the round's median
        client (``update-norm-scale='local-steps'``, :func:`strategies.update_screen.relative_limits`)
        (``norms``: cid -> the update's norm where already known, exactly or bracketed). Returns the kept
        updates and ``rejected`` with the screened ones appended."""
        factor = self.cfg.update_norm_factor
        if factor <= 0 or len(updates) < 3:
            return updates, rejected
        scales = self._step_scales(updates)
        known = [(norms or {}).get(u.cid) for u in updates]
        found = [n for n in known if n is not None]
        if len(found) == len(known):
            # every exact norm is >= its lo, so the exact median is >= the median of the lo's and each exact
            # limit >= its limit from the lo's: an update whose hi is within that is within its exact limit
            limits_lo = relative_limits([n.lo for n in found], scales, factor)
            if all(n.hi <= lim for n, lim in zip(found, limits_lo)):
                return updates, rejected
        exact = [n.exact() if n is not None else flat_norm(deltas(reference, u.params))
                 for u, n in zip(updates, known)]
        median = float(np.median(exact))
        kept = []
        for u, norm, (bad, limit) in zip(updates, exact, relative_screen(exact, scales, factor)):
            if not bad:
                kept.append(u)
                continue
            reason = (f"update norm {norm:.4g} exceeds update-norm-factor {factor:g} x the round's median update "
                      f"norm ({median:.4g})")
            if limit > factor * median:
                reason += f" x {limit / (factor * median):.3g} for its {u.num_examples} registered samples"
            rejected.append(Failure(u.cid, phase, "rejected", reason))
            log.warning("round %s: update of client %s rejected: %s", server_round, u.cid, reason)
        return kept, rejected

    def _step_scales(self, updates: list[ClientUpdate]) -> list[float]:
        """Each update's :func:`strategies.update_screen.step_scale` (1.0 each under update-norm-scale='none')."""
        c = self.cfg
        if c.update_norm_scale == "none":
            return [1.0] * len(updates)
        samples = [self.screen_samples(u.cid) for u in updates]
        return [step_scale(u.num_examples if n is None else n, c.local_epochs, c.batch_size, c.max_local_steps,
                           c.momentum) for u, n in zip(updates, samples)]


# ------------------------------------------------------------------------------ checks methods add
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
