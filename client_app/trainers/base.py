"""The client-side trainer base (FedAvg's local training) that every method's trainer extends.

A method overrides a few hooks, FL-bench style:
    terms()          -> loss terms plugged into the one loop (client_app/training.py)
    forward()        -> how logits/features are computed in training (e.g. ETF + memory vectors)
    personalized()   -> the model evaluated for P-FL (e.g. FedBC-FineTune fine-tunes a copy)
    before_fit()     -> scalars measured on the received global model before training (q-FedAvg's F_k)
    extra_metrics()  -> scalars reported with the update (e.g. FedBC's ||x - z||^2)
    extra_records()  -> arrays/configs reported with the update (e.g. SCAFFOLD's delta c, class means)
Everything a trainer may read is in :class:`TrainJob`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from client_app.state import ClientState
from client_app.training import (LossTerm, OptimConfig, TrainStats, default_forward, evaluate,
                                 local_train, restricted_forward, restricted_softmax_scale)
from flcore.config import RunConfig
from flcore.records import model_views
from models.base import FLModel


@dataclass(frozen=True)
class ClientData:
    """One client's data, already on the training device (shared by a node's messages: read-only)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int

    @property
    def num_train(self) -> int:
        return int(self.x_train.shape[0])

    def class_counts(self) -> list[int]:
        return torch.bincount(self.y_train.cpu(), minlength=self.num_classes).tolist()


@dataclass
class TrainJob:
    cfg: RunConfig
    cid: int
    server_round: int
    model: FLModel                              # loaded with the global weights, on `device`
    global_params: Mapping[str, torch.Tensor]  # the received global state dict as tensors (read-only)
    data: ClientData
    config: dict[str, Any]                      # this client's ConfigRecord from the server
    records: dict[str, ArrayRecord | ConfigRecord]  # extra records in the message (method extras)
    state: ClientState
    device: torch.device
    generator: torch.Generator                  # seeded by (seed, round, cid): reproducible shuffles
    phase: str = "train"                        # message action: "train", or a named one ("train.prior")


@dataclass
class TrainReply:
    params: dict[str, np.ndarray]
    metrics: dict[str, float | int]
    records: dict[str, ArrayRecord | ConfigRecord | MetricRecord] = field(default_factory=dict)


class Trainer:
    """FedAvg's client: E epochs of local SGD on cross-entropy."""

    def __init__(self, job: TrainJob) -> None:
        self.job = job
        self.cfg = job.cfg
        # FedRS's restricted softmax, a common key composing with any method (restricted-softmax-alpha < 1):
        # every training forward of this trainer (its own, a subclass's) returns the class-scaled logits
        scale = (restricted_softmax_scale(job.data.class_counts(), job.cfg.restricted_softmax_alpha,
                                          job.cfg.restricted_softmax_form)
                 if job.cfg.restricted_softmax_alpha < 1.0 else None)
        if scale is not None:
            self.forward = restricted_forward(self.forward, scale.to(job.device))  # type: ignore[method-assign]

    # --- hooks -----------------------------------------------------------------------------------
    def terms(self) -> list[LossTerm]:
        return []

    def forward(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return default_forward(model, x, y)

    def optim_config(self) -> OptimConfig:
        c = self.cfg
        return OptimConfig(lr=c.lr, epochs=c.local_epochs,
                           batch_size=c.batch_size, momentum=c.momentum, weight_decay=c.weight_decay,
                           max_steps=c.max_local_steps)

    def fit(self) -> TrainStats:
        d = self.job.data
        return local_train(self.job.model, d.x_train, d.y_train, self.optim_config(), self.terms(),
                           generator=self.job.generator, forward=self.forward)

    def personalized(self) -> torch.nn.Module:
        """The client's local model for P-FL evaluation (default: the model just trained)."""
        return self.job.model

    def before_fit(self) -> dict[str, float | int]:
        return {}

    def extra_metrics(self, stats: TrainStats) -> dict[str, float | int]:
        return {}

    def extra_records(self) -> dict[str, ArrayRecord | ConfigRecord | MetricRecord]:
        return {}

    def reply_params(self) -> dict[str, np.ndarray]:
        """The parameters sent back. The base returns views of the trained model's memory (no copy: the
        ClientApp encodes them into the reply before the model is used again)."""
        return dict(model_views(self.job.model))

    # --- the fixed sequence ----------------------------------------------------------------------
    def run(self) -> TrainReply:
        d = self.job.data
        g_loss, g_acc = evaluate(self.job.model, d.x_test, d.y_test)
        before = self.before_fit()
        stats = self.fit()
        l_loss, l_acc = evaluate(self.personalized(), d.x_test, d.y_test)
        metrics: dict[str, float | int] = {
            "cid": self.job.cid,
            "num-examples": d.num_train,
            "train_loss": stats.mean_loss,
            "local-steps": stats.steps,
            "local-accuracy": l_acc,
            "local-loss": l_loss,
            "global-model-local-accuracy": g_acc,
            "global-model-local-loss": g_loss,
        }
        metrics.update(before)
        metrics.update(self.extra_metrics(stats))
        return TrainReply(self.reply_params(), metrics, self.extra_records())


def trainable_pairs(model: torch.nn.Module, reference: Mapping[str, torch.Tensor | np.ndarray],
                    what: str) -> list[tuple[str, torch.nn.Parameter, torch.Tensor]]:
    """(name, parameter, reference tensor on the parameter's device) for every trainable parameter."""
    out = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name not in reference:
            raise KeyError(f"{what}: no reference tensor for parameter '{name}'")
        ref = torch.as_tensor(reference[name]).to(device=p.device, dtype=p.dtype)
        if ref.shape != p.shape:
            raise ValueError(f"{what}: tensor '{name}' has shape {tuple(ref.shape)}, expected {tuple(p.shape)}")
        out.append((name, p, ref.detach()))
    return out


M = TypeVar("M", bound=torch.nn.Module)


def frozen_copy(model: M) -> M:
    """A detached, eval-mode copy (for global/previous models used inside a loss)."""
    other = copy.deepcopy(model)
    other.eval()
    for p in other.parameters():
        p.requires_grad_(False)
    return other
