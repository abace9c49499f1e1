"""Model evaluation shared by the server (G-FL on the global test set) and the clients (P-FL, local splits)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512,
             forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None) -> tuple[float, float]:
    """(mean cross-entropy loss, accuracy) of ``model`` on (x, y), in order, ``batch_size`` rows at a time."""
    model.eval()
    n = int(x.shape[0])
    if n == 0:
        return float("nan"), float("nan")
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, n, batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            logits = forward(model, xb) if forward is not None else model(xb)
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(1) == yb).sum())
    return loss_sum / n, correct / n
