"""The strategy base every method extends (FL-bench style: override a few small hooks).

FLStrategy = the hooks below + ClientRegistry (strategies/client_registry.py: registration, sampling) +
RoundDriver (strategies/round_driver.py: messages, exchange, validation, retries) + FlowerStrategyAPI
(strategies/flower_api.py: Flower's Strategy methods). Aggregation math is in strategies/aggregation.py.

Hooks for methods:
    client_config(rnd, cid)   -> per-client scalars in that client's message (FedBC's lambda_k, gamma_k)
    client_records(rnd, cid)  -> per-client extra records (SCAFFOLD's c, ETF memory vectors)
    aggregate(rnd, params, updates) -> new global params (FedAvg's weighted mean by default)
    sample(rnd)               -> client ids for the round (FedUFO's dynamic sampling)
    train_round(grid, rnd, params) -> the whole round (FedUFO's prior/relay/posterior phases)
    state_dict() / load_state_dict() -> everything needed to resume (extend with super())
    round_metrics()           -> method scalars logged in results.json every round
"""


from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import Strategy

from flcore.config import RunConfig
from strategies.aggregation import weighted_average
from strategies.client_registry import ClientInfo, ClientRegistry, RoundFailed
from strategies.exchange import Failure
from strategies.flower_api import FlowerStrategyAPI
from strategies.round_driver import ClientUpdate, Params, RoundDriver, RoundOutcome

__all__ = ["FLStrategy", "ClientInfo", "ClientUpdate", "RoundOutcome", "RoundFailed", "Failure", "Params"]


class FLStrategy(ClientRegistry, RoundDriver, FlowerStrategyAPI, Strategy):
    """FedAvg over the Message API with seeded sampling, validation, failures and checkpointable state."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.clients: dict[int, ClientInfo] = {}
        self.rng = np.random.default_rng(cfg.seed)
        self.client_accuracy: dict[int, float] = {}  # last local accuracy each client reported
        # nodes whose registration failed: node id -> (failed attempts, first round to ask again)
        self.register_backoff: dict[int, tuple[int, int]] = {}
        self.register_failures: list[Failure] = []  # not yet reported in a round's results (drained)

    # ============================================================================ hooks for methods
    def client_config(self, server_round: int, cid: int) -> dict[str, Any]:
        return {}

    def client_records(self, server_round: int, cid: int) -> dict[str, ArrayRecord | ConfigRecord]:
        return {}

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        """FedAvg: sample-size weighted mean of the client models."""
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])

    def round_metrics(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "client_accuracy": dict(self.client_accuracy)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.client_accuracy = {int(k): float(v) for k, v in state["client_accuracy"].items()}

