"""FedDyn (Acar et al., ICLR 2021), client side (paper Alg. 1).

Client k minimises the dynamically regularised objective
    L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + alpha/2 ||theta - theta^{t-1}||^2
starting from the server model theta^{t-1}, then updates its gradient state with the first-order condition
    grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1}).
The state (``feddyn-grad``, zero at first participation) persists in the client's state across rounds.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Mapping, Sequence, TypeVar

import numpy as np
import torch

from client_app.trainers.base import Trainer, TrainJob
from client_app.trainers.param_tensors import ParamPenalty, param_tensors, stored_tensors, to_numpy, trainable_copy
from client_app.training import LossTerm, TrainStats
from flcore.methods.feddyn import STATE_GRAD, FedDynConfig

T = TypeVar("T", torch.Tensor, np.ndarray)  # torch tensors in training, numpy arrays in tests


def feddyn_regulariser(triples: Sequence[tuple[torch.Tensor, ...]], alpha: float) -> torch.Tensor:
    """sum_j [ -<g_j, w_j> + alpha/2 ||w_j - w^{t-1}_j||^2 ] over (w_j, w^{t-1}_j, g_j) (Alg. 1, client
    objective); its gradient is -g + alpha (w - w^{t-1})."""
    total = sum(-(g * w).sum() + 0.5 * alpha * (w - w_g).pow(2).sum() for w, w_g, g in triples)
    assert isinstance(total, torch.Tensor), "no (w, w^{t-1}, g) triple"  # one per trainable parameter
    return total


def feddyn_state_update(grad_state: Mapping[str, T], local: Mapping[str, T], server: Mapping[str, T],
                        alpha: float) -> "OrderedDict[str, T]":
    """grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1}) (Alg. 1)."""
    return OrderedDict((k, grad_state[k] - alpha * (local[k] - server[k])) for k in grad_state)


class FedDynTrainer(Trainer):
    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        self.alpha = job.cfg.section(FedDynConfig).alpha
        self.server = param_tensors(job.model, job.global_params, "FedDyn")  # theta^{t-1}
        self.grad_state = stored_tensors(job, STATE_GRAD)

    def terms(self) -> list[LossTerm]:
        return [ParamPenalty(lambda triples: feddyn_regulariser(triples, self.alpha), self.server, self.grad_state)]

    def fit(self) -> TrainStats:
        stats = super().fit()
        self.grad_state = feddyn_state_update(self.grad_state, trainable_copy(self.job.model), self.server, self.alpha)
        self.job.state.put_arrays(STATE_GRAD, to_numpy(self.grad_state))
        return stats
