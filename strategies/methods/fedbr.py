"""FedBR server (Guo, Tang & Lin, ICML 2023; seed 003, Algorithm 1 lines 13-15).

phi, omega and the projection head theta are all averaged uniformly over the M clients of the round:
x_{t+1} = x_t + (1/M) sum_i (x_i - x_t) = (1/M) sum_i x_i. ``fedbr-weighting = samples`` weights by n_k instead.
The round's client means of the mechanism's quantities (flcore/methods/fedbr.py: L_con before and after the max
step and at the end of local training, the two cosine similarities inside L_con, the pseudo-data CE) are logged
every round.
With ``rsm-scope = shared`` (the authors' one RSM set over every client's data) each client is told the number of
clients in the federation (per-client config ``fedbr-num-clients``: the clients registered when it is first sent,
fixed for the run), from which it derives every client's partition and builds the same set as every other client.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from flcore.config import RunConfig
from flcore.methods.fedbr import METRICS, NUM_CLIENTS, br_config
from strategies.aggregation import apply_update, deltas
from strategies.base import ClientUpdate, FLStrategy, Params


def uniform_delta_average(global_params: Params, client_params: list[Params],
                          weights: list[float] | None = None) -> Params:
    """theta + sum_i w_i (theta_i - theta) / sum_i w_i, w_i = 1 by default (Alg. 1 lines 13-15).

    Equal to the (weighted) mean of the client models for float tensors; integer buffers are rounded.
    """
    if not client_params:
        raise ValueError("FedBR aggregation needs at least one client update")
    w = np.ones(len(client_params)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape[0] != len(client_params) or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero, got {w.tolist()}")
    w = w / w.sum()
    ds = [deltas(global_params, p) for p in client_params]
    mean_delta = OrderedDict((k, sum(wi * d[k] for wi, d in zip(w, ds))) for k in global_params)
    return apply_update(global_params, mean_delta)


class FedBRStrategy(FLStrategy):
    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.fb = br_config(cfg)  # fedbr.* (fedbr-code.* for fedbr-code), validated before round 1
        self._metrics: dict[str, Any] = {}
        self._num_clients: int | None = None  # the federation the shared RSM set is drawn over (first sent)

    def client_config(self, server_round: int, cid: int) -> dict[str, Any]:
        """``fedbr-num-clients`` for a shared RSM set: the clients registered when it is first sent, then fixed
        for the run (checkpointed), so every client builds its set over the same federation."""
        if not (self.fb.uses_pseudo and self.fb.pseudo == "rsm" and self.fb.rsm_scope == "shared"):
            return {}
        if self._num_clients is None:
            self._num_clients = len(self.clients)
        return {NUM_CLIENTS: self._num_clients}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), NUM_CLIENTS: self._num_clients}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._num_clients = state.get(NUM_CLIENTS)

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        weights = None if self.fb.weighting == "uniform" else [float(u.num_examples) for u in updates]
        self._metrics = {}
        for key in METRICS:
            vals = [float(u.metrics[key]) for u in updates if key in u.metrics]
            if vals:
                self._metrics[key] = float(np.mean(vals))
        return uniform_delta_average(params, [u.params for u in updates], weights)

    def round_metrics(self) -> dict[str, Any]:
        return dict(self._metrics)
