"""FedProx (Li et al., MLSys 2020), client side: h_k(w) = F_k(w) + mu/2 ||w - w^t||^2 (paper Eq. 2).

The server averages like FedAvg (paper Alg. 2); mu is ``fedprox.mu`` of the run config.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch
from torch import nn

from client_app.trainers.base import Trainer, trainable_pairs
from client_app.training import LossTerm, Step
from flcore.methods.fedprox import FedProxConfig


def proximal_penalty(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], mu: float) -> torch.Tensor:
    """mu/2 * sum_j ||w_j - w^t_j||^2 over (w_j, w^t_j) pairs (FedProx Eq. 2); gradient mu (w - w^t)."""
    total = sum((w - w_g).pow(2).sum() for w, w_g in pairs)
    assert isinstance(total, torch.Tensor), "no (w, w^t) pair"  # one per trainable parameter
    return 0.5 * mu * total


class ProximalTerm(LossTerm):
    """Adds mu/2 ||w - w^t||^2 to every minibatch loss (w^t = the received global model)."""

    def __init__(self, global_params: Mapping[str, torch.Tensor], mu: float) -> None:
        self.global_params, self.mu = global_params, float(mu)

    def begin(self, model: nn.Module) -> None:
        self._pairs = [(p, g) for _, p, g in trainable_pairs(model, self.global_params, "FedProx")]

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        return proximal_penalty(self._pairs, self.mu) if self.mu else None


class FedProxTrainer(Trainer):
    """FedAvg's local SGD plus the proximal term."""

    def terms(self) -> list[LossTerm]:
        return [ProximalTerm(self.job.global_params, self.cfg.section(FedProxConfig).mu)]
