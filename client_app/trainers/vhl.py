"""VHL (Tang et al., ICML 2022; flcore/methods/vhl.py), client side. Per minibatch, one forward of the natural
batch x and a virtual batch x_v together (as the authors' VHL_train_one_epoch concatenates them), then

    L = CE(f(x), y) + alpha CE(f(x_v), y_v) + w_align SupCon([z; sg(z_v)], [y; y_v]) + w_noise SupCon(z_v, y_v)

The virtual set is built on every node from the run seed (:func:`virtual_dataset`, cached per process): an
untrained seeded generator maps per-class Gaussian inputs to the data's input shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from client_app.trainers.base import Trainer
from client_app.training import LossTerm, Step, TrainStats, default_forward, local_train
from flcore.methods.vhl import LATENT_DIM, NOISE_MEAN_STD, NOISE_STD, SEED_OFFSET, VHLConfig


def virtual_dataset(seed: int, input_shape: tuple[int, ...], num_classes: int,
                    per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_v, y_v): ``per_class`` samples of each of ``num_classes`` virtual classes, a pure function of the
    arguments. Class v's latent inputs are N(m_v, NOISE_STD^2 I) with m_v ~ N(0, NOISE_MEAN_STD^2 I); the
    untrained generator is x = tanh(A2 tanh(A1 u)) with A1, A2 seeded Gaussian matrices (variance-preserving
    scales), reshaped to ``input_shape``."""
    if num_classes < 1 or per_class < 1:
        raise ValueError(f"a virtual dataset needs classes and samples, got {num_classes} x {per_class}")
    g = torch.Generator().manual_seed(int(seed) + SEED_OFFSET)
    out_dim = math.prod(input_shape)
    hidden = max(LATENT_DIM, 128)
    means = torch.randn(num_classes, LATENT_DIM, generator=g) * NOISE_MEAN_STD
    a1 = torch.randn(LATENT_DIM, hidden, generator=g) / math.sqrt(LATENT_DIM * NOISE_MEAN_STD ** 2 * 2)
    a2 = torch.randn(hidden, out_dim, generator=g) * (2.0 / math.sqrt(hidden))
    u = means.repeat_interleave(per_class, 0) + NOISE_STD * torch.randn(num_classes * per_class, LATENT_DIM,
                                                                        generator=g)
    x = torch.tanh(torch.tanh(u @ a1) @ a2)
    y = torch.arange(num_classes).repeat_interleave(per_class)
    return x.reshape(-1, *input_shape), y


_cached_virtual = lru_cache(maxsize=4)(virtual_dataset)


def supcon(features: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """Supervised contrastive loss (Khosla et al. 2020, L^sup_out; base temperature = temperature): features are
    L2-normalised; for anchor i, -mean over positives p != i of log( exp(s_ip/tau) / sum_{k != i} exp(s_ik/tau) );
    an anchor without a positive contributes 0; the mean over anchors (the authors' losses.py SupConLoss)."""
    if features.dim() != 2 or labels.shape != (features.shape[0],):
        raise ValueError(f"supcon needs N x d features and N labels, got {tuple(features.shape)}, {tuple(labels.shape)}")
    f = F.normalize(features, dim=1)
    n = f.shape[0]
    logits = f @ f.T / temperature
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    not_self = 1.0 - torch.eye(n, dtype=f.dtype, device=f.device)
    pos = (labels.view(-1, 1) == labels.view(1, -1)).to(f.dtype) * not_self
    log_prob = logits - torch.log((torch.exp(logits) * not_self).sum(1, keepdim=True))
    count = pos.sum(1)
    mean_pos = (pos * log_prob).sum(1) / torch.where(count > 0, count, torch.ones_like(count))
    return -mean_pos.mean()


@dataclass
class VirtualBatches:
    """Draws a virtual batch per step, runs the joint forward and keeps the virtual half for the loss term."""

    x_v: torch.Tensor
    y_v: torch.Tensor
    batch_size: int
    gen: torch.Generator
    logits_v: torch.Tensor | None = None
    z_v: torch.Tensor | None = None
    labels_v: torch.Tensor | None = None

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, self.x_v.shape[0], (self.batch_size,), generator=self.gen)
        xv = self.x_v[idx].to(device=x.device, dtype=x.dtype)
        self.labels_v = self.y_v[idx].to(y.device)
        logits, z = default_forward(model, torch.cat([x, xv]), torch.cat([y, self.labels_v]))
        b = x.shape[0]
        self.logits_v, self.z_v = logits[b:], z[b:]
        return logits[:b], z[:b]


class VHLTerm(LossTerm):
    """alpha CE on the virtual half plus the two SupCon calibration terms."""

    def __init__(self, cfg: VHLConfig, batches: VirtualBatches) -> None:
        self.cfg, self.batches = cfg, batches

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        b, c = self.batches, self.cfg
        assert b.logits_v is not None and b.z_v is not None and b.labels_v is not None
        out = c.alpha * F.cross_entropy(b.logits_v, b.labels_v)
        z, zv = step.features.flatten(1), b.z_v.flatten(1)
        if c.align_weight:
            out = out + c.align_weight * supcon(torch.cat([z, zv.detach()]), torch.cat([step.y, b.labels_v]),
                                                c.temperature)
        if c.noise_weight:
            out = out + c.noise_weight * supcon(zv, b.labels_v, c.temperature)
        return out


def active(c: VHLConfig) -> bool:
    return bool(c.alpha or c.align_weight or c.noise_weight)


class VHLTrainer(Trainer):
    """FedAvg's local SGD on natural plus virtual batches (every weight 0: the base trainer unchanged)."""

    def fit(self) -> TrainStats:
        c = self.cfg.section(VHLConfig)
        if not active(c):
            return super().fit()
        d = self.job.data
        x_v, y_v = _cached_virtual(int(self.cfg.seed), tuple(d.x_train.shape[1:]), d.num_classes, c.per_class)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.job.generator))
        batches = VirtualBatches(x_v.to(d.x_train.device), y_v.to(d.x_train.device), c.batch_size,
                                 torch.Generator().manual_seed(seed))
        return local_train(self.job.model, d.x_train, d.y_train, self.optim_config(),
                           [VHLTerm(c, batches), *self.terms()], generator=self.job.generator,
                           forward=batches.forward)
