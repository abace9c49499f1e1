"""Model evaluation shared by the server (G-FL on the global test set) and the clients (P-FL, local splits).

Evaluation support: a module of the model may evaluate each test sample against a fixed support set of
training data (FedRANE's inductive LRA neck) instead of against the other samples of its batch. Such a module
has an int attribute ``eval_support_size`` (rows it needs; 0: none), ``set_eval_support(x, features)`` and
``pop_eval_stats() -> dict``. The caller that owns training data attaches it: a client its own training rows
(:func:`eval_support`), the server a seeded sample of the clients' training pool
(data_partitioning/support.py, :func:`set_eval_support`). Models without such a module are untouched.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Protocol, Sequence, TypeGuard, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.numerics import fp32
from models.representation import FeatureMoments


@runtime_checkable
class ForwardFeatures(Protocol):
    """A model with ``forward_features(x) -> (logits, z)`` (an FLModel: models/base.py)."""

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class Features(Protocol):
    """A model with a feature extractor ``features(x) -> z`` (an FLModel: models/base.py)."""

    def features(self, x: torch.Tensor) -> torch.Tensor: ...


class EvalSupportModule(Protocol):
    """A module of the evaluation-support protocol (this module's docstring; FedRANE's LRA neck)."""

    eval_support_size: int

    def set_eval_support(self, x: torch.Tensor | None,
                         features: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None: ...


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512,
             forward: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None,
             moments: FeatureMoments | None = None) -> tuple[float, float]:
    """(mean cross-entropy loss, accuracy) of ``model`` on (x, y), in order, ``batch_size`` rows at a time.
    ``moments``: also add the representations z of every row to it (the same forward pass, through the model's
    ``forward_features``: models/representation.py measures their collapse)."""
    if moments is not None and (forward is not None or not isinstance(model, ForwardFeatures)):
        raise ValueError("feature moments need the model's own forward_features (an FLModel, no custom forward)")
    model.eval()
    n = int(x.shape[0])
    if n == 0:
        return float("nan"), float("nan")
    # running sums on the device (float64 loss: the same IEEE additions as Python's float sum; int64 count), read
    # once at the end: no host synchronisation per batch
    loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    with torch.no_grad():
        for start in range(0, n, batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            if moments is not None:
                assert isinstance(model, ForwardFeatures)  # checked on entry
                logits, z = model.forward_features(xb)
                moments.add(z)
            else:
                logits = forward(model, xb) if forward is not None else model(xb)
            loss_sum.add_(F.cross_entropy(fp32(logits), yb, reduction="sum"))
            correct.add_((logits.argmax(1) == yb).sum())
    return float(loss_sum) / n, int(correct) / n


def _needs_support(m: nn.Module) -> TypeGuard[EvalSupportModule]:
    return bool(getattr(m, "eval_support_size", 0))


def _support_modules(model: nn.Module) -> list[EvalSupportModule]:
    return [m for m in model.modules() if _needs_support(m)]


def _extractor(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model.features``: the feature extractor the support rows go through."""
    assert isinstance(model, Features)  # the protocol's models are FLModels
    return model.features


def eval_support_size(model: nn.Module) -> int:
    """Rows of training data the model's evaluation needs as support (0: none)."""
    return max((int(m.eval_support_size) for m in _support_modules(model)), default=0)


def set_eval_support(model: nn.Module, x: torch.Tensor | None) -> None:
    """Attach the support rows ``x`` (on the model's device) to every module that needs them; None detaches."""
    for m in _support_modules(model):
        m.set_eval_support(x, _extractor(model) if x is not None else None)


def support_rows(n: int, size: int, seed: Sequence[int]) -> np.ndarray:
    """A fixed, seeded choice of ``size`` of ``n`` rows (sorted; all rows when ``n <= size``)."""
    if n <= size:
        return np.arange(n)
    return np.sort(np.random.default_rng([*map(int, seed), 0x5B0]).choice(n, size, replace=False))


@contextlib.contextmanager
def eval_support(model: nn.Module, x_train: torch.Tensor, seed: Sequence[int]) -> Iterator[None]:
    """Inside the block, the model evaluates against a fixed support set of ``x_train`` (a seeded choice of
    rows, the same every time for the same seed and data), where one of its modules needs it; detached after."""
    size = eval_support_size(model)
    if size == 0:
        yield
        return
    if x_train.shape[0] == 0:
        raise ValueError("this model evaluates against a support set of training data, but there is no training "
                         "data to draw it from")
    rows = torch.as_tensor(support_rows(int(x_train.shape[0]), size, seed), device=x_train.device)
    set_eval_support(model, x_train.index_select(0, rows))
    try:
        yield
    finally:
        set_eval_support(model, None)


def pop_eval_stats(model: nn.Module) -> dict[str, Any]:
    """What the model's modules measured in the evaluations since the last call (e.g. the LRA graph density)."""
    out: dict[str, Any] = {}
    for m in model.modules():
        pop = getattr(m, "pop_eval_stats", None)
        if callable(pop):
            out.update(pop())
    return out
