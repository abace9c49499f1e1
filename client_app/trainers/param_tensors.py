"""Per-parameter tensors a trainer receives, keeps or reports, and the loop pieces built on them: the
generic half of control-variate and state-keeping methods (SCAFFOLD's c and c_i, FedDyn's gradient state),
so that a method's trainer holds only its paper's formulas.

Tensors are keyed by the state-dict names of the model's trainable parameters, in ``named_parameters()``
order, each on its parameter's device and dtype.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from flcore.named_arrays import Tensors
from client_app.trainers.base import TrainJob, trainable_pairs
from client_app.training import Forward, LossTerm, Step, minibatches
from flcore.records import record_to_params
from models.numerics import fp32



def param_tensors(model: nn.Module, arrays: Mapping[str, np.ndarray | torch.Tensor], what: str) -> Tensors:
    """``arrays`` for every trainable parameter of ``model``, on its device and dtype; a missing name or a
    wrong shape raises, naming ``what``."""
    return OrderedDict((name, ref) for name, _, ref in trainable_pairs(model, arrays, what))


def trainable_copy(model: nn.Module) -> Tensors:
    """Detached copies of the trainable parameters' current values."""
    return OrderedDict((k, p.detach().clone()) for k, p in model.named_parameters() if p.requires_grad)


def received_tensors(job: TrainJob, key: str, what: str) -> Tensors:
    """The server's ArrayRecord ``key`` (``what`` it holds, for the error) as parameter tensors."""
    rec = job.records.get(key)
    if not isinstance(rec, ArrayRecord):
        raise KeyError(f"client {job.cid}: the message lacks {what} (record '{key}')")
    return param_tensors(job.model, record_to_params(rec), f"client {job.cid}: record '{key}'")


def stored_tensors(job: TrainJob, key: str) -> Tensors:
    """The client-state entry ``key`` as parameter tensors; zero before the client's first participation."""
    stored = job.state.get_arrays(key)
    if stored is None:
        return OrderedDict((k, torch.zeros_like(p)) for k, p in job.model.named_parameters() if p.requires_grad)
    return param_tensors(job.model, stored, f"client {job.cid}: client state '{key}'")


def to_numpy(tensors: Mapping[str, torch.Tensor]) -> "OrderedDict[str, np.ndarray]":
    """Detached CPU copies, for a record or the client state."""
    return OrderedDict((k, v.detach().cpu().numpy().copy()) for k, v in tensors.items())


class ControlVariateTerm(LossTerm):
    """g <- g + correction after every backward pass, for the parameters that got a gradient (SCAFFOLD's
    c - c_i, Alg. 1 line 10)."""

    def __init__(self, correction: Mapping[str, torch.Tensor]) -> None:
        self.correction = correction
        self._pairs: list[tuple[nn.Parameter, torch.Tensor]] = []

    def begin(self, model: nn.Module) -> None:
        params = dict(model.named_parameters())
        self._pairs = [(params[k], v) for k, v in self.correction.items()]

    def on_gradients(self, model: nn.Module) -> None:
        for p, corr in self._pairs:
            if p.grad is not None:
                p.grad.add_(corr)


class ParamPenalty(LossTerm):
    """Adds ``penalty(tuples)`` to every minibatch loss: one tuple (w_j, r1_j, r2_j, ...) per trainable
    parameter w_j with the same-named tensors of fixed references (the received model, a client state)."""

    def __init__(self, penalty: Callable[[list[tuple[torch.Tensor, ...]]], torch.Tensor],
                 *references: Mapping[str, torch.Tensor]) -> None:
        self.penalty, self.references = penalty, references
        self._tuples: list[tuple[torch.Tensor, ...]] = []

    def begin(self, model: nn.Module) -> None:
        self._tuples = [(p, *(r[k] for r in self.references)) for k, p in model.named_parameters() if p.requires_grad]

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        return self.penalty(self._tuples)


def full_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, names: list[str], batch_size: int,
                  forward: Forward) -> Tensors:
    """Gradient of the mean cross-entropy over all of (x, y) at the current model (SCAFFOLD option I's
    g_i(x)), accumulated over minibatches each weighted by its share of the samples; leaves .grad empty."""
    params = dict(model.named_parameters())
    acc = OrderedDict((k, torch.zeros_like(params[k])) for k in names)
    n = int(x.shape[0])
    model.train()
    for xb, yb in minibatches(x, y, batch_size, None, shuffle=False):
        model.zero_grad(set_to_none=True)
        logits, _ = forward(model, xb, yb)
        (F.cross_entropy(fp32(logits), yb) * (xb.shape[0] / n)).backward()
        for k in names:
            grad = params[k].grad
            if grad is not None:
                acc[k] += grad
    model.zero_grad(set_to_none=True)
    return acc


def momentum_step_sum(steps: int, momentum: float) -> float:
    """S(K, beta) = sum_{t=1..K} (1 - beta^t) / (1 - beta): how many gradient-lengths K heavy-ball steps of
    torch SGD (buffer starting at 0) move the parameters under a constant gradient; K when beta = 0."""
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    if momentum == 0.0:
        return float(steps)
    return (steps - momentum * (1.0 - momentum ** steps) / (1.0 - momentum)) / (1.0 - momentum)
