"""FedMix / NaiveMix (Yoon et al., ICLR 2021; flcore/methods/fedmix.py), client side: FedAvg's local SGD with
each minibatch mixed with one pooled mean (x_bar, y_bar) drawn from the server's relayed pool:

    naivemix:  L = (1 - lam) CE(f(x~), y) + lam CE(f(x~), y_bar),   x~ = (1 - lam) x + lam x_bar
    fedmix:    L = (1 - lam) CE(f(u), y) + lam CE(f(u), y_bar) + lam mean_i <d CE(f(u_i), y_i)/d u_i, x_bar>,
               u = (1 - lam) x

On the server's means request (message type ``train.means``, before a round's training) a client computes its
means (:func:`client_means`) and returns them with the received model, untrained. With lam = 0, or without a
pool in the message, it trains as FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from client_app.trainers.base import TrainReply, Trainer
from client_app.training import TrainStats, default_forward, evaluate, local_train
from flcore.methods.fedmix import GLOBAL, MEANS, MEANS_ACTION, FedMixConfig
from flcore.records import params_to_record, record_to_params


def client_means(x: torch.Tensor, y: torch.Tensor, num_classes: int, mean_size: int,
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The client's shared means: its samples in a seeded random order, cut into groups of ``mean_size`` (the
    last one may be smaller; 0: one group of all), each group's mean input and mean one-hot label."""
    n = int(x.shape[0])
    if n == 0:
        raise ValueError("FedMix: a client without training data has no means to share")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    size = n if mean_size == 0 else mean_size
    xs, ys = x.detach().cpu()[order].double(), F.one_hot(y.cpu()[order], num_classes).double()
    groups = [slice(s, min(s + size, n)) for s in range(0, n, size)]
    x_bar = torch.stack([xs[g].mean(0) for g in groups]).float().numpy()
    y_bar = torch.stack([ys[g].mean(0) for g in groups]).float().numpy()
    return x_bar, y_bar


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """mean_i -sum_c target_ic log softmax(logits_i)_c (target rows are distributions)."""
    return -(target * F.log_softmax(logits, dim=1)).sum(1).mean()


def naivemix_loss(logits: torch.Tensor, y: torch.Tensor, y_bar: torch.Tensor, lam: float) -> torch.Tensor:
    """(1 - lam) CE(logits, y) + lam CE(logits, y_bar); ``logits`` are f((1 - lam) x + lam x_bar)."""
    return (1.0 - lam) * F.cross_entropy(logits, y) + lam * soft_cross_entropy(logits, y_bar.expand(logits.shape))


def fedmix_loss(logits: torch.Tensor, u: torch.Tensor, y: torch.Tensor, x_bar: torch.Tensor, y_bar: torch.Tensor,
                lam: float) -> torch.Tensor:
    """The FedMix loss of ``logits`` = f(u), u = (1 - lam) x a leaf that requires grad: the three terms of the
    module docstring; the gradient term keeps its graph (create_graph), so it is trained through."""
    if not u.requires_grad:
        raise ValueError("fedmix_loss needs the scaled input u with requires_grad (the gradient term)")
    per_sample = F.cross_entropy(logits, y, reduction="sum")       # sum: d/du_i is sample i's own gradient
    (grad,) = torch.autograd.grad(per_sample, u, create_graph=True)
    taylor = (grad.flatten(1) * x_bar.flatten().unsqueeze(0)).sum(1).mean()
    return ((1.0 - lam) * F.cross_entropy(logits, y) + lam * soft_cross_entropy(logits, y_bar.expand(logits.shape))
            + lam * taylor)


@dataclass
class PoolMixer:
    """Per minibatch: one pooled mean, the mixed (naivemix) or scaled (fedmix) forward, and the loss."""

    pool_x: torch.Tensor
    pool_y: torch.Tensor
    lam: float
    kind: str
    gen: torch.Generator
    _u: torch.Tensor | None = None
    _xbar: torch.Tensor | None = None
    _ybar: torch.Tensor | None = None

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        j = int(torch.randint(0, self.pool_x.shape[0], (1,), generator=self.gen))
        self._xbar = self.pool_x[j].to(device=x.device, dtype=x.dtype)
        self._ybar = self.pool_y[j].to(device=x.device, dtype=x.dtype)
        if self.kind == "naivemix":
            return default_forward(model, (1.0 - self.lam) * x + self.lam * self._xbar, y)
        self._u = ((1.0 - self.lam) * x).requires_grad_(True)
        return default_forward(model, self._u, y)

    def criterion(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        assert self._xbar is not None and self._ybar is not None
        if self.kind == "naivemix":
            return naivemix_loss(logits, y, self._ybar, self.lam)
        assert self._u is not None
        return fedmix_loss(logits, self._u, y, self._xbar, self._ybar, self.lam)


def pool_from_record(record: ArrayRecord, input_shape: tuple[int, ...], num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The relayed pool as tensors, its shapes checked against this client's data."""
    arrays = record_to_params(record)
    if set(arrays) != {"x", "y"}:
        raise ValueError(f"record '{GLOBAL}' must hold arrays 'x' and 'y', got {sorted(arrays)}")
    x, y = arrays["x"], arrays["y"]
    if x.shape[1:] != input_shape or y.shape != (x.shape[0], num_classes) or x.shape[0] == 0:
        raise ValueError(f"record '{GLOBAL}' has x {x.shape} and y {y.shape}; expected (m, {input_shape}) and "
                         f"(m, {num_classes}) with m > 0")
    return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))


class FedMixTrainer(Trainer):
    def fit(self) -> TrainStats:
        c = self.cfg.section(FedMixConfig)
        record = self.job.records.get(GLOBAL)
        if c.lam == 0.0 or record is None:
            return super().fit()
        if not isinstance(record, ArrayRecord):
            raise TypeError(f"record '{GLOBAL}' must be an ArrayRecord, got a {type(record).__name__}")
        d = self.job.data
        px, py = pool_from_record(record, tuple(d.x_train.shape[1:]), d.num_classes)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.job.generator))
        mixer = PoolMixer(px.to(d.x_train.device), py.to(d.x_train.device), c.lam, c.loss,
                          torch.Generator().manual_seed(seed))
        return local_train(self.job.model, d.x_train, d.y_train, self.optim_config(), self.terms(),
                           generator=self.job.generator, forward=mixer.forward, criterion=mixer.criterion)

    def run(self) -> TrainReply:
        if self.job.phase == MEANS_ACTION:
            return self.means_reply()
        return super().run()

    def means_reply(self) -> TrainReply:
        """The client's means (record ``fedmix-means``) with the received model, untrained."""
        d, c = self.job.data, self.cfg.section(FedMixConfig)
        x_bar, y_bar = client_means(d.x_train, d.y_train, d.num_classes, c.mean_size,
                                    seed=int(self.cfg.seed) * 100_003 + self.job.cid)
        loss, acc = evaluate(self.job.model, d.x_test, d.y_test)
        metrics: dict[str, float | int] = {
            "cid": self.job.cid, "num-examples": d.num_train, "train_loss": float("nan"), "local-steps": 0,
            "local-accuracy": acc, "local-loss": loss, "global-model-local-accuracy": acc,
            "global-model-local-loss": loss}
        return TrainReply(self.reply_params(), metrics, {MEANS: params_to_record({"x": x_bar, "y": y_bar})})
