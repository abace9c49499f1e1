"""FedDyn (Acar et al., ICLR 2021), client side (paper Alg. 1).

Client k minimises the dynamically regularised objective
    L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + alpha/2 ||theta - theta^{t-1}||^2
starting from the server model theta^{t-1}, then updates its gradient state with the first-order condition
    grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1}).
The state (``feddyn-grad``, zero at first participation) persists in the client's state across rounds.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from client_app.trainers.base import Trainer, TrainJob, trainable_pairs
from client_app.training import LossTerm, Step, TrainStats
from flcore.methods.feddyn import STATE_GRAD, FedDynConfig


def feddyn_regulariser(triples: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], alpha: float) -> torch.Tensor:
    """sum_j [ -<g_j, w_j> + alpha/2 ||w_j - w^{t-1}_j||^2 ] over (w_j, w^{t-1}_j, g_j) (Alg. 1, client
    objective); its gradient is -g + alpha (w - w^{t-1})."""
    return sum(-(g * w).sum() + 0.5 * alpha * (w - w_g).pow(2).sum() for w, w_g, g in triples)


def feddyn_state_update(grad_state: Mapping[str, np.ndarray], local: Mapping[str, np.ndarray],
                        server: Mapping[str, np.ndarray], alpha: float) -> "OrderedDict[str, np.ndarray]":
    """grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1}) (Alg. 1)."""
    return OrderedDict((k, grad_state[k] - alpha * (local[k] - server[k])) for k in grad_state)


class FedDynTerm(LossTerm):
    def __init__(self, global_params: Mapping[str, torch.Tensor], grad_state: Mapping[str, torch.Tensor],
                 alpha: float) -> None:
        self.global_params, self.grad_state, self.alpha = global_params, grad_state, float(alpha)
        self._triples: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def begin(self, model: nn.Module) -> None:
        self._triples = [(p, g, self.grad_state[k].to(p.device, p.dtype))
                         for k, p, g in trainable_pairs(model, self.global_params, "FedDyn")]

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        return feddyn_regulariser(self._triples, self.alpha)


class FedDynTrainer(Trainer):
    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        self.alpha = job.cfg.section(FedDynConfig).alpha
        self.names = [k for k, p in job.model.named_parameters() if p.requires_grad]
        self.grad_state = self._load_state()

    def _load_state(self) -> "OrderedDict[str, np.ndarray]":
        params = dict(self.job.model.named_parameters())
        stored = self.job.state.get_arrays(STATE_GRAD)
        if stored is None:
            return OrderedDict((k, np.zeros(tuple(params[k].shape), np.float32)) for k in self.names)
        for k in self.names:
            if k not in stored or tuple(stored[k].shape) != tuple(params[k].shape):
                raise ValueError(f"client {self.job.cid}: FedDyn state '{STATE_GRAD}' does not fit parameter '{k}'")
        return OrderedDict((k, np.asarray(stored[k])) for k in self.names)

    def terms(self) -> list[LossTerm]:
        grads = {k: torch.from_numpy(np.asarray(v)) for k, v in self.grad_state.items()}
        return [FedDynTerm(self.job.global_params, grads, self.alpha)]

    def fit(self) -> TrainStats:
        stats = super().fit()
        params = dict(self.job.model.named_parameters())
        local = {k: params[k].detach().cpu().numpy() for k in self.names}
        server = {k: torch.as_tensor(self.job.global_params[k]).detach().cpu().numpy() for k in self.names}
        self.grad_state = feddyn_state_update(self.grad_state, local, server, self.alpha)
        self.job.state.put_arrays(STATE_GRAD, self.grad_state)
        return stats
