"""Driving one round over the Message API: sample, send, collect, validate, aggregate, retry.

A part of the strategy (strategies/base.py composes it as ``strategy.driver``). It owns no state: it is given
the run config, the client registry (registration, node ids, lost nodes, who is evaluated) and the strategy's
hooks as a :class:`RoundSteps` (who is sampled, what each message holds, which replies are usable, how they
are aggregated, whether the clients found their state), so that a method's overrides of those hooks drive
the base round. Message contents: strategies/messages.py; the checks of the replies: strategies/update_checks.py.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import numpy as np
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from flcore.config import RunConfig
from strategies.client_registry import ClientRegistry, RoundFailed
from strategies.exchange import Failure, exchange
from strategies.reply_schema import EVAL_METRICS, REQUIRED_EVAL, metrics_problem
from strategies.update_checks import ClientUpdate

log = logging.getLogger("noniid_fl")

Params = "OrderedDict[str, np.ndarray]"


@dataclass
class RoundOutcome:
    params: "OrderedDict[str, np.ndarray]"
    updates: list[ClientUpdate]
    sampled: list[int]
    failures: list[Failure] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0


class RoundSteps(Protocol):
    """The strategy's hooks a round is made of (FLStrategy implements them; methods override some)."""

    def sample(self, server_round: int) -> list[int]: ...

    def train_content(self, server_round: int, cid: int, params: Any,
                      message_config: dict[str, Any] | None = None) -> RecordDict: ...

    def evaluate_content(self, server_round: int, cid: int, params: Any,
                         message_config: dict[str, Any] | None = None) -> RecordDict: ...

    def collect_updates(self, server_round: int, replies: Mapping[int, Message], reference: Any,
                        phase: str = "train") -> tuple[list[ClientUpdate], list[Failure]]: ...

    def aggregate(self, server_round: int, params: Any, updates: list[ClientUpdate]) -> Any: ...

    def check_client_state(self, failures: list[Failure]) -> None: ...


class RoundDriver:
    """The exchange of a training round with retries, and of a federated evaluation."""

    def __init__(self, cfg: RunConfig, registry: ClientRegistry, steps: RoundSteps) -> None:
        self.cfg = cfg
        self.registry = registry
        self.steps = steps

    def train_round(self, grid: Grid, server_round: int, params: "OrderedDict[str, np.ndarray]") -> RoundOutcome:
        """Sample, send, collect, validate, aggregate; retry with a new sample if too few updates arrive."""
        cfg, registry, steps = self.cfg, self.registry, self.steps
        registry.refresh(grid, server_round=server_round)
        failures: list[Failure] = []
        sent = received = 0
        for attempt in range(cfg.round_retries + 1):
            sampled = steps.sample(server_round)
            sends = {cid: (registry.clients[cid].node_id, steps.train_content(server_round, cid, params))
                     for cid in sampled}
            res = exchange(grid, sends, "train", cfg.round_timeout, server_round, poll=cfg.reply_poll_interval)
            updates, rejected = steps.collect_updates(server_round, res.replies, params)
            steps.check_client_state(res.failures)  # a resume without the clients' state stops here
            failures += res.failures + rejected
            sent += res.bytes_sent
            received += res.bytes_received
            registry.forget_lost(res)
            need = min(cfg.min_train_replies, len(sampled))
            if len(updates) >= need and updates:
                new_params = steps.aggregate(server_round, params, updates)
                return RoundOutcome(new_params, updates, sampled, failures, sent, received)
            log.warning("round %s attempt %s: %s usable update(s), need %s", server_round, attempt + 1,
                        len(updates), need)
            registry.refresh(grid, wait=False, server_round=server_round)
        reasons = "; ".join(f"client {f.cid}: {f.kind} ({f.reason})" for f in failures[-10:])
        raise RoundFailed(f"round {server_round}: fewer than min-train-replies={cfg.min_train_replies} "
                          f"usable updates after {cfg.round_retries + 1} attempt(s). Failures: {reasons}")

    def federated_evaluate(self, grid: Grid, server_round: int, params: "OrderedDict[str, np.ndarray]"
                           ) -> tuple[dict[int, dict], list[Failure]]:
        """The global model (and each client's last local model) on the local test split of every registered
        client, or of ``federated-eval-clients`` of them (:meth:`ClientRegistry.eval_cids`)."""
        registry = self.registry
        sends = {cid: (registry.clients[cid].node_id, self.steps.evaluate_content(server_round, cid, params))
                 for cid in registry.eval_cids()}
        res = exchange(grid, sends, "evaluate", self.cfg.round_timeout, server_round, phase="evaluate",
                       poll=self.cfg.reply_poll_interval)
        registry.forget_lost(res)
        out, failures = {}, list(res.failures)
        for cid, reply in sorted(res.replies.items()):
            metrics = reply.content.get("metrics") if set(reply.content.keys()) == {"metrics"} else None
            problem = ("an evaluation reply holds exactly one record, 'metrics'; got "
                       + ", ".join(map(repr, reply.content.keys())) if metrics is None
                       else metrics_problem(metrics, EVAL_METRICS, REQUIRED_EVAL, (), cid))
            if problem is not None:
                failures.append(Failure(cid, "evaluate", "rejected", f"malformed reply: {problem}"))
                log.warning("round %s: evaluation reply of client %s rejected: %s", server_round, cid, problem)
                continue
            out[cid] = dict(metrics)
        return out, failures
