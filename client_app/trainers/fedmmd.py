"""FedMMD (Yao et al., VCIP 2018; flcore/methods/fedmmd.py), client side: FedAvg's local SGD plus
lambda * max(floor, MMD^2) between the local stream and the frozen global stream on each minibatch:

    K(a, b) = sum_s exp(-||a - b||^2 / (2 s))                       (the authors' losses.py, 19 widths s)
    MMD^2(P, Q) = max(0, mean K(P, P) + mean K(Q, Q) - 2 mean K(P, Q))   (biased V-statistic, clipped)

P = the local model's logits (or z) of the batch, Q = the received global model's, detached.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from client_app.trainers.base import Trainer, frozen_copy
from client_app.training import LossTerm, Step, forward_features
from flcore.methods.fedmmd import CODE_WIDTHS, FedMMDConfig


def gaussian_kernel_sum(a: torch.Tensor, b: torch.Tensor, widths: Sequence[float]) -> torch.Tensor:
    """K[i, j] = sum_s exp(-||a_i - b_j||^2 / (2 s)) (N_a x N_b)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"MMD needs two N x d batches of one width, got {tuple(a.shape)} and {tuple(b.shape)}")
    d2 = (a.unsqueeze(1) - b.unsqueeze(0)).pow(2).sum(-1)
    scales = torch.as_tensor([1.0 / (2.0 * s) for s in widths], dtype=a.dtype, device=a.device)
    return torch.exp(-scales.view(-1, 1, 1) * d2.unsqueeze(0)).sum(0)


def mmd2(p: torch.Tensor, q: torch.Tensor, widths: Sequence[float] = CODE_WIDTHS) -> torch.Tensor:
    """The biased MMD^2 estimate of samples p and q under the kernel sum, clipped at 0."""
    cost = (gaussian_kernel_sum(p, p, widths).mean() + gaussian_kernel_sum(q, q, widths).mean()
            - 2.0 * gaussian_kernel_sum(p, q, widths).mean())
    return torch.clamp(cost, min=0.0)


def fedmmd_penalty(local: torch.Tensor, global_: torch.Tensor, weight: float, floor: float,
                   widths: Sequence[float] = CODE_WIDTHS) -> torch.Tensor:
    """weight * max(floor, MMD^2(local, global_)) with the global stream detached."""
    return weight * torch.clamp(mmd2(local, global_.detach(), widths), min=floor)


class MMDTerm(LossTerm):
    """The two-stream constraint: the global model is frozen at ``begin`` (the received weights)."""

    def __init__(self, weight: float, layer: str, floor: float) -> None:
        self.weight, self.layer, self.floor = float(weight), layer, float(floor)
        self.global_model: nn.Module | None = None

    def begin(self, model: nn.Module) -> None:
        self.global_model = frozen_copy(model) if self.weight else None

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        if not self.weight:
            return None
        assert self.global_model is not None
        with torch.no_grad():
            g_logits, g_z = forward_features(self.global_model, step.x)
        local, other = (step.logits, g_logits) if self.layer == "logits" else (step.features, g_z)
        return fedmmd_penalty(local.flatten(1), other.flatten(1), self.weight, self.floor)


class FedMMDTrainer(Trainer):
    def terms(self) -> list[LossTerm]:
        c = self.cfg.section(FedMMDConfig)
        return [MMDTerm(c.weight, c.layer, c.floor)]
