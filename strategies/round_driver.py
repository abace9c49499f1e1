"""Driving one round over the Message API: sample, send, collect, validate, aggregate, retry.

A part of the strategy (strategies/base.py composes it as ``strategy.driver``). It owns no state: it is given
the run config, the client registry (registration, node ids, lost nodes, who is evaluated) and the strategy's
hooks as a :class:`RoundSteps` (who is sampled, what each message holds, which replies are usable, how they
are aggregated, whether the clients found their state), so that a method's overrides of those hooks drive
the base round. Message contents: strategies/messages.py; the checks of the replies: strategies/update_checks.py.

The round primitive (issue 39): :meth:`RoundDriver.phase` is the one place a strategy's round sends an
exchange to clients and classifies what came back (strategies/exchange.py sends and sorts error / lost /
missing replies; here the replies are validated by ``collect_updates``, the clients' state is checked, lost
nodes are forgotten and silent ones counted, bytes are accounted); :meth:`RoundDriver.with_retries` repeats
an attempt (one or more phases) with a new sample until it yields ``min-train-replies`` usable updates. Every
method's round is a sequence of phases: FedAvg one ("train"), FedUFO two ("train.prior", "train.posterior"),
SphereFed's last round a "train.calibrate" after its training, FedMix a "train.means" before it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import numpy as np
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from flcore.config import RunConfig
from strategies.client_registry import ClientRegistry, RoundFailed
from strategies.exchange import Failure, exchange
from strategies.reply_schema import EVAL_METRICS, REQUIRED_EVAL, metrics_problem
from strategies.update_checks import ClientUpdate

log = logging.getLogger("noniid_fl")



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


@dataclass
class PhaseResult:
    """What one phase of a round (one exchange) gave: the usable updates (when its replies are models), every
    reply (for phases whose replies are other records), the failures (errors, lost nodes, timeouts, rejected
    replies) and the bytes each way."""

    updates: list[ClientUpdate]
    replies: dict[int, Message]
    failures: list[Failure]
    bytes_sent: int
    bytes_received: int


@dataclass
class Attempt:
    """One attempt of a round (:meth:`RoundDriver.with_retries`): who was sampled, the updates to aggregate,
    and what its phases cost."""

    sampled: list[int]
    updates: list[ClientUpdate]
    failures: list[Failure] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0

    def add(self, phase: PhaseResult) -> PhaseResult:
        self.failures += phase.failures
        self.bytes_sent += phase.bytes_sent
        self.bytes_received += phase.bytes_received
        return phase


class RoundDriver:
    """The exchanges of a training round (phases, with retries), and of a federated evaluation."""

    def __init__(self, cfg: RunConfig, registry: ClientRegistry, steps: RoundSteps) -> None:
        self.cfg = cfg
        self.registry = registry
        self.steps = steps

    def phase(self, grid: Grid, server_round: int, action: str, contents: Mapping[int, RecordDict],
              reference: Any = None, collect: bool = True) -> PhaseResult:
        """Send ``contents[cid]`` as message type ``action`` to each client's node and classify the replies:
        with ``collect``, the strategy's ``collect_updates`` (against ``reference``, the model the clients
        started from) validates them as updates; the clients' state is checked (a resume without it stops
        here), lost nodes are forgotten and silent clients counted towards eviction."""
        sends = {cid: (self.registry.clients[cid].node_id, content) for cid, content in contents.items()}
        res = exchange(grid, sends, action, self.cfg.round_timeout, server_round, poll=self.cfg.reply_poll_interval)
        updates, rejected = (self.steps.collect_updates(server_round, res.replies, reference, phase=action)
                             if collect else ([], []))
        self.steps.check_client_state(res.failures)
        self.registry.forget_lost(res)
        return PhaseResult(updates, res.replies, res.failures + rejected, res.bytes_sent, res.bytes_received)

    def with_retries(self, grid: Grid, server_round: int, params: Any, attempt: Callable[[int], Attempt],
                     what: str = "usable updates") -> RoundOutcome:
        """Run ``attempt(i)`` (sample, then one or more phases) until it yields min(min-train-replies,
        sampled) usable updates, at most 1 + round-retries times (new nodes are registered in between);
        aggregate them with the strategy's ``aggregate``; else :class:`RoundFailed` naming the last failures."""
        cfg, registry = self.cfg, self.registry
        failures: list[Failure] = []
        sent = received = 0
        for i in range(cfg.round_retries + 1):
            a = attempt(i)
            failures += a.failures
            sent += a.bytes_sent
            received += a.bytes_received
            need = min(cfg.min_train_replies, len(a.sampled))
            if a.updates and len(a.updates) >= need:
                new_params = self.steps.aggregate(server_round, params, a.updates)
                return RoundOutcome(new_params, a.updates, a.sampled, failures, sent, received)
            log.warning("round %s attempt %s: %s %s, need %s", server_round, i + 1, len(a.updates), what, need)
            registry.refresh(grid, wait=False, server_round=server_round)
        reasons = "; ".join(f"client {f.cid}: {f.phase} {f.kind} ({f.reason})" for f in failures[-10:])
        raise RoundFailed(f"round {server_round}: fewer than min-train-replies={cfg.min_train_replies} "
                          f"{what} after {cfg.round_retries + 1} attempt(s). Failures: {reasons}")

    def train_round(self, grid: Grid, server_round: int, params: "OrderedDict[str, np.ndarray]") -> RoundOutcome:
        """Sample, send, collect, validate, aggregate; retry with a new sample if too few updates arrive."""
        steps = self.steps
        self.registry.refresh(grid, server_round=server_round)

        def one(_: int) -> Attempt:
            sampled = steps.sample(server_round)
            a = Attempt(sampled, [])
            a.updates = a.add(self.phase(grid, server_round, "train",
                                         {cid: steps.train_content(server_round, cid, params) for cid in sampled},
                                         params)).updates
            return a

        return self.with_retries(grid, server_round, params, one)

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
            assert metrics is not None  # (a reply without it has a problem)
            out[cid] = dict(metrics)
        return out, failures
