"""SCAFFOLD (Karimireddy et al., ICML 2020), server side (paper Alg. 1, lines 15-17).

    x <- x + eta_g * (1/|S|) sum_{i in S} (y_i - x)
    c <- c + (|S|/N) * (1/|S|) sum_{i in S} delta c_i   =  c + (1/N) sum_{i in S} delta c_i
with N the number of registered clients. The server variate c is part of the checkpointed state and goes
to every sampled client as record ``scaffold-c`` (so SCAFFOLD sends two models' worth per client).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from flcore.config import RunConfig
from flcore.methods.scaffold import DELTA_C, SERVER_C, ScaffoldConfig
from flcore.records import params_to_record, record_to_params
from strategies.aggregation import apply_update, deltas
from strategies.base import ClientUpdate, FLStrategy
from strategies.update_checks import arrays_problem, cast_like, is_float, reject_updates

Arrays = Mapping[str, np.ndarray]


def scaffold_model_update(x: Arrays, ys: Sequence[Arrays], server_lr: float) -> "OrderedDict[str, np.ndarray]":
    """Alg. 1 line 16: x + eta_g * mean_i (y_i - x) (uniform mean over the clients that reported)."""
    if not ys:
        raise ValueError("scaffold_model_update needs at least one client model")
    ds = [deltas(x, y) for y in ys]
    mean_delta = OrderedDict((k, sum(d[k] for d in ds) / len(ds)) for k in x)
    return apply_update(x, mean_delta, server_lr)


def scaffold_variate_update(c: Arrays, delta_cs: Sequence[Arrays], num_clients: int) -> "OrderedDict[str, np.ndarray]":
    """Alg. 1 line 17: c + (|S|/N) mean_{i in S} delta c_i = c + (1/N) sum_{i in S} delta c_i (float64).

    Tensors absent from a client's delta (non-trainable entries) count as zero.
    """
    if num_clients < len(delta_cs) or num_clients <= 0:
        raise ValueError(f"num_clients (N={num_clients}) must be >= the number of reports ({len(delta_cs)})")
    out = OrderedDict()
    for k, v in c.items():
        total = np.zeros(np.shape(v), dtype=np.float64)
        for d in delta_cs:
            if k in d:
                total += np.asarray(d[k], dtype=np.float64)
        out[k] = np.asarray(v, dtype=np.float64) + total / num_clients
    return out


class ScaffoldStrategy(FLStrategy):
    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.scfg = cfg.section(ScaffoldConfig)
        self.c: "OrderedDict[str, np.ndarray]" = OrderedDict()  # float64, one entry per float tensor
        self._like: "OrderedDict[str, np.ndarray]" = OrderedDict()

    def _ensure_c(self, params: Arrays) -> None:
        """c starts at zero (Alg. 1) for every floating-point tensor of the model."""
        if not self.c:
            self.c = OrderedDict((k, np.zeros(np.shape(v), np.float64)) for k, v in params.items() if is_float(v))
        self._like = OrderedDict((k, np.asarray(params[k])) for k in self.c)

    def train_content(self, server_round: int, cid: int, params: Arrays,
                      message_config: dict[str, Any] | None = None) -> RecordDict:
        self._ensure_c(params)
        return super().train_content(server_round, cid, params, message_config)

    def client_records(self, server_round: int, cid: int) -> dict[str, ArrayRecord | ConfigRecord]:
        return {SERVER_C: params_to_record(cast_like(self.c, self._like))}

    def collect_updates(self, server_round, replies, reference, phase: str = "train"):
        updates, rejected = super().collect_updates(server_round, replies, reference, phase)
        self._ensure_c(reference)
        return reject_updates(server_round, updates, rejected, self._delta_c_problem, phase)

    def _delta_c_problem(self, u: ClientUpdate) -> str | None:
        rec = u.records.get(DELTA_C)
        if not isinstance(rec, ArrayRecord):
            return f"SCAFFOLD record '{DELTA_C}' missing from the reply"
        return arrays_problem(record_to_params(rec), self.c, DELTA_C)

    def aggregate(self, server_round: int, params, updates: list[ClientUpdate]):
        self._ensure_c(params)
        new_params = scaffold_model_update(params, [u.params for u in updates], self.scfg.server_lr)
        delta_cs = [record_to_params(u.records[DELTA_C]) for u in updates]
        num_clients = max(len(self.clients), len(updates))
        self.c = scaffold_variate_update(self.c, delta_cs, num_clients)
        return new_params

    def round_metrics(self) -> dict[str, Any]:
        norm = math.sqrt(sum(float(np.sum(v ** 2)) for v in self.c.values()))
        return {"scaffold-c-norm": norm}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["scaffold_c"] = {k: v.copy() for k, v in self.c.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.c = OrderedDict((k, np.asarray(v, np.float64)) for k, v in state["scaffold_c"].items())
