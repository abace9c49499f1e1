"""FedDyn (Acar et al., ICLR 2021), server side (paper Alg. 1):

    h^t     = h^{t-1} - alpha (1/m) sum_{k in P_t} (theta_k^t - theta^{t-1})
    theta^t = (1/|P_t|) sum_{k in P_t} theta_k^t - (1/alpha) h^t
with m the number of registered clients. h is checkpointed. theta^t is both the model sent to clients and
the model evaluated as G-FL (the paper's "server model").
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import numpy as np

from flcore.named_arrays import Arrays
from flcore.methods.feddyn import FedDynConfig
from strategies.aggregation import deltas
from strategies.base import ClientUpdate, FLStrategy, Params
from strategies.tensor_state import TensorState, with_non_float



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


class FedDynStrategy(TensorState, FLStrategy):
    TENSOR_STATE = {"h": ("feddyn_h", "feddyn-h-norm")}  # h: float64, zero at start (Alg. 1)
    h: "OrderedDict[str, np.ndarray]"

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        self.init_tensors(params)
        theta, self.h = feddyn_server_update(params, [u.params for u in updates], self.h,
                                             self.cfg.section(FedDynConfig).alpha, max(len(self.clients), len(updates)))
        return with_non_float(params, theta, [u.params for u in updates], [1.0] * len(updates))
