"""Dimensional collapse of a model's representations z = F(x) over a data set, measured from their covariance.

FedDecorr (Shi et al., ICLR 2023, Sec. 3) shows that label skew makes the global model's representations
collapse into a few dimensions: most singular values of their covariance matrix C fall to about zero. Two
numbers summarise C (d x d, biased, over all rows of the set):

    effective rank   erank(C) = exp(-sum_i p_i ln p_i),  p_i = lambda_i / sum_j lambda_j
                     (Roy and Vetterli, 2007; lambda: C's eigenvalues). 1 when z varies along one direction,
                     d when its variance is spread evenly over d orthogonal directions; 0 for no variance.
    correlation      (1/d^2) ||K||_F^2 with K_ij = C_ij / sqrt((C_ii + eps)(C_jj + eps)): FedDecorr's
                     regulariser (its paper form, client_app/trainers/feddecorr.py) on the whole set instead
                     of a batch. 1/d for decorrelated dimensions, 1 when every dimension is one up to scale.

The server records both for the global model on the G-FL test set every round (server_app/runner.py):
``global_feature_erank`` and ``global_feature_corr``, for every method.
"""

from __future__ import annotations

import numpy as np
import torch


class FeatureMoments:
    """Running sums of feature rows z (N x d) on their device in float64: count, sum z, sum z z^T. Read once
    (:meth:`covariance`), so adding a batch costs no host synchronisation."""

    def __init__(self) -> None:
        self.count = 0
        self.total: torch.Tensor | None = None
        self.outer: torch.Tensor | None = None

    def add(self, z: torch.Tensor) -> None:
        z64 = z.detach().flatten(1).to(torch.float64)
        if self.total is None or self.outer is None:  # both None until the first batch
            self.total = torch.zeros(z64.shape[1], dtype=torch.float64, device=z64.device)
            self.outer = torch.zeros(z64.shape[1], z64.shape[1], dtype=torch.float64, device=z64.device)
        if z64.shape[1] != self.total.shape[0]:
            raise ValueError(f"feature rows of width {z64.shape[1]} added to moments of width {self.total.shape[0]}")
        self.total.add_(z64.sum(0))
        self.outer.addmm_(z64.T, z64)
        self.count += int(z64.shape[0])

    def covariance(self) -> np.ndarray:
        """C = (1/N) sum z z^T - mean mean^T (d x d, float64); needs at least one row."""
        if self.total is None or self.outer is None or self.count == 0:
            raise ValueError("no feature rows were added")
        mean = self.total / self.count
        cov = self.outer / self.count - torch.outer(mean, mean)
        return cov.cpu().numpy()


def effective_rank(cov: np.ndarray) -> float:
    """exp of the entropy of C's normalised eigenvalues (negative round-off clipped to 0); 0.0 when C is 0."""
    lam = np.clip(np.linalg.eigvalsh(np.asarray(cov, dtype=np.float64)), 0.0, None)
    total = lam.sum()
    if total <= 0.0:
        return 0.0
    p = lam[lam > 0] / total
    return float(np.exp(-(p * np.log(p)).sum()))


def correlation_strength(cov: np.ndarray, eps: float = 1e-8) -> float:
    """(1/d^2) ||K||_F^2 of the correlation matrix K of C (each variance plus ``eps``, as FedDecorr's z-scoring)."""
    cov = np.asarray(cov, dtype=np.float64)
    scale = 1.0 / np.sqrt(np.diag(cov) + eps)
    k = cov * scale[:, None] * scale[None, :]
    return float((k ** 2).sum() / cov.shape[0] ** 2)


def collapse_stats(moments: FeatureMoments, prefix: str = "feature") -> dict[str, float]:
    """``{prefix}_erank``, ``{prefix}_corr`` and ``{prefix}_dim`` (d) of the rows added to ``moments``."""
    cov = moments.covariance()
    return {f"{prefix}_erank": effective_rank(cov), f"{prefix}_corr": correlation_strength(cov),
            f"{prefix}_dim": int(cov.shape[0])}
