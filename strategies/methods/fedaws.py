"""FedAwS (Yu et al., ICML 2020; flcore/methods/fedaws.py), server side: FedAvg's average, then ``steps`` SGD
steps (momentum restarted every round) on the spreadout regulariser of the averaged classifier rows W (C x d):

    d_cc' = (1 - cos(w_c, w_c')) / 2          (distance "cosine")   or   ||w_c - w_c'||^2   ("euclidean")
    H_cc' = max(0, nu - d_cc')^2  for c != c',  0 on the diagonal
    reg_sp(W) = mean_{c, c'} H_cc'            (reduction "mean")    or   sum_{c != c'} H_cc'  ("sum")

Nothing is kept across rounds (the server's SGD state is rebuilt every round), so the checkpoint is FedAvg's.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from flcore.config import RunConfig
from flcore.methods.fedaws import HEAD_KEY, SPREAD_AFTER, SPREAD_BEFORE, FedAwSConfig
from strategies.aggregation import weighted_average
from strategies.base import ClientUpdate, FLStrategy, Params


def pairwise_distance(w: torch.Tensor, distance: str) -> torch.Tensor:
    """d(w_c, w_c') for every pair of rows of w (C x C)."""
    if distance == "cosine":
        wn = torch.nn.functional.normalize(w, dim=1)
        return 0.5 * (1.0 - wn @ wn.T)
    if distance == "euclidean":
        return (w.unsqueeze(1) - w.unsqueeze(0)).pow(2).sum(-1)
    raise ValueError(f"unknown fedaws distance '{distance}' (cosine or euclidean)")


def spreadout(w: torch.Tensor, margin: float, distance: str = "cosine", reduction: str = "mean") -> torch.Tensor:
    """reg_sp(W): the squared hinge max(0, nu - d)^2 over the pairs c != c', averaged over the C x C matrix or
    summed (see the module docstring)."""
    if w.dim() != 2 or w.shape[0] < 2:
        raise ValueError(f"spreadout needs a C x d classifier with C >= 2 rows, got shape {tuple(w.shape)}")
    off = 1.0 - torch.eye(w.shape[0], dtype=w.dtype, device=w.device)
    hinge = torch.clamp(margin - pairwise_distance(w, distance), min=0.0).pow(2) * off
    if reduction == "mean":
        return hinge.mean()
    if reduction == "sum":
        return hinge.sum()
    raise ValueError(f"unknown fedaws reduction '{reduction}' (mean or sum)")


def spreadout_steps(w: np.ndarray, cfg: FedAwSConfig) -> tuple[np.ndarray, float, float]:
    """``cfg.steps`` steps of SGD (lr, momentum, a fresh buffer) on reg_sp from w: (new w, reg before, after)."""
    param = torch.nn.Parameter(torch.tensor(np.asarray(w), dtype=torch.float64))
    opt = torch.optim.SGD([param], lr=cfg.lr, momentum=cfg.momentum)
    with torch.no_grad():
        before = float(spreadout(param, cfg.margin, cfg.distance, cfg.reduction))
    for _ in range(cfg.steps):
        loss = spreadout(param, cfg.margin, cfg.distance, cfg.reduction)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = float(spreadout(param, cfg.margin, cfg.distance, cfg.reduction))
    return param.detach().numpy().astype(np.asarray(w).dtype), before, after


class FedAwSStrategy(FLStrategy):
    """FedAvg, then the spreadout steps on the averaged classifier rows."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.acfg = cfg.section(FedAwSConfig)
        self._spread: dict[str, float] = {}

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        avg = weighted_average([u.params for u in updates], [u.num_examples for u in updates])
        if self.acfg.steps == 0:
            return avg
        if HEAD_KEY not in avg:
            raise KeyError(f"fedaws: the model has no trainable classifier '{HEAD_KEY}' to spread "
                           f"(tensors: {', '.join(avg)})")
        new_w, before, after = spreadout_steps(avg[HEAD_KEY], self.acfg)
        self._spread = {SPREAD_BEFORE: before, SPREAD_AFTER: after}
        return OrderedDict((k, new_w if k == HEAD_KEY else v) for k, v in avg.items())

    def round_metrics(self) -> dict[str, Any]:
        return dict(self._spread)
