"""FedCM (Xu et al. 2021; flcore/methods/fedcm.py), server side (paper Alg. 1):

    x_{t+1}     = x_t + eta_g sum_i p_i (y_i - x_t)                 (eta_g = 1: FedAvg's weighted mean)
    Delta_{t+1} = sum_i p_i (x_t - y_i) / (eta_l S(K_i, beta))      (S(K, 0) = K: the paper's eta_l K)
p_i = n_i / sum n over the round's updates, K_i the client's reported ``local-steps``. Delta (float64, zero at
the start, checkpointed, its norm logged as ``fedcm-delta-norm``) goes to every sampled client as record
``fedcm-delta``. A client that took no local step carries no gradient information and is left out of Delta.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord

from flcore.named_arrays import Arrays
from flcore.methods.fedcm import DELTA, FedCMConfig
from flcore.records import params_to_record
from strategies.aggregation import a_norm, apply_update, deltas, is_float, weighted_average
from strategies.base import ClientUpdate, FLStrategy, Params
from strategies.tensor_state import TensorState
from strategies.update_checks import metric_problem, reject_updates



def global_momentum(x: Arrays, ys: Sequence[Arrays], weights: Sequence[float], steps: Sequence[float],
                    lr: float) -> "OrderedDict[str, np.ndarray]":
    """Delta = sum_i p_i (x - y_i) / (lr * steps_i) over the floating-point tensors (float64), p_i = w_i / sum w;
    ``steps_i`` is K_i (or S(K_i, beta) under momentum), each > 0."""
    w, s = np.asarray(weights, np.float64), np.asarray(steps, np.float64)
    if len(ys) == 0 or w.shape != (len(ys),) or s.shape != (len(ys),):
        raise ValueError("global_momentum needs one weight and one step count per client model")
    if np.any(w < 0) or w.sum() <= 0 or np.any(s <= 0) or lr <= 0:
        raise ValueError(f"weights must be >= 0 (not all 0), steps and lr > 0; got {w.tolist()}, {s.tolist()}, {lr}")
    p = w / w.sum()
    out = OrderedDict((k, np.zeros(np.shape(v), np.float64)) for k, v in x.items() if is_float(v))
    for pi, si, y in zip(p, s, ys):
        d = deltas(x, y)
        for k in out:
            out[k] -= (pi / (lr * si)) * d[k]
    return out


class FedCMStrategy(TensorState, FLStrategy):
    TENSOR_STATE = {"delta": ("fedcm_delta", "fedcm-delta-norm")}   # Delta_0 = 0 (Alg. 1)
    delta: "OrderedDict[str, np.ndarray]"

    def client_records(self, server_round: int, cid: int) -> dict[str, ArrayRecord | ConfigRecord]:
        return {DELTA: params_to_record(self.in_model_dtypes(self.delta))}

    def collect_updates(self, server_round, replies, reference, phase: str = "train"):
        updates, rejected = super().collect_updates(server_round, replies, reference, phase)
        return reject_updates(server_round, updates, rejected,
                              lambda u: metric_problem(u.metrics, "local-steps", 0), phase)

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        self.init_tensors(params)
        c = self.cfg.section(FedCMConfig)
        weights = [float(u.num_examples) for u in updates]
        mean = weighted_average([u.params for u in updates], weights)
        new = mean if c.server_lr == 1.0 else apply_update(params, deltas(params, mean), c.server_lr)
        moved = [(u, w) for u, w in zip(updates, weights) if int(u.metrics["local-steps"]) > 0]
        if moved:
            self.delta = global_momentum(params, [u.params for u, _ in moved], [w for _, w in moved],
                                         [a_norm(int(u.metrics["local-steps"]), self.cfg.momentum) for u, _ in moved],
                                         self.cfg.lr)
        return new
