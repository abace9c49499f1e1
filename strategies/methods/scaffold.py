"""SCAFFOLD (Karimireddy et al., ICML 2020), server side (paper Alg. 1, lines 15-17).

    x <- x + eta_g * (1/|S|) sum_{i in S} (y_i - x)
    c <- c + (|S|/N) * (1/|S|) sum_{i in S} delta c_i   =  c + (1/N) sum_{i in S} delta c_i
with N the number of registered clients. The server variate c is part of the checkpointed state and goes
to every sampled client as record ``scaffold-c`` (so SCAFFOLD sends two models' worth per client).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord

from flcore.named_arrays import Arrays
from flcore.methods.scaffold import DELTA_C, SERVER_C, ScaffoldConfig
from flcore.records import params_to_record, record_to_params
from strategies.aggregation import apply_update, deltas
from strategies.base import ClientUpdate, FLStrategy, Params
from strategies.tensor_state import TensorState



def scaffold_model_update(x: Arrays, ys: Sequence[Arrays], server_lr: float) -> "OrderedDict[str, np.ndarray]":
    """Alg. 1 line 16: x + eta_g * mean_i (y_i - x) (uniform mean over the clients that reported)."""
    if not ys:
        raise ValueError("scaffold_model_update needs at least one client model")
    ds = [deltas(x, y) for y in ys]
    return apply_update(x, OrderedDict((k, sum(d[k] for d in ds) / len(ds)) for k in x), server_lr)


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


class ScaffoldStrategy(TensorState, FLStrategy):
    TENSOR_STATE = {"c": ("scaffold_c", "scaffold-c-norm")}  # c: float64, zero at start (Alg. 1)
    REPLY_RECORDS = {DELTA_C: "c"}                            # every reply carries delta c_i shaped like c
    c: "OrderedDict[str, np.ndarray]"

    def client_records(self, server_round: int, cid: int) -> dict[str, ArrayRecord | ConfigRecord]:
        return {SERVER_C: params_to_record(self.in_model_dtypes(self.c))}

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        self.init_tensors(params)
        server_lr = self.cfg.section(ScaffoldConfig).server_lr
        new_params = scaffold_model_update(params, [u.params for u in updates], server_lr)
        delta_cs = [record_to_params(u.records[DELTA_C]) for u in updates]
        self.c = scaffold_variate_update(self.c, delta_cs, max(len(self.clients), len(updates)))
        return new_params
