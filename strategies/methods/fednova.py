"""FedNova (Wang, Liu, Liang, Joshi & Poor, NeurIPS 2020): normalised averaging.

Client k ran tau_k local steps; its cumulative update is Delta_k = w^t - w_k = eta G_k a_k, where a_k weighs
the tau_k stochastic gradients. FedNova removes the objective inconsistency caused by unequal tau_k:
    d_k = Delta_k / ||a_k||_1,   tau_eff = sum_k p_k ||a_k||_1,   w^{t+1} = w^t - tau_eff sum_k p_k d_k,
p_k = n_k / sum_{j in S} n_j (paper Eq. 6-7, FedNova's default tau_eff). ||a_k||_1:
    plain SGD:                    tau_k
    heavy-ball momentum rho:      [tau_k - rho (1 - rho^tau_k) / (1 - rho)] / (1 - rho)   (paper Sec. 5)
(PyTorch momentum v <- rho v + g, w <- w - eta v: gradient j of tau contributes (1 - rho^{tau-j})/(1 - rho).)
Weight decay is treated as part of the gradient (not normalised separately). Equal tau_k gives FedAvg.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from flcore.named_arrays import Arrays
from flcore.config import RunConfig
from strategies.aggregation import a_norm, average_non_float, deltas, is_float
from strategies.base import ClientUpdate, FLStrategy
from strategies.update_checks import metric_problem, reject_updates



def fednova_aggregate(w: Arrays, client_params: Sequence[Arrays], weights: Sequence[float],
                      norms: Sequence[float]) -> tuple["OrderedDict[str, np.ndarray]", float]:
    """w^t + tau_eff sum_k p_k (w_k - w^t)/||a_k||_1 on the floating-point tensors; returns (float64, tau_eff)."""
    p = np.asarray(weights, np.float64)
    a = np.asarray(norms, np.float64)
    if len(client_params) == 0 or p.shape != a.shape or p.shape[0] != len(client_params):
        raise ValueError("fednova_aggregate needs one weight and one ||a||_1 per client model")
    if np.any(p < 0) or p.sum() <= 0 or np.any(a <= 0):
        raise ValueError(f"weights must be >= 0 (not all 0) and ||a||_1 > 0, got {p.tolist()}, {a.tolist()}")
    p = p / p.sum()
    tau_eff = float(np.dot(p, a))
    keys = [k for k, v in w.items() if is_float(v)]
    out = OrderedDict()
    step = OrderedDict((k, np.zeros(np.shape(w[k]), np.float64)) for k in keys)
    for pk, ak, params in zip(p, a, client_params):
        d = deltas(w, params)
        for k in keys:
            step[k] += (pk / ak) * d[k]
    for k in keys:
        out[k] = np.asarray(w[k], np.float64) + tau_eff * step[k]
    return out, tau_eff


class FedNovaStrategy(FLStrategy):
    """Uses each client's reported ``local-steps`` and the run's local ``momentum``."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self._last: dict[str, float] = {}

    def collect_updates(self, server_round, replies, reference, phase: str = "train"):
        updates, rejected = super().collect_updates(server_round, replies, reference, phase)
        return reject_updates(server_round, updates, rejected,
                              lambda u: metric_problem(u.metrics, "local-steps", 0, strictly_greater=True), phase)

    def aggregate(self, server_round: int, params, updates: list[ClientUpdate]):
        weights = [float(u.num_examples) for u in updates]
        norms = [a_norm(int(u.metrics["local-steps"]), self.cfg.momentum) for u in updates]
        new, tau_eff = fednova_aggregate(params, [u.params for u in updates], weights, norms)
        others = [k for k in params if k not in new]
        ints = average_non_float([u.params for u in updates], weights, others)
        self._last = {"fednova-tau-eff": tau_eff}
        return OrderedDict((k, new[k].astype(params[k].dtype) if k in new else ints[k]) for k in params)

    def round_metrics(self) -> dict[str, Any]:
        return dict(self._last)
