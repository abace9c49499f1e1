"""Local Mixup (Zhang et al., ICLR 2018; flcore/methods/mixup.py), client side: FedAvg's local SGD on mixed
minibatches. Per minibatch (the authors' code, facebookresearch/mixup-cifar10 train.py: mixup_data,
mixup_criterion):

    lam ~ Beta(alpha, alpha), pi = randperm(B)
    x~ = lam x + (1 - lam) x[pi],   L = lam CE(f(x~), y) + (1 - lam) CE(f(x~), y[pi])

The draws come from a generator seeded once per local training from the job's generator (reproducible per
(seed, round, client)); alpha = 0 makes no draw and trains on the plain batch (FedAvg).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from client_app.trainers.base import Trainer
from client_app.training import TrainStats, default_forward, local_train
from flcore.methods.mixup import MixupConfig


def mix_inputs(x: torch.Tensor, lam: float, perm: torch.Tensor) -> torch.Tensor:
    """x~ = lam x + (1 - lam) x[perm] (Zhang et al. Eq. 1)."""
    if perm.shape != (x.shape[0],):
        raise ValueError(f"mixup permutation has shape {tuple(perm.shape)}, expected ({x.shape[0]},)")
    return lam * x + (1.0 - lam) * x[perm]


def mixup_loss(logits: torch.Tensor, y: torch.Tensor, y_partner: torch.Tensor, lam: float) -> torch.Tensor:
    """lam CE(logits, y) + (1 - lam) CE(logits, y_partner): the cross-entropy against the mixed one-hot target
    lam e_y + (1 - lam) e_y' (CE is linear in the target)."""
    return lam * F.cross_entropy(logits, y) + (1.0 - lam) * F.cross_entropy(logits, y_partner)


@dataclass
class MixupSampler:
    """Draws (lam, pi) per minibatch and remembers the last draw for the criterion."""

    alpha: float
    rng: np.random.Generator
    gen: torch.Generator
    lam: float = 1.0
    partner: torch.Tensor | None = None
    lams: list[float] = field(default_factory=list)

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.lam = float(self.rng.beta(self.alpha, self.alpha))
        perm = torch.randperm(x.shape[0], generator=self.gen).to(x.device)
        self.partner = y[perm]
        self.lams.append(self.lam)
        return default_forward(model, mix_inputs(x, self.lam, perm), y)

    def criterion(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert self.partner is not None, "mixup criterion called before its forward"
        return mixup_loss(logits, y, self.partner, self.lam)


def sampler_for(alpha: float, generator: torch.Generator) -> MixupSampler:
    """A sampler seeded from one draw of the job's generator (so a client's mixes are reproducible)."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    return MixupSampler(alpha, np.random.default_rng(seed), torch.Generator().manual_seed(seed))


class MixupTrainer(Trainer):
    """FedAvg's local SGD on mixed minibatches (alpha = 0: the base trainer's loop unchanged)."""

    def fit(self) -> TrainStats:
        alpha = self.cfg.section(MixupConfig).alpha
        if alpha == 0.0:
            return super().fit()
        d = self.job.data
        s = sampler_for(alpha, self.job.generator)
        return local_train(self.job.model, d.x_train, d.y_train, self.optim_config(), self.terms(),
                           generator=self.job.generator, forward=s.forward, criterion=s.criterion)
