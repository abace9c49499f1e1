"""SCAFFOLD (Karimireddy et al., ICML 2020), client side (paper Alg. 1, lines 7-13).

Each local step uses the corrected gradient g_i(y) - c_i + c (a :class:`ControlVariateTerm` in the one
loop). After K local steps with learning rate eta_l the client updates its control variate:
    option I:  c_i+ = g_i(x)                                   (full local gradient at the server model)
    option II: c_i+ = c_i - c + (x - y_i) / (K eta_l)          (reuses the local updates; the default)
With heavy-ball momentum beta (torch SGD, buffer reset every round) K steps move the model by
eta_l * S(K, beta) times a constant gradient, S = sum_{t=1..K} (1 - beta^t) / (1 - beta) (= K for beta = 0),
so option II divides by eta_l * S instead of K eta_l: otherwise c_i overestimates the gradient ~1/(1-beta)
times (10x at beta = 0.9) and the corrected steps diverge. beta = 0 is exactly the paper's formula.
and returns y_i (the arrays) and delta c_i = c_i+ - c_i (record ``scaffold-delta-c``). c_i lives in the
client's persistent state (``scaffold-c-i``); c arrives from the server (record ``scaffold-c``).
Control variates cover the model's trainable parameters, keyed by state-dict name.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from client_app.trainers.base import Trainer, TrainJob
from client_app.training import LossTerm, TrainStats, minibatches
from flcore.methods.scaffold import DELTA_C, SERVER_C, STATE_C_I, ScaffoldConfig
from flcore.records import params_to_record, record_to_params

Tensors = "OrderedDict[str, torch.Tensor]"


def option2_variate(c_i: Mapping[str, torch.Tensor], c: Mapping[str, torch.Tensor],
                    x: Mapping[str, torch.Tensor], y: Mapping[str, torch.Tensor],
                    steps: int, lr: float, momentum: float = 0.0) -> Tensors:
    """SCAFFOLD option II (Alg. 1 line 12): c_i+ = c_i - c + (x - y_i) / (eta_l * S(K, beta)),
    S = :func:`momentum_step_sum` (= K without momentum: the paper's formula)."""
    if steps <= 0 or lr <= 0:
        raise ValueError(f"option II needs steps > 0 and lr > 0, got steps={steps}, lr={lr}")
    scale = lr * momentum_step_sum(steps, momentum)
    return OrderedDict((k, c_i[k] - c[k] + (x[k] - y[k]) / scale) for k in c_i)


def momentum_step_sum(steps: int, momentum: float) -> float:
    """S(K, beta) = sum_{t=1..K} (1 - beta^t) / (1 - beta): how many gradient-lengths K heavy-ball steps
    (buffer starting at 0) move the parameters under a constant gradient; K when beta = 0."""
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    if momentum == 0.0:
        return float(steps)
    return (steps - momentum * (1.0 - momentum ** steps) / (1.0 - momentum)) / (1.0 - momentum)


def full_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, names: list[str], batch_size: int,
                  forward: Callable) -> Tensors:
    """SCAFFOLD option I: g_i(x) = gradient of the mean cross-entropy over all local samples at the current
    model, accumulated over minibatches (each weighted by its share of the samples); leaves .grad empty."""
    params = dict(model.named_parameters())
    acc = OrderedDict((k, torch.zeros_like(params[k])) for k in names)
    n = int(x.shape[0])
    model.train()
    for xb, yb in minibatches(x, y, batch_size, None, shuffle=False):
        model.zero_grad(set_to_none=True)
        logits, _ = forward(model, xb, yb)
        (F.cross_entropy(logits, yb) * (xb.shape[0] / n)).backward()
        for k in names:
            if params[k].grad is not None:
                acc[k] += params[k].grad
    model.zero_grad(set_to_none=True)
    return acc


class ControlVariateTerm(LossTerm):
    """g <- g + (c - c_i) after every backward pass (Alg. 1 line 10), for parameters that got a gradient."""

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


class ScaffoldTrainer(Trainer):
    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        self.scfg = job.cfg.section(ScaffoldConfig)
        self.names = [k for k, p in job.model.named_parameters() if p.requires_grad]
        self.c = self._server_c()
        self.c_i = self._client_c()
        self.delta_c: Tensors | None = None

    def _as_tensors(self, arrays: Mapping[str, np.ndarray], what: str) -> Tensors:
        params = dict(self.job.model.named_parameters())
        out = OrderedDict()
        for k in self.names:
            if k not in arrays:
                raise KeyError(f"client {self.job.cid}: {what} has no tensor for parameter '{k}'")
            t = torch.as_tensor(np.asarray(arrays[k])).to(device=params[k].device, dtype=params[k].dtype)
            if t.shape != params[k].shape:
                raise ValueError(f"client {self.job.cid}: {what} tensor '{k}' has shape {tuple(t.shape)}, "
                                 f"expected {tuple(params[k].shape)}")
            out[k] = t
        return out

    def _server_c(self) -> Tensors:
        rec = self.job.records.get(SERVER_C)
        if not isinstance(rec, ArrayRecord):
            raise KeyError(f"client {self.job.cid}: SCAFFOLD message lacks the server control variate "
                           f"record '{SERVER_C}'")
        return self._as_tensors(record_to_params(rec), f"record '{SERVER_C}'")

    def _client_c(self) -> Tensors:
        stored = self.job.state.get_arrays(STATE_C_I)
        if stored is None:  # first participation: c_i = 0 (Alg. 1 initialisation)
            return OrderedDict((k, torch.zeros_like(v)) for k, v in self.c.items())
        return self._as_tensors(stored, f"client state '{STATE_C_I}'")

    def terms(self) -> list[LossTerm]:
        return [ControlVariateTerm(OrderedDict((k, self.c[k] - self.c_i[k]) for k in self.names))]

    def _trainable(self) -> Tensors:
        params = dict(self.job.model.named_parameters())
        return OrderedDict((k, params[k].detach().clone()) for k in self.names)

    def fit(self) -> TrainStats:
        x = self._trainable()
        opt = self.optim_config()
        if self.scfg.option == "I":
            d = self.job.data
            new_c_i = full_gradient(self.job.model, d.x_train, d.y_train, self.names, opt.batch_size, self.forward)
        stats = super().fit()
        if self.scfg.option == "II":
            if stats.steps > 0:
                new_c_i = option2_variate(self.c_i, self.c, x, self._trainable(), stats.steps, opt.lr,
                                          opt.momentum)
            else:  # no local step was taken: nothing to learn c_i from
                new_c_i = OrderedDict((k, v.clone()) for k, v in self.c_i.items())
        self.delta_c = OrderedDict((k, new_c_i[k] - self.c_i[k]) for k in self.names)
        self.job.state.put_arrays(STATE_C_I, _to_numpy(new_c_i))
        return stats

    def extra_records(self) -> dict:
        if self.delta_c is None:
            raise RuntimeError(f"client {self.job.cid}: SCAFFOLD extra_records() called before fit()")
        return {DELTA_C: params_to_record(_to_numpy(self.delta_c))}


def _to_numpy(tensors: Mapping[str, torch.Tensor]) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict((k, v.detach().cpu().numpy().copy()) for k, v in tensors.items())
