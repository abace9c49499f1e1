"""FedOpt: FedAdam and FedYogi (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Alg. 2).

The averaged client update is a pseudo-gradient for a server-side adaptive optimizer:
    Delta_t = sum_k p_k (x_k - x_t)                         (p_k = n_k / sum n, as Flower's FedAdam/FedYogi)
    m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2                            (Adam)
    v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2)        (Yogi)
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)
with m_0 = 0 and v_0 = tau^2 (the paper's v_{-1} >= tau^2) and no bias correction, as in the paper.
``fedopt-bias-correction = true`` applies Adam's bias correction (m_t/(1 - beta1^t), v_t/(1 - beta2^t)), the
variant Flower's FedAdam uses. (m, v, t) are checkpointed.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from flcore.named_arrays import Arrays
from flcore.config import RunConfig
from flcore.methods.fedopt import FedOptConfig
from strategies.aggregation import average_non_float, deltas, is_float
from strategies.base import ClientUpdate, FLStrategy



def second_moment(v: np.ndarray, delta: np.ndarray, beta2: float, rule: str) -> np.ndarray:
    """Adam: beta2 v + (1-beta2) d^2;  Yogi: v - (1-beta2) d^2 sign(v - d^2)  (Reddi et al. Alg. 2)."""
    d2 = delta * delta
    if rule == "adam":
        return beta2 * v + (1 - beta2) * d2
    if rule == "yogi":
        return v - (1 - beta2) * d2 * np.sign(v - d2)
    raise ValueError(f"unknown FedOpt rule '{rule}' (adam or yogi)")


def fedopt_step(x: Arrays, delta: Arrays, m: Arrays, v: Arrays, t: int, cfg: FedOptConfig,
                rule: str) -> tuple["OrderedDict[str, np.ndarray]", "OrderedDict[str, np.ndarray]",
                                    "OrderedDict[str, np.ndarray]"]:
    """One server step (round t >= 1) on float64 arrays: returns (x_{t+1}, m_t, v_t)."""
    new_x, new_m, new_v = OrderedDict(), OrderedDict(), OrderedDict()
    for k in delta:
        new_m[k] = cfg.beta1 * m[k] + (1 - cfg.beta1) * delta[k]
        new_v[k] = second_moment(v[k], delta[k], cfg.beta2, rule)
        m_hat, v_hat = new_m[k], new_v[k]
        if cfg.bias_correction:
            m_hat = m_hat / (1 - cfg.beta1 ** t)
            v_hat = v_hat / (1 - cfg.beta2 ** t)
        new_x[k] = np.asarray(x[k], np.float64) + cfg.eta * m_hat / (np.sqrt(np.maximum(v_hat, 0)) + cfg.tau)
    return new_x, new_m, new_v


def pseudo_gradient(x: Arrays, client_params: Sequence[Arrays], weights: Sequence[float],
                    keys: Sequence[str]) -> "OrderedDict[str, np.ndarray]":
    """Delta_t = sum_k p_k (x_k - x_t), p_k = w_k / sum w (float64)."""
    w = np.asarray(weights, np.float64)
    w = w / w.sum()
    out = OrderedDict((k, np.zeros(np.shape(x[k]), np.float64)) for k in keys)
    for wk, params in zip(w, client_params):
        d = deltas(x, params)
        for k in keys:
            out[k] += wk * d[k]
    return out


class FedOptStrategy(FLStrategy):
    rule = "adam"

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.ocfg = cfg.section(FedOptConfig)
        self.m: "OrderedDict[str, np.ndarray]" = OrderedDict()
        self.v: "OrderedDict[str, np.ndarray]" = OrderedDict()
        self.t = 0
        self._update_norm = 0.0

    def aggregate(self, server_round: int, params, updates: list[ClientUpdate]):
        keys = [k for k, v in params.items() if is_float(v)]
        if not self.m:
            self.m = OrderedDict((k, np.zeros(np.shape(params[k]), np.float64)) for k in keys)
            self.v = OrderedDict((k, np.full(np.shape(params[k]), self.ocfg.tau ** 2)) for k in keys)
        weights = [float(u.num_examples) for u in updates]
        delta = pseudo_gradient(params, [u.params for u in updates], weights, keys)
        self.t += 1
        new, self.m, self.v = fedopt_step(params, delta, self.m, self.v, self.t, self.ocfg, self.rule)
        self._update_norm = math.sqrt(sum(float(np.sum((new[k] - params[k]) ** 2)) for k in keys))
        others = [k for k in params if k not in new]
        ints = average_non_float([u.params for u in updates], weights, others)
        return OrderedDict((k, new[k].astype(params[k].dtype) if k in new else ints[k]) for k in params)

    def round_metrics(self) -> dict[str, Any]:
        return {f"fed{self.rule}-update-norm": self._update_norm}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["fedopt"] = {"t": self.t, "m": {k: v.copy() for k, v in self.m.items()},
                           "v": {k: v.copy() for k, v in self.v.items()}}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        opt = state["fedopt"]
        self.t = int(opt["t"])
        self.m = OrderedDict((k, np.asarray(v, np.float64)) for k, v in opt["m"].items())
        self.v = OrderedDict((k, np.asarray(v, np.float64)) for k, v in opt["v"].items())


class FedAdamStrategy(FedOptStrategy):
    """FedAdam: Adam's second moment."""

    rule = "adam"


class FedYogiStrategy(FedOptStrategy):
    """FedYogi: Yogi's additive, sign-controlled second moment."""

    rule = "yogi"
