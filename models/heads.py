"""Classifier heads: a trainable linear layer, or the fixed simplex-ETF classifier.

Fixed ETF (neural-collapse FL, seed 004, Sec. 3): W* = sqrt(C/(C-1)) * P (I_C - 1/C 11^T), with
P in R^{d x C}, P^T P = I (QR of a seeded Gaussian matrix). Columns have norm 1 and pairwise cosine
-1/(C-1). Scaled by beta (``etf-scale``). It is a *buffer*, never a parameter: no optimiser can move it,
and since every client builds it from the same seed, averaging leaves it unchanged.

Fixed orthogonal classifier on the unit hypersphere (SphereFed; the FedRANE authors' code): W (d x C) with
orthonormal columns, features L2-normalised before it (:func:`make_hyperspherical`), also a buffer.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from models.base import FLModel


def simplex_etf(feature_dim: int, num_classes: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    """The d x C simplex equiangular tight frame (pure function, seed 004 Eq. 3), columns of norm ``scale``."""
    if num_classes < 2:
        raise ValueError(f"a simplex ETF needs at least 2 classes, got {num_classes}")
    if feature_dim < num_classes:
        raise ValueError(
            f"a simplex ETF for {num_classes} classes needs feature_dim >= {num_classes}, got {feature_dim}")
    gen = torch.Generator().manual_seed(int(seed))
    gauss = torch.randn(feature_dim, num_classes, generator=gen, dtype=torch.float64)
    p, _ = torch.linalg.qr(gauss)  # d x C with orthonormal columns
    centre = torch.eye(num_classes, dtype=torch.float64) - 1.0 / num_classes
    w = math.sqrt(num_classes / (num_classes - 1)) * p @ centre
    return (scale * w).float()


class LinearHead(nn.Linear):
    pass


class ETFHead(nn.Module):
    """logits = h W* with W* a frozen buffer (d x C)."""

    weight: torch.Tensor  # the buffer

    def __init__(self, feature_dim: int, num_classes: int, seed: int, scale: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("weight", simplex_etf(feature_dim, num_classes, seed, scale))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight


# ---------------------------------------------------------------------------------------- hyperspherical
def random_orthogonal(feature_dim: int, num_classes: int, seed: int) -> torch.Tensor:
    """A d x C matrix with orthonormal columns (W^T W = I_C), from the QR of a seeded d x d Gaussian matrix.

    SphereFed (Dong et al., ECCV 2022, abstract: "a fixed classifier whose weights span the unit hypersphere",
    shared by all clients) and the FedRANE authors' code (serverFedRANE.py, ``FedRANE.__init__``: QR of a
    d x d Gaussian, its first C rows as the classifier, no bias) both fix such a classifier. Every client
    builds the same one from the run seed, so it never travels as a trained value and averaging leaves it as is.
    """
    if num_classes < 1 or feature_dim < num_classes:
        raise ValueError(f"an orthogonal classifier for {num_classes} classes needs feature_dim >= {num_classes} "
                         f"(orthonormal columns), got feature_dim {feature_dim}")
    gen = torch.Generator().manual_seed(int(seed))
    q, _ = torch.linalg.qr(torch.randn(feature_dim, feature_dim, generator=gen, dtype=torch.float64))
    return q[:, :num_classes].contiguous().float()


class UnitNorm(nn.Module):
    """Rows scaled to unit L2 norm (features on the unit hypersphere); a zero row stays zero."""

    def __init__(self, eps: float = 1e-12) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h / h.norm(dim=-1, keepdim=True).clamp_min(self.eps)


class OrthogonalHead(nn.Module):
    """logits = scale * h W with W (d x C, orthonormal columns) a buffer: no optimiser can move it.

    SphereFed's calibration replaces ``weight`` by its closed-form least-squares classifier after training
    (strategies/methods/spherefed.py); the buffer travels with the model like any other state entry.
    """

    weight: torch.Tensor  # the buffer

    def __init__(self, feature_dim: int, num_classes: int, seed: int, scale: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("weight", random_orthogonal(feature_dim, num_classes, seed))
        self.scale = float(scale)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = h @ self.weight
        return logits if self.scale == 1.0 else self.scale * logits


def make_hyperspherical(model: FLModel, seed: int, scale: float = 1.0) -> None:
    """Model hook helper: features L2-normalised (``model.backbone`` followed by :class:`UnitNorm`) and the
    head replaced by the fixed :class:`OrthogonalHead` (``model`` is a models.base.FLModel)."""
    model.backbone = nn.Sequential(model.backbone, UnitNorm())
    model.head = OrthogonalHead(int(model.feature_dim), int(model.num_classes), seed, scale)


def add_sphere_head(model: FLModel, cfg: Any) -> None:
    """SphereFed's model hook (flcore/methods/spherefed.py): unit-norm features, fixed orthogonal classifier
    scaled by ``spherefed.scale``. The method fixes its own classifier, so a run config asking for another head
    (``head = 'etf'``) is refused rather than silently replaced."""
    from flcore.methods.spherefed import SphereFedConfig

    if cfg.head != "linear":
        raise ValueError(f"method '{cfg.method}' fixes its own orthogonal classifier; run-config key 'head' must "
                         f"be 'linear' (the default), got '{cfg.head}'")
    make_hyperspherical(model, cfg.seed, cfg.section(SphereFedConfig).scale)
