"""FedMix / NaiveMix (Yoon et al., ICLR 2021; flcore/methods/fedmix.py), server side: FedAvg's average, plus the
Mean Augmented FL relay. Before a round's training the server asks every registered client whose means it does
not hold (round 1: all) for them, in one exchange (``train.means``); it keeps each client's means, pools them in
client-id order and sends the pool to every sampled client (record ``fedmix-global``). The means are
checkpointed (a resumed run relays the same pool and asks no client again).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from flcore.config import RunConfig
from flcore.methods.fedmix import GLOBAL, MEANS, MEANS_ACTION, POOL_SIZE
from flcore.records import params_to_record, record_to_params
from strategies.aggregation import weighted_average
from strategies.base import ClientUpdate, FLStrategy, Params, RoundOutcome

log = logging.getLogger("noniid_fl")


def pooled(means: dict[int, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Every client's means stacked in client-id order: (x (m, ...), y (m, C))."""
    order = sorted(means)
    return (np.concatenate([means[c][0] for c in order]), np.concatenate([means[c][1] for c in order]))


def checked_means(cid: int, record: ArrayRecord) -> tuple[np.ndarray, np.ndarray]:
    """A client's means from its reply record, refused (naming the client) unless x is (m, ...) and y an (m, C)
    array of distributions."""
    arrays = record_to_params(record)
    if set(arrays) != {"x", "y"}:
        raise ValueError(f"client {cid}: record '{MEANS}' must hold arrays 'x' and 'y', got {sorted(arrays)}")
    x, y = np.asarray(arrays["x"]), np.asarray(arrays["y"])
    if x.ndim < 2 or y.ndim != 2 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise ValueError(f"client {cid}: record '{MEANS}' has x {x.shape} and y {y.shape} (need m > 0 rows each)")
    if not (np.isfinite(x).all() and np.isfinite(y).all() and np.all(y >= 0)
            and np.allclose(y.sum(1), 1.0, atol=1e-4)):
        raise ValueError(f"client {cid}: record '{MEANS}' holds non-finite inputs or labels that are not "
                         "distributions")
    return x, y


class FedMixStrategy(FLStrategy):
    """FedAvg plus the relay of the pooled means."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.means: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def train_round(self, grid: Grid, server_round: int, params: Params) -> RoundOutcome:
        """The means request to the clients the pool lacks, then FedAvg's round with the pool relayed."""
        self.refresh_clients(grid, server_round=server_round)
        missing = sorted(c for c in self.clients if c not in self.means)
        sent = received = 0
        failures: list = []
        if missing:
            res = self.driver.phase(grid, server_round, MEANS_ACTION,
                                    {cid: self.train_content(server_round, cid, params) for cid in missing},
                                    collect=False)  # replies are the clients' means, not models
            for cid in sorted(res.replies):
                record = res.replies[cid].content.get(MEANS)
                try:
                    if record is None:
                        raise ValueError(f"client {cid}: the reply to '{MEANS_ACTION}' has no record '{MEANS}'")
                    if not isinstance(record, ArrayRecord):
                        raise ValueError(f"client {cid}: the reply to '{MEANS_ACTION}' holds '{MEANS}' as a "
                                         f"{type(record).__name__}, not an ArrayRecord")
                    self.means[cid] = checked_means(cid, record)
                except ValueError as err:
                    log.warning("round %s: FedMix means left out: %s", server_round, err)
            sent, received, failures = res.bytes_sent, res.bytes_received, list(res.failures)
        outcome = super().train_round(grid, server_round, params)
        outcome.failures += failures
        outcome.bytes_sent += sent
        outcome.bytes_received += received
        return outcome

    def client_records(self, server_round: int, cid: int) -> dict[str, ArrayRecord | ConfigRecord]:
        if not self.means:
            return {}
        x, y = pooled(self.means)
        return {GLOBAL: params_to_record({"x": x, "y": y})}

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])

    def round_metrics(self) -> dict[str, Any]:
        return {POOL_SIZE: int(sum(x.shape[0] for x, _ in self.means.values()))}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["fedmix"] = {str(c): {"x": x.copy(), "y": y.copy()} for c, (x, y) in self.means.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.means = {int(c): (np.asarray(v["x"]), np.asarray(v["y"])) for c, v in state["fedmix"].items()}
