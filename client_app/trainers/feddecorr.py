"""FedDecorr (Shi et al., ICLR 2023; flcore/methods/feddecorr.py), client side: FedAvg's local SGD with
beta * L_FedDecorr added to every minibatch's cross-entropy (paper Sec. 4; its equation numbers could not be
read, see flcore/methods/feddecorr.py for what was read and where):

    z_hat_n,i = (z_n,i - mean_n z_n,i) / sqrt(var_n z_n,i + eps)      (z-scoring each dimension over the batch)
    K = z_hat^T z_hat / N                                              (d x d correlation matrix)
    L_code = (N-1)^2/N * mean_{i != j} K_ij^2        (form "code", the default: the authors' loss.py, FedDecorrLoss)
    L_FedDecorr = (1/d^2) ||K||_F^2                  (form "paper", the diagonal included; ~N times weaker)

z is the representation the classifier reads (the training loop's ``Step.features``, with its graph). A batch of
one sample has no correlation and adds nothing (as in the authors' code). The server is FedAvg.
"""

from __future__ import annotations

import torch
from torch import nn

from client_app.trainers.base import Trainer
from client_app.training import LossTerm, Step
from flcore.methods.feddecorr import FORMS, FedDecorrConfig


def correlation_matrix(z: torch.Tensor, eps: float, unbiased: bool = False) -> torch.Tensor:
    """K (d x d) of a batch z (N x d): each column z-scored over the batch with its variance (biased, or
    unbiased with ``unbiased``) plus ``eps``, then z_hat^T z_hat divided by N (N-1 when unbiased). For eps -> 0
    this is the Pearson correlation of the columns; a constant column gives a zero row and column."""
    if z.dim() != 2:
        raise ValueError(f"FedDecorr needs a batch of flat representations (N x d), got shape {tuple(z.shape)}")
    n = z.shape[0]
    centred = z - z.mean(dim=0, keepdim=True)
    var = centred.pow(2).sum(dim=0, keepdim=True) / (n - 1 if unbiased else n)
    z_hat = centred / torch.sqrt(var + eps)
    return z_hat.T @ z_hat / (n - 1 if unbiased else n)


def decorrelation_loss(z: torch.Tensor, eps: float = 1e-8, form: str = "paper") -> torch.Tensor:
    """L_FedDecorr of a batch of representations z (N x d); see the module docstring for both forms.
    Zero (with z's graph) for a batch of fewer than two samples, and in form "code" for d = 1."""
    if form not in FORMS:
        raise ValueError(f"FedDecorr form must be one of {', '.join(FORMS)}, got {form!r}")
    n, d = z.shape[0], z.shape[-1]
    if n < 2:
        return z.sum() * 0.0
    if form == "paper":
        return correlation_matrix(z, eps).pow(2).sum() / d ** 2
    if d < 2:
        return z.sum() * 0.0          # one dimension: no off-diagonal entry to penalise
    k = correlation_matrix(z, eps, unbiased=True)
    off = k.pow(2).sum() - torch.diagonal(k).pow(2).sum()
    return (n - 1) ** 2 / n * off / (d * (d - 1))


class DecorrTerm(LossTerm):
    """beta * L_FedDecorr on each minibatch's representations (skipped when beta is 0)."""

    def __init__(self, beta: float, eps: float, form: str) -> None:
        self.beta, self.eps, self.form = float(beta), float(eps), form

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        if self.beta == 0.0:
            return None
        return self.beta * decorrelation_loss(step.features, self.eps, self.form)


class FedDecorrTrainer(Trainer):
    """FedAvg's local SGD plus the decorrelation term."""

    def terms(self) -> list[LossTerm]:
        c = self.cfg.section(FedDecorrConfig)
        return [DecorrTerm(c.beta, c.eps, c.form)]
