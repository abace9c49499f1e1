"""FedCM (Xu et al. 2021; flcore/methods/fedcm.py), client side: FedAvg's local SGD with every gradient
replaced by v = alpha g + (1 - alpha) Delta_t before the optimizer step (paper Alg. 1), Delta_t the server's
global momentum (record ``fedcm-delta``). The client keeps no state; its reply is FedAvg's."""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from client_app.trainers.base import Trainer
from client_app.trainers.param_tensors import received_tensors
from client_app.training import LossTerm
from flcore.methods.fedcm import DELTA, FedCMConfig


def client_momentum(grad: torch.Tensor, delta: torch.Tensor, alpha: float) -> torch.Tensor:
    """v = alpha g + (1 - alpha) Delta (FedCM Alg. 1), in place on ``grad``."""
    return grad.mul_(alpha).add_(delta, alpha=1.0 - alpha)


class ClientMomentumTerm(LossTerm):
    """g <- alpha g + (1 - alpha) Delta_t after every backward pass, for the parameters that got a gradient."""

    def __init__(self, delta: Mapping[str, torch.Tensor], alpha: float) -> None:
        self.delta, self.alpha = delta, float(alpha)
        self._pairs: list[tuple[nn.Parameter, torch.Tensor]] = []

    def begin(self, model: nn.Module) -> None:
        params = dict(model.named_parameters())
        self._pairs = [(params[k], v) for k, v in self.delta.items()]

    def on_gradients(self, model: nn.Module) -> None:
        for p, d in self._pairs:
            if p.grad is not None:
                client_momentum(p.grad, d, self.alpha)


class FedCMTrainer(Trainer):
    def terms(self) -> list[LossTerm]:
        alpha = self.cfg.section(FedCMConfig).alpha
        if alpha == 1.0:
            return []          # v = g: FedAvg's step exactly
        return [ClientMomentumTerm(received_tensors(self.job, DELTA, "FedCM's global momentum Delta_t"), alpha)]
