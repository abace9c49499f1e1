"""FedMTL (MOCHA, Smith et al., NeurIPS 2017; flcore/methods/fedmtl.py), server side: W, Omega and the coupling.

The server keeps every registered client's latest model w_t (W's columns; the initial model before a client
trains) and Omega (Sigma = I / K at the start, opt/run_mocha.m). Client t's message carries w_t as the model,
u_t = sum_{j != t} Omega_tj w_j as record ``fedmtl-coupling`` and Omega_tt as config. After each round the replies
replace their columns and Omega is recomputed from W (omega_from_models).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from flcore.config import RunConfig
from flcore.methods.fedmtl import COUPLING, OMEGA_TT, omega_from_gram
from flcore.records import params_to_record
from strategies.aggregation import weighted_average
from strategies.base import ClientUpdate, FLStrategy, Params


def copied(params: Params) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict((k, np.array(v, copy=True)) for k, v in params.items())


def floating(params: Params) -> list[str]:
    return [k for k, v in params.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]


class FedMTLStrategy(FLStrategy):
    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.initial: "OrderedDict[str, np.ndarray] | None" = None
        self.models: dict[int, OrderedDict[str, np.ndarray]] = {}
        self.omega: np.ndarray | None = None      # over ``self.omega_ids``
        self.omega_ids: list[int] = []
        self._info: dict[str, Any] = {}

    def model_of(self, cid: int) -> Params:
        return self.models.get(int(cid), self.initial)  # type: ignore[return-value]

    def current_omega(self) -> tuple[list[int], np.ndarray]:
        """Omega over the registered clients: the last update's, or K I (Sigma = I / K) when the clients changed."""
        ids = sorted(int(c) for c in self.clients)
        if self.omega is None or self.omega_ids != ids:
            self.omega_ids, self.omega = ids, np.eye(len(ids)) * len(ids)
        return self.omega_ids, self.omega

    def train_content(self, server_round: int, cid: int, params: Params,
                      message_config: dict[str, Any] | None = None) -> RecordDict:
        if self.initial is None:
            self.initial = copied(params)
        return super().train_content(server_round, cid, self.model_of(cid), message_config)

    def client_config(self, server_round: int, cid: int) -> dict[str, Any]:
        ids, omega = self.current_omega()
        t = ids.index(int(cid))
        return {OMEGA_TT: float(omega[t, t])}

    def client_records(self, server_round: int, cid: int) -> dict[str, ArrayRecord | ConfigRecord]:
        ids, omega = self.current_omega()
        t = ids.index(int(cid))
        names = floating(self.initial)  # type: ignore[arg-type]
        u = {k: sum(omega[t, j] * np.asarray(self.model_of(c)[k], dtype=np.float64)
                    for j, c in enumerate(ids) if c != int(cid)) for k in names}
        return {COUPLING: params_to_record({k: np.asarray(v, dtype=np.float32) for k, v in u.items()})}

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        """The replies replace their columns of W; Omega is recomputed from W; the server model is their mean."""
        for u in updates:
            self.models[int(u.cid)] = copied(u.params)
        ids = sorted(int(c) for c in self.clients)
        names = floating(self.initial if self.initial is not None else params)
        gram = np.zeros((len(ids), len(ids)))
        for k in names:  # W^T W entry by entry: never the (d, K) matrix itself (d is the model size)
            cols = np.stack([np.asarray(self.model_of(c)[k], np.float64).ravel() for c in ids], axis=1)
            gram += cols.T @ cols
        self.omega_ids, self.omega = ids, omega_from_gram(gram)
        self._info = {"fedmtl-omega-diag-mean": float(np.mean(np.diag(self.omega))),
                      "fedmtl-omega-offdiag-mean": float((self.omega.sum() - np.trace(self.omega))
                                                         / max(len(ids) * (len(ids) - 1), 1))}
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])

    def round_metrics(self) -> dict[str, Any]:
        return dict(self._info)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["fedmtl"] = {"initial": None if self.initial is None else copied(self.initial),
                           "models": {str(c): copied(p) for c, p in self.models.items()},
                           "omega": None if self.omega is None else self.omega.copy(), "omega-ids": list(self.omega_ids)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        s = state["fedmtl"]
        self.initial = None if s["initial"] is None else copied(s["initial"])
        self.models = {int(c): copied(p) for c, p in s["models"].items()}
        self.omega = None if s["omega"] is None else np.asarray(s["omega"], dtype=np.float64)
        self.omega_ids = [int(c) for c in s["omega-ids"]]
