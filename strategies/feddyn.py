"""FedDyn (Acar et al., ICLR 2021), server side (paper Alg. 1):

    h^t     = h^{t-1} - alpha (1/m) sum_{k in P_t} (theta_k^t - theta^{t-1})
    theta^t = (1/|P_t|) sum_{k in P_t} theta_k^t - (1/alpha) h^t
with m the number of registered clients. h is checkpointed. theta^t is both the model sent to clients and
the model evaluated as G-FL (the paper's "server model").
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np

from flcore.config import RunConfig
from flcore.methods.feddyn import FedDynConfig
from strategies.aggregation import deltas
from strategies.base import ClientUpdate, FLStrategy
from strategies.update_checks import average_non_float, is_float

Arrays = Mapping[str, np.ndarray]


def feddyn_server_update(theta: Arrays, locals_: Sequence[Arrays], h: Arrays, alpha: float,
                         num_clients: int) -> tuple["OrderedDict[str, np.ndarray]", "OrderedDict[str, np.ndarray]"]:
    """One FedDyn server step on the floating-point tensors: returns (theta^t, h^t) in float64."""
    if not locals_:
        raise ValueError("feddyn_server_update needs at least one client model")
    if num_clients < len(locals_) or num_clients <= 0:
        raise ValueError(f"num_clients (m={num_clients}) must be >= the number of reports ({len(locals_)})")
    ds = [deltas(theta, p) for p in locals_]
    new_h, new_theta = OrderedDict(), OrderedDict()
    for k in h:
        new_h[k] = np.asarray(h[k], np.float64) - alpha * sum(d[k] for d in ds) / num_clients
        mean_local = sum(np.asarray(p[k], np.float64) for p in locals_) / len(locals_)
        new_theta[k] = mean_local - new_h[k] / alpha
    return new_theta, new_h


class FedDynStrategy(FLStrategy):
    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.alpha = cfg.section(FedDynConfig).alpha
        self.h: "OrderedDict[str, np.ndarray]" = OrderedDict()

    def aggregate(self, server_round: int, params, updates: list[ClientUpdate]):
        if not self.h:
            self.h = OrderedDict((k, np.zeros(np.shape(v), np.float64)) for k, v in params.items() if is_float(v))
        theta, self.h = feddyn_server_update(params, [u.params for u in updates], self.h, self.alpha,
                                             max(len(self.clients), len(updates)))
        others = [k for k in params if k not in theta]
        ints = average_non_float([u.params for u in updates], [1.0] * len(updates), others)
        return OrderedDict((k, theta[k].astype(params[k].dtype) if k in theta else ints[k]) for k in params)

    def round_metrics(self) -> dict[str, Any]:
        return {"feddyn-h-norm": math.sqrt(sum(float(np.sum(v ** 2)) for v in self.h.values()))}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["feddyn_h"] = {k: v.copy() for k, v in self.h.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.h = OrderedDict((k, np.asarray(v, np.float64)) for k, v in state["feddyn_h"].items())
