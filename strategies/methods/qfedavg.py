"""q-FedAvg (Li, Sanjabi, Beirami & Smith, "Fair Resource Allocation in FL", ICLR 2020, Alg. 2).

For each client k in S_t, with F_k = F_k(w^t) the loss of the *received* global model on k's data and
L = 1/lr (the Lipschitz estimate of the paper's code):
    Delta w_k = L (w^t - w_k),   Delta_k = F_k^q Delta w_k,
    h_k = q F_k^{q-1} ||Delta w_k||^2 + L F_k^q,
    w^{t+1} = w^t - sum_k Delta_k / sum_k h_k.
q = 0 gives the uniform average of the client models; larger q tilts the update towards clients with high
loss (fairness). Like the paper's code, F_k gets +1e-10 so F_k^{q-1} stays finite.

F_k is the global model's loss on the client's *training* data, measured before local training (the
paper's definition), reported by the q-FedAvg trainer (client_app/trainers/qfedavg.py) as
``global-model-train-loss``. A reply without a finite one is rejected with that reason; the local test
split (``global-model-local-loss``) is evaluation data and is never used here, and ``train_loss`` is
measured during local training, not at w^t.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from flcore.named_arrays import Arrays
from flcore.config import RunConfig
from flcore.methods.qfedavg import LOSS_KEY, QFedAvgConfig
from strategies.aggregation import average_non_float, deltas, is_float
from strategies.base import ClientUpdate, FLStrategy
from strategies.update_checks import metric_problem, reject_updates

EPS = 1e-10


def qfedavg_aggregate(w: Arrays, client_params: Sequence[Arrays], losses: Sequence[float], q: float,
                      lipschitz: float) -> tuple["OrderedDict[str, np.ndarray]", float]:
    """The q-FedAvg server step on the floating-point tensors (Alg. 2); returns (w^{t+1} float64, sum h_k)."""
    if not client_params or len(client_params) != len(losses):
        raise ValueError("qfedavg_aggregate needs one loss per client model and at least one model")
    keys = [k for k, v in w.items() if is_float(v)]
    num = OrderedDict((k, np.zeros(np.shape(w[k]), np.float64)) for k in keys)
    h_sum = 0.0
    for params, loss in zip(client_params, losses):
        f = float(loss) + EPS
        d = deltas(w, params)  # w_k - w^t
        dw = {k: -lipschitz * d[k] for k in keys}  # L (w^t - w_k)
        sq = sum(float(np.sum(dw[k] ** 2)) for k in keys)
        fq = f ** q
        h_sum += (q * f ** (q - 1) * sq if q != 0 else 0.0) + lipschitz * fq
        for k in keys:
            num[k] += fq * dw[k]
    new = OrderedDict((k, np.asarray(w[k], np.float64) - num[k] / h_sum) for k in keys)
    return new, h_sum


class QFedAvgStrategy(FLStrategy):
    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.q = cfg.section(QFedAvgConfig).q
        self._last: dict[str, float] = {}

    def collect_updates(self, server_round, replies, reference, phase: str = "train"):
        updates, rejected = super().collect_updates(server_round, replies, reference, phase)
        return reject_updates(server_round, updates, rejected,
                              lambda u: metric_problem(u.metrics, LOSS_KEY), phase)

    def aggregate(self, server_round: int, params, updates: list[ClientUpdate]):
        losses = [float(u.metrics[LOSS_KEY]) for u in updates]
        new, h_sum = qfedavg_aggregate(params, [u.params for u in updates], losses, self.q, 1.0 / self.cfg.lr)
        others = [k for k in params if k not in new]
        ints = average_non_float([u.params for u in updates], [1.0] * len(updates), others)
        self._last = {"qfedavg-h-sum": h_sum}
        return OrderedDict((k, new[k].astype(params[k].dtype) if k in new else ints[k]) for k in params)

    def round_metrics(self) -> dict[str, Any]:
        return dict(self._last)
