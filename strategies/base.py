"""The strategy base every method extends (FL-bench style: override a few small hooks).

FLStrategy is the hooks below, composed of parts that each own their state and talk through small public
interfaces (none reaches into another's private members; tests/test_architecture.py checks it):

    self.registry  ClientRegistry   (strategies/client_registry.py: registration, seeded sampling, accuracies)
    self.messages  MessageBuilder   (strategies/messages.py: the records of query/train/evaluate messages)
    self.checks    UpdateChecks     (strategies/update_checks.py: which replies are usable updates, and why not)
    self.driver    RoundDriver      (strategies/round_driver.py: the exchanges of a round, retries, evaluation)
    self.ledger    StateLedger      (strategies/state_ledger.py: run-bound client state; set by begin_run)

and the Flower ``Strategy`` face (strategies/flower_api.py). Aggregation math is in strategies/aggregation.py.

Hooks for methods:
    client_config(rnd, cid)   -> per-client scalars in that client's message (FedBC's lambda_k, gamma_k)
    client_records(rnd, cid)  -> per-client extra records (SCAFFOLD's c, ETF memory vectors)
    aggregate(rnd, params, updates) -> new global params (FedAvg's weighted mean by default)
    sample(rnd)               -> client ids for the round (FedUFO's dynamic sampling)
    collect_updates(rnd, replies, reference, phase) -> (usable updates, rejections) (extend with super())
    train_round(grid, rnd, params) -> the whole round (FedUFO's prior/relay/posterior phases)
    state_dict() / load_state_dict() -> everything needed to resume (extend with super())
    round_metrics()           -> method scalars logged in results.json every round
What a method reads: ``cfg``, ``clients`` (id -> ClientInfo), ``rng`` (the seeded sampler's stream),
``client_accuracy``; a ``train_round`` of its own is a sequence of phases on the round primitive
(``driver.phase`` per exchange, ``driver.with_retries`` around an attempt; strategies/round_driver.py) with
``refresh_clients``, ``sample`` and ``train_content``.
"""


from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.serverapp import Grid

from flcore.named_arrays import Params
from flcore.config import RunConfig
from flcore.protocol import CLIENT_STATE
from flcore.registry import get_method
from strategies.aggregation import weighted_average
from strategies.client_registry import ClientInfo, ClientRegistry, RoundFailed
from strategies.exchange import Failure
from strategies.flower_api import FlowerStrategyAPI
from strategies.messages import MessageBuilder
from strategies.round_driver import RoundDriver, RoundOutcome
from strategies.state_ledger import StateLedger
from strategies.update_checks import ClientUpdate, UpdateChecks

__all__ = ["FLStrategy", "ClientInfo", "ClientUpdate", "RoundOutcome", "RoundFailed", "Failure", "Params"]


class FLStrategy(FlowerStrategyAPI):
    """FedAvg over the Message API with seeded sampling, validation, failures and checkpointable state."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.messages = MessageBuilder(cfg)
        self.registry = ClientRegistry(cfg, query=self.messages.query)
        self.checks = UpdateChecks(cfg, registered_samples=self.registry.registered_samples,
                                   payload=get_method(cfg.method).payload,
                                   weight_samples=self.registry.weight_samples,
                                   screen_samples=self.registry.screen_samples)
        self.driver = RoundDriver(cfg, self.registry, steps=self)
        self.ledger: StateLedger | None = None  # run-bound client state, from begin_run (None: not bound)

    # ============================================================================ hooks for methods
    def client_config(self, server_round: int, cid: int) -> dict[str, Any]:
        return {}

    def client_records(self, server_round: int, cid: int) -> dict[str, ArrayRecord | ConfigRecord]:
        return {}

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        """FedAvg: sample-size weighted mean of the client models."""
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])

    def sample(self, server_round: int) -> list[int]:
        """ceil(fraction-train * N) clients (at least min-train-nodes), uniformly, seeded."""
        return self.registry.sample()

    def train_round(self, grid: Grid, server_round: int, params: Params) -> RoundOutcome:
        """Sample, send, collect, validate, aggregate; retry with a new sample if too few updates arrive."""
        return self.driver.train_round(grid, server_round, params)

    def round_metrics(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return self.registry.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.registry.load_state_dict(state)

    # ============================================================================ what methods read
    @property
    def clients(self) -> dict[int, ClientInfo]:
        """The registered clients: stable id -> ClientInfo (the registry's)."""
        return self.registry.clients

    @property
    def rng(self) -> np.random.Generator:
        """The seeded sampler's random stream (checkpointed)."""
        return self.registry.rng

    @property
    def client_accuracy(self) -> dict[int, float]:
        """The last local accuracy each client reported (FedUFO's dynamic sampling ranks by it)."""
        return self.registry.accuracy

    @client_accuracy.setter
    def client_accuracy(self, value: dict[int, float]) -> None:
        self.registry.accuracy = value

    # ============================================================================ the round's steps
    def refresh_clients(self, grid: Grid, wait: bool = True, server_round: int = 0) -> None:
        """Register the nodes not known yet (:meth:`ClientRegistry.refresh`)."""
        self.registry.refresh(grid, wait=wait, server_round=server_round)

    def train_content(self, server_round: int, cid: int, params: Params,
                      message_config: dict[str, Any] | None = None) -> RecordDict:
        """A train message: run config, model, config (server-round, cid, ``client_config``, then
        ``message_config``), the method's ``client_records`` and the client's state binding."""
        values = {**self.client_config(server_round, cid), **(message_config or {})}
        extra = dict(self.client_records(server_round, cid))
        if self.ledger is not None:
            extra[CLIENT_STATE] = self.ledger.record(cid)
        return self.messages.train(server_round, cid, params, values, extra)

    def evaluate_content(self, server_round: int, cid: int, params: Params,
                         message_config: dict[str, Any] | None = None) -> RecordDict:
        """An "evaluate" message: run config, the model, server-round and cid (+ ``message_config``)."""
        return self.messages.evaluate(server_round, cid, params, message_config)

    def collect_updates(self, server_round: int, replies: Mapping[int, Any], reference: Params,
                        phase: str = "train") -> tuple[list[ClientUpdate], list[Failure]]:
        """The usable updates among ``replies`` and the rejected ones, each named (:class:`UpdateChecks`);
        the ledger learns which clients kept state, the registry their reported accuracy."""
        checked = self.checks.check(server_round, replies, reference, phase)
        if self.ledger is not None:  # the client saved its state before it replied
            for cid, metrics in checked.metrics.items():
                self.ledger.note_reply(cid, server_round, metrics)
        self.registry.note_accuracy(checked.updates)
        return self.checks.screen(server_round, checked.updates, reference, checked.rejected, phase, checked.norms)

    def federated_evaluate(self, grid: Grid, server_round: int, params: Params
                           ) -> tuple[dict[int, dict], list[Failure]]:
        """Per-client metrics of the global model on the evaluated clients' local test splits, and failures."""
        return self.driver.federated_evaluate(grid, server_round, params)

    # ============================================================================ the run's client state
    def begin_run(self, resumed_after: int | None = None, client_state: Mapping[str, Any] | None = None) -> None:
        """Bind this run's client state (strategies/state_ledger.py): a new run, or with ``resumed_after`` the
        continuation of the checkpoint of that round, which stored ``client_state`` (None: it stored none)."""
        self.ledger = (StateLedger.fresh() if resumed_after is None
                       else StateLedger.resumed(client_state, resumed_after, self.cfg.method))

    def check_client_state(self, failures: list[Failure]) -> None:
        """End the run (ClientStateMissing) when a client refused to train for want of the state it kept before
        the checkpoint this run resumed from; nothing when no client state is bound."""
        if self.ledger is not None:
            self.ledger.check_refusals(failures)
