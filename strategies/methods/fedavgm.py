"""FedAvgM (Hsu, Qi and Brown, arXiv 1909.06335, 2019), server side: heavy-ball momentum on FedAvg's update.

    a_t     = sum_k (n_k / n) w_k^{t+1}                 FedAvg's model (the base strategy's aggregate, as is)
    Delta_t = w_t - a_t                                 the pseudo-gradient
    v_t     = beta v_{t-1} + Delta_t,   v_0 = 0         the momentum buffer (float64, checkpointed)
    w_{t+1} = w_t - eta_s v_t

The last line is computed as its algebraic equal a_t + ((1 - eta_s) Delta_t - eta_s beta v_{t-1}), so that
beta = 0, eta_s = 1 returns FedAvg's a_t bit for bit (w_t - (w_t - a_t) rounds away from a_t in floating point).
The update is Flower's (flwr serverapp/strategy/fedavgm.py, FedAvgM.aggregate_train: heavy ball, "no nesterov")
except that Flower steps in the model's float32 and we in float64. Integer buffers (BatchNorm's counter) take
FedAvg's mean: no momentum rule covers them.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, ClassVar

import numpy as np

from flcore.named_arrays import Arrays
from flcore.config import RunConfig
from flcore.methods.fedavgm import FedAvgMConfig
from strategies.base import ClientUpdate, FLStrategy, Params
from strategies.tensor_state import TensorState



def fedavgm_step(w: Arrays, mean: Arrays, v: Arrays, beta: float, server_lr: float
                 ) -> tuple[OrderedDict[str, np.ndarray], OrderedDict[str, np.ndarray]]:
    """One server step over the tensors of ``v``: returns (w_{t+1}, v_t) in float64, from w_t, FedAvg's mean a_t
    and v_{t-1} (module docstring)."""
    new_w: OrderedDict[str, np.ndarray] = OrderedDict()
    new_v: OrderedDict[str, np.ndarray] = OrderedDict()
    for k, v_prev in v.items():
        a = np.asarray(mean[k], np.float64)
        delta = np.asarray(w[k], np.float64) - a
        new_v[k] = beta * v_prev + delta
        new_w[k] = a + ((1.0 - server_lr) * delta - server_lr * beta * v_prev)
    return new_w, new_v


class FedAvgMStrategy(TensorState, FLStrategy):
    """FedAvg with server momentum; logs ||v_t|| (fedavgm-momentum-norm) and ||Delta_t|| (FedAvg's own step)."""

    # v: float64, zero at start, checkpointed under "fedavgm_momentum", its norm logged every round
    TENSOR_STATE: ClassVar[dict[str, tuple[str, str]]] = {"momentum": ("fedavgm_momentum", "fedavgm-momentum-norm")}
    momentum: OrderedDict[str, np.ndarray]

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.mcfg = cfg.section(FedAvgMConfig)
        self._delta_norm = 0.0

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        mean = super().aggregate(server_round, params, updates)  # FedAvg's model, integer buffers included
        self.init_tensors(params)
        new, self.momentum = fedavgm_step(params, mean, self.momentum, self.mcfg.server_momentum,
                                          self.mcfg.server_lr)
        self._delta_norm = math.sqrt(sum(float(np.sum((np.asarray(params[k], np.float64)
                                                       - np.asarray(mean[k], np.float64)) ** 2))
                                         for k in new))
        return OrderedDict((k, new[k].astype(mean[k].dtype) if k in new else mean[k]) for k in mean)

    def round_metrics(self) -> dict[str, Any]:
        return {**super().round_metrics(), "fedavgm-pseudo-gradient-norm": self._delta_norm}
