"""FedMix / NaiveMix (Yoon et al., ICLR 2021; flcore/methods/fedmix.py), server side: FedAvg's average, plus the
Mean Augmented FL relay. The server keeps each client's shared means (received once, in the client's first
reply: config ``fedmix-send-means`` asks for them), pools them in client-id order and sends the pool to every
sampled client (record ``fedmix-global``). The means are checkpointed (a resumed run relays the same pool).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from flcore.config import RunConfig
from flcore.methods.fedmix import GLOBAL, MEANS, POOL_SIZE, SEND_MEANS
from flcore.records import params_to_record, record_to_params
from strategies.aggregation import weighted_average
from strategies.base import ClientUpdate, FLStrategy, Params


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

    def client_config(self, server_round: int, cid: int) -> dict[str, Any]:
        return {SEND_MEANS: int(cid not in self.means)}

    def client_records(self, server_round: int, cid: int) -> dict[str, ArrayRecord]:
        if not self.means:
            return {}
        x, y = pooled(self.means)
        return {GLOBAL: params_to_record({"x": x, "y": y})}

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        for u in updates:
            if MEANS in u.records:
                self.means[u.cid] = checked_means(u.cid, u.records[MEANS])
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
