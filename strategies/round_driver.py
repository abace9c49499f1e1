"""Driving one round over the Message API: build each client's message, exchange, validate the replies.

The base protocol (docs/PROTOCOL.md): every message carries the run config (record "run_config"), the
model (record "arrays") and a "config" ConfigRecord with server-round, cid and the method's per-client
values; replies carry "arrays" and a "metrics" MetricRecord with num-examples and the base metrics, plus
the method's declared records (flcore/methods/*).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, RecordDict
from flwr.serverapp import Grid

from flcore.protocol import CLIENT_STATE
from flcore.records import config_to_record, params_to_record, record_dict, record_views
from strategies.client_registry import RoundFailed
from strategies.aggregation import deltas, flat_norm
from strategies.exchange import Failure, exchange
from strategies.state_ledger import StateLedger
from strategies.update_screen import (UpdateNorm, as_float64, check_update, relative_limits, relative_screen,
                                  step_scale)

log = logging.getLogger("noniid_fl")

Params = "OrderedDict[str, np.ndarray]"


@dataclass
class ClientUpdate:
    cid: int
    params: "OrderedDict[str, np.ndarray]"
    num_examples: int
    metrics: dict[str, Any]
    records: dict[str, Any]


@dataclass
class RoundOutcome:
    params: "OrderedDict[str, np.ndarray]"
    updates: list[ClientUpdate]
    sampled: list[int]
    failures: list[Failure] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0



class RoundDriver:
    """Mixin of FLStrategy: messages, the exchange of a training round with retries, federated evaluation."""

    state_ledger: StateLedger | None = None  # run-bound client state; the runner sets it (strategies/state_ledger.py)

    def _base_content(self, server_round: int) -> RecordDict:
        return record_dict(self._base_records())

    def _base_records(self) -> dict[str, Any]:
        """The records every message carries: the run config (its ConfigRecord built once per config)."""
        memo = getattr(self, "_run_config_memo", None)
        if memo is None or memo[0] is not self.cfg:
            memo = self._run_config_memo = (self.cfg, config_to_record(self.cfg.to_dict()))
        return {"run_config": memo[1]}

    def params_record(self, params: Params) -> ArrayRecord:
        """The ArrayRecord of ``params``, built once and shared by every message of an exchange that carries
        the same parameters (records in outgoing messages are only read). Without it, an exchange with N
        clients held N serialized copies of the model at once (federated evaluation of 1000 clients:
        ~1 GiB for a 1 MiB model)."""
        memo = getattr(self, "_params_record_memo", None)
        values = list(params.values())
        if (memo is not None and memo[0] is params and len(memo[1]) == len(values)
                and all(a is b for a, b in zip(memo[1], values))):
            return memo[2]
        record = params_to_record(params)
        self._params_record_memo = (params, values, record)
        return record

    def train_content(self, server_round: int, cid: int, params: Params,
                      message_config: dict[str, Any] | None = None) -> RecordDict:
        records = self._base_records()
        records["arrays"] = self.params_record(params)
        values = {"server-round": server_round, "cid": cid, **self.client_config(server_round, cid)}
        values.update(message_config or {})
        records["config"] = config_to_record(values)
        extra = dict(self.client_records(server_round, cid))
        if self.state_ledger is not None:
            extra[CLIENT_STATE] = self.state_ledger.record(cid)
        if any(key in records for key in extra):  # a method's record replaces a base one: RecordDict's own way
            content = record_dict(records)
            for key, rec in extra.items():
                content[key] = rec
            return content
        return record_dict({**records, **extra})

    def evaluate_content(self, server_round: int, cid: int, params: Params,
                         message_config: dict[str, Any] | None = None) -> RecordDict:
        """An "evaluate" message: run config, the model, server-round and cid (+ ``message_config``)."""
        content = self._base_content(server_round)
        content["arrays"] = self.params_record(params)
        content["config"] = config_to_record({"server-round": server_round, "cid": cid, **(message_config or {})})
        return content

    def collect_updates(self, server_round: int, replies: dict[int, Message], reference: Params,
                        phase: str = "train") -> tuple[list[ClientUpdate], list[Failure]]:
        """Turn replies into updates; reject malformed or absurd ones (named in the log and results)."""
        updates, rejected = [], []
        norms: dict[int, UpdateNorm] = {}  # ||update - reference|| of each accepted update, computed once
        reference64 = as_float64(reference) if replies else None
        for cid in sorted(replies):
            content = replies[cid].content
            try:
                params = record_views(content["arrays"])  # read-only views of the reply's bytes: aggregation reads them
                metrics = dict(content["metrics"])
                num = int(metrics["num-examples"])
            except Exception as exc:  # noqa: BLE001 - anything malformed is a rejected update
                rejected.append(Failure(cid, phase, "rejected", f"malformed reply: {exc!r}"))
                continue
            if self.state_ledger is not None:  # the client saved its state before it replied
                self.state_ledger.note_reply(cid, server_round, metrics)
            problem, norm = check_update(params, reference, self.cfg.max_update_norm, reference64)
            registered = self.clients[cid].num_examples if cid in self.clients else None
            if problem is None and num != registered:
                problem = (f"reply claims num-examples={num}, but the client registered {registered} training "
                           "samples (aggregation weights come from registration)")
            if problem is not None:
                rejected.append(Failure(cid, phase, "rejected", problem))
                log.warning("round %s: update of client %s rejected: %s", server_round, cid, problem)
                continue
            records = {k: v for k, v in content.items() if k not in ("arrays", "metrics")}
            if "local-accuracy" in metrics:
                self.client_accuracy[cid] = float(metrics["local-accuracy"])
            updates.append(ClientUpdate(cid, params, num, metrics, records))
            norms[cid] = norm
        return self._screen_norms(server_round, updates, reference, rejected, phase, norms)

    def _screen_norms(self, server_round: int, updates: list[ClientUpdate], reference: Params,
                      rejected: list[Failure], phase: str, norms: dict[int, UpdateNorm] | None = None
                      ) -> tuple[list[ClientUpdate], list[Failure]]:
        """Reject updates whose norm exceeds update-norm-factor x the round's median update norm, the limit
        scaled up for a client whose registered samples allow more local steps than the round's median
        client (``update-norm-scale='local-steps'``, :func:`strategies.update_screen.relative_limits`)
        (``norms``: cid -> the update's norm where already known, exactly or bracketed)."""
        factor = self.cfg.update_norm_factor
        if factor <= 0 or len(updates) < 3:
            return updates, rejected
        scales = self._step_scales(updates)
        known = [(norms or {}).get(u.cid) for u in updates]
        if all(n is not None for n in known):
            # every exact norm is >= its lo, so the exact median is >= the median of the lo's and each exact
            # limit >= its limit from the lo's: an update whose hi is within that is within its exact limit
            limits_lo = relative_limits([n.lo for n in known], scales, factor)
            if all(n.hi <= lim for n, lim in zip(known, limits_lo)):
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
        return [step_scale(u.num_examples, c.local_epochs, c.batch_size, c.max_local_steps, c.momentum)
                for u in updates]

    # ============================================================================ one round
    def train_round(self, grid: Grid, server_round: int, params: Params) -> RoundOutcome:
        """Sample, send, collect, validate, aggregate; retry with a new sample if too few updates arrive."""
        self.refresh_clients(grid, server_round=server_round)
        failures: list[Failure] = []
        sent = received = 0
        for attempt in range(self.cfg.round_retries + 1):
            sampled = self.sample(server_round)
            sends = {cid: (self.clients[cid].node_id, self.train_content(server_round, cid, params))
                     for cid in sampled}
            res = exchange(grid, sends, "train", self.cfg.round_timeout, server_round,
                           poll=self.cfg.reply_poll_interval)
            updates, rejected = self.collect_updates(server_round, res.replies, params)
            if self.state_ledger is not None:  # a resume without the clients' state stops here
                self.state_ledger.check_refusals(res.failures)
            failures += res.failures + rejected
            sent += res.bytes_sent
            received += res.bytes_received
            self._forget_lost(res)
            need = min(self.cfg.min_train_replies, len(sampled))
            if len(updates) >= need and updates:
                new_params = self.aggregate(server_round, params, updates)
                return RoundOutcome(new_params, updates, sampled, failures, sent, received)
            log.warning("round %s attempt %s: %s usable update(s), need %s", server_round, attempt + 1,
                        len(updates), need)
            self.refresh_clients(grid, wait=False, server_round=server_round)
        reasons = "; ".join(f"client {f.cid}: {f.kind} ({f.reason})" for f in failures[-10:])
        raise RoundFailed(f"round {server_round}: fewer than min-train-replies={self.cfg.min_train_replies} "
                          f"usable updates after {self.cfg.round_retries + 1} attempt(s). Failures: {reasons}")


    def federated_evaluate(self, grid: Grid, server_round: int, params: Params) -> tuple[dict[int, dict], list[Failure]]:
        """The global model (and each client's last local model) on the local test split of every registered
        client, or of ``federated-eval-clients`` of them (:meth:`federated_eval_cids`)."""
        sends = {cid: (self.clients[cid].node_id, self.evaluate_content(server_round, cid, params))
                 for cid in self.federated_eval_cids()}
        res = exchange(grid, sends, "evaluate", self.cfg.round_timeout, server_round, phase="evaluate",
                       poll=self.cfg.reply_poll_interval)
        self._forget_lost(res)
        return {cid: dict(r.content["metrics"]) for cid, r in res.replies.items()}, res.failures

