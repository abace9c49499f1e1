"""APPLE (Luo & Wu, IJCAI 2022; flcore/methods/apple.py), server side: the store and relay of the core models.

The server keeps every registered client's latest core model w_c^(j) (a client that has not trained yet: the
initial model). Client i's train message carries its own core as the model and every other registered client's
core as record ``apple-core.<j>``, with ``apple-group`` (client ids, sample counts n_j for p_0): the downloads of
the paper's workflow (Fig. 1), K models per client per round. The replies are the trained cores: each replaces
its client's stored core. The server's own model (evaluated for G-FL) is the sample-weighted mean of the round's
cores, which APPLE does not use. The cores and the initial model are checkpointed.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from flcore.config import RunConfig
from flcore.methods.apple import CORE_PREFIX, GROUP, P_SELF
from flcore.records import params_to_record
from strategies.aggregation import weighted_average
from strategies.base import ClientUpdate, FLStrategy, Params


def copied(params: Params) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict((k, np.array(v, copy=True)) for k, v in params.items())


class AppleStrategy(FLStrategy):
    """FedAvg's sampling and checks; the model sent is the client's own core, the other cores are relayed."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.initial: "OrderedDict[str, np.ndarray] | None" = None
        self.cores: dict[int, OrderedDict[str, np.ndarray]] = {}
        self._records: dict[int, ArrayRecord] = {}     # the round's core records, built once and shared
        self._info: dict[str, Any] = {}

    def core(self, cid: int, params: Params) -> Params:
        """w_c^(cid): the client's last trained core, else the initial model (the first model this strategy saw)."""
        if self.initial is None:
            self.initial = copied(params)
        return self.cores.get(int(cid), self.initial)

    def train_content(self, server_round: int, cid: int, params: Params,
                      message_config: dict[str, Any] | None = None) -> RecordDict:
        return super().train_content(server_round, cid, self.core(cid, params), message_config)

    def client_records(self, server_round: int, cid: int) -> dict[str, ArrayRecord | ConfigRecord]:
        """Every other registered client's core (``apple-core.<j>``) and the group (ids, sample counts)."""
        ids = sorted(int(c) for c in self.clients)
        out: dict[str, ArrayRecord | ConfigRecord] = {
            GROUP: ConfigRecord({"cids": ids, "samples": [int(self.clients[c].num_examples) for c in ids]})}
        for j in ids:
            if j == int(cid):
                continue
            if j not in self._records:
                self._records[j] = params_to_record(self.cores.get(j, self.initial))  # type: ignore[arg-type]
            out[f"{CORE_PREFIX}{j}"] = self._records[j]
        return out

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        """Store each reply's core; the server model is their sample-weighted mean."""
        for u in updates:
            self.cores[int(u.cid)] = copied(u.params)
        self._records = {}
        selfs = [float(u.metrics[P_SELF]) for u in updates if isinstance(u.metrics.get(P_SELF), (int, float))]
        self._info = {"apple-relayed-cores": max(len(self.clients) - 1, 0),
                      "apple-cores-trained": len(self.cores)}
        if selfs:
            self._info[f"mean-{P_SELF}"] = float(np.mean(selfs))
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])

    def round_metrics(self) -> dict[str, Any]:
        return dict(self._info)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["apple"] = {"initial": None if self.initial is None else copied(self.initial),
                          "cores": {str(c): copied(p) for c, p in self.cores.items()}}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        saved = state["apple"]
        self.initial = None if saved["initial"] is None else copied(saved["initial"])
        self.cores = {int(c): copied(p) for c, p in saved["cores"].items()}
        self._records = {}
