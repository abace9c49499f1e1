"""The one local training loop. Methods plug in :class:`LossTerm` objects; they never copy the loop.

Per minibatch (x, y):
    for t in terms: t.before_step(model, x, y)        # e.g. FedBR's max step on its own parameters
    logits, z = forward(model, x, y)                  # default: model.forward_features(x)
    loss = criterion(logits, y) + sum(t.loss(step))   # e.g. FedProx's mu/2 ||w - w_g||^2, MOON, LRA
    loss.backward()
    for t in terms: t.on_gradients(model)             # e.g. SCAFFOLD's  g <- g - c_i + c
    optimizer.step()
    for t in terms: t.after_step(model, step)         # e.g. FedUFO's discriminator update
Local SGD has optional momentum and weight decay. Batches come from an in-memory tensor iterator
(no DataLoader workers: the data is small and already on the device), shuffled by a seeded generator; with
``OptimConfig.drop_last`` an epoch's last, partial batch is skipped (DataLoader(drop_last=True)). A trainer that
keeps its optimizer's state between calls (momentum across rounds) passes the optimizer in (``optimizer=``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence, cast

import torch
from torch import nn

from models.device_sum import DeviceSum
from models.evaluation import evaluate  # noqa: F401 - the loop's evaluation, shared with the server
from models.numerics import current_scaler, fp32
import torch.nn.functional as F

Forward = Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class FeatureModel(Protocol):
    """The model contract of the loop's default forward: models/base.py FLModel's ``forward_features`` (tests and
    benchmarks pass stand-in modules with the same method)."""

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class NamedForward(Protocol):
    """A :data:`Forward` whose parameters are named like a trainer's ``forward`` method's (it can replace one)."""

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class Step:
    """What a loss term sees for one minibatch."""

    x: torch.Tensor
    y: torch.Tensor
    logits: torch.Tensor
    features: torch.Tensor
    index: int  # global step counter within this local training call
    epoch: int


class LossTerm:
    """A pluggable piece of the local objective. Override what you need; defaults do nothing."""

    def begin(self, model: nn.Module) -> None:
        """Called once before the first step (snapshot the global model, build caches)."""

    def before_step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        """Called before the forward pass of every step."""

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        """Extra loss added to the criterion; return None for nothing."""
        return None

    def on_gradients(self, model: nn.Module) -> None:
        """Called after backward, before the optimizer step (gradient corrections)."""

    def after_step(self, model: nn.Module, step: Step) -> None:
        """Called after the optimizer step."""

    def end(self, model: nn.Module) -> None:
        """Called once after the last step."""


@dataclass(frozen=True)
class OptimConfig:
    lr: float
    epochs: int
    batch_size: int
    momentum: float = 0.0
    weight_decay: float = 0.0
    max_steps: int = 0  # 0 = no cap
    drop_last: bool = False  # skip each epoch's last, partial minibatch


@dataclass
class TrainStats:
    """Counts of one local training call. The loss sum stays on the loss's device (models/device_sum.py): no
    host synchronisation per step; :attr:`loss_sum` reads it once."""

    steps: int = 0
    num_examples: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    losses: DeviceSum = field(default_factory=DeviceSum, repr=False)

    @property
    def loss_sum(self) -> float:
        return self.losses.value()

    @property
    def mean_loss(self) -> float:
        return self.loss_sum / max(self.steps, 1)


def minibatches(x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator | None,
                shuffle: bool = True, drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Minibatches of (x, y) in a (seeded) random order; ``drop_last``: without the last, partial one."""
    n = x.shape[0]
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    order = order.to(x.device, non_blocking=True)  # from pageable memory: no wait for the stream
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        idx = order[start:start + batch_size]
        yield x[idx], y[idx]


def forward_features(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.forward_features(x)``: (logits, z) of a module that follows :class:`FeatureModel`."""
    return cast(FeatureModel, model).forward_features(x)


def default_forward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return forward_features(model, x)


def restricted_softmax_scale(class_counts: Sequence[int], alpha: float, form: str = "paper") -> torch.Tensor | None:
    """FedRS's per-class logit scales s_c of one client (Li & Zhan, KDD 2021, Sec. 4 "restricted softmax"):
    form "paper": s_c = 1 for a class the client holds (n_c > 0), alpha for a missing one; form "code":
    s_c = alpha + (1 - alpha) n_c / max_j n_j (the authors' FedRepo algorithms/fedrs.py, FedRS.update_local).
    None when alpha = 1 (every s_c = 1: the plain softmax) or the client holds no sample."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"restricted-softmax-alpha must be in [0, 1], got {alpha}")
    if form not in ("paper", "code"):
        raise ValueError(f"restricted-softmax-form must be 'paper' or 'code', got {form!r}")
    counts = torch.as_tensor(list(class_counts), dtype=torch.float32)
    if alpha == 1.0 or counts.numel() == 0 or float(counts.max()) <= 0:
        return None
    if form == "paper":
        return torch.where(counts > 0, torch.ones_like(counts), torch.full_like(counts, alpha))
    return alpha + (1.0 - alpha) * counts / counts.max()


def restricted_forward(forward: Forward, scale: torch.Tensor) -> NamedForward:
    """``forward`` with its logits multiplied class-wise by ``scale`` (the restricted softmax's o_c = s_c o_c,
    FedRS Sec. 4): the training criterion and every loss term then see the restricted logits; the features
    are unchanged, and evaluation (which calls the model, not a trainer's forward) keeps the plain softmax."""
    def scaled(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, feats = forward(model, x, y)
        return logits * scale.to(device=logits.device, dtype=logits.dtype), feats
    return scaled


def make_optimizer(params, cfg: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def local_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: OptimConfig,
                terms: Sequence[LossTerm] = (), generator: torch.Generator | None = None,
                forward: Forward = default_forward,
                criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
                params: Sequence[nn.Parameter] | None = None,
                optimizer: torch.optim.Optimizer | None = None,
                scaler: torch.amp.GradScaler | None = None) -> TrainStats:
    """Run ``cfg.epochs`` epochs of minibatch SGD on (x, y) with the given loss terms.

    ``params`` restricts what the optimizer updates (default: every trainable parameter of the model
    outside ``model.extras``-owned modules that a term trains itself is up to that term). ``optimizer``: one
    the caller built over those parameters and keeps (its state, e.g. momentum buffers, outlives this call);
    default a fresh :func:`make_optimizer` from ``cfg``. ``scaler``: fp16's gradient scaler (default: the one of
    the ``precision = fp16-mixed`` block being run, models/numerics.py; None at fp32 / bf16): the loss is scaled
    for backward and the gradients unscaled before the terms' ``on_gradients``, so corrections see true gradients;
    a step whose gradients overflowed is skipped by the scaler. The criterion takes fp32 logits.
    """
    model.train()
    trainable = list(params) if params is not None else [p for p in model.parameters() if p.requires_grad]
    opt = optimizer if optimizer is not None else make_optimizer(trainable, cfg)
    scaler = scaler if scaler is not None else current_scaler()
    stats = TrainStats()
    for term in terms:
        term.begin(model)
    done = False
    for epoch in range(cfg.epochs):
        for xb, yb in minibatches(x, y, cfg.batch_size, generator, drop_last=cfg.drop_last):
            for term in terms:
                term.before_step(model, xb, yb)
            logits, feats = forward(model, xb, yb)
            step = Step(xb, yb, logits, feats, stats.steps, epoch)
            loss = criterion(fp32(logits), yb)
            for term in terms:
                extra = term.loss(model, step)
                if extra is not None:
                    loss = loss + extra
            opt.zero_grad(set_to_none=True)
            if scaler is None:
                loss.backward()
                for term in terms:
                    term.on_gradients(model)
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                for term in terms:
                    term.on_gradients(model)
                scaler.step(opt)
                scaler.update()
            for term in terms:
                term.after_step(model, step)
            stats.steps += 1
            stats.num_examples += int(xb.shape[0])
            stats.losses.add(loss)
            if cfg.max_steps and stats.steps >= cfg.max_steps:
                done = True
                break
        if done:
            break
    for term in terms:
        term.end(model)
    return stats
