"""FedBC clients (seed 001): the Lagrangian's local term, FedBC-FineTune and Per-FedBC.

Local problem of Algorithm 1 (Eq. 9/10), solved approximately by E epochs of SGD:
    min_x  f_k(x) + lambda_k (||x - z||^2 - gamma_k)
with z the received global model and lambda_k, gamma_k this client's dual variables, sent by the server
in the message config (keys ``fedbc-lambda`` / ``fedbc-gamma``). No 1/2 in front of the squared norm
(paper, authors' code), so the gradient is grad f_k + 2 lambda_k (x - z): FedProx with mu = 2 lambda_k.

Variants:
- FedBC-FineTune: P-FL is measured on a copy of the local model fine-tuned for ``fedbc.finetune-steps``
  SGD steps on local *training* batches (the paper fine-tunes on a test batch; we do not touch test data).
- Per-FedBC (Appendix E.4, Algorithm 3): first-order MAML. Per local step: K inner steps
  x' = x - alpha grad[f_k(x; B1) + lambda_k(||x - z||^2 - gamma_k)], then the outer step
  x <- x - beta grad f_k(x'; B2) (second-order terms dropped), beta = run-config ``lr``. P-FL is the
  received global (meta) model adapted by ``fedbc.finetune-steps`` steps on local training data.
"""

from __future__ import annotations

import copy
import math
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from client_app.trainers.base import Trainer, TrainJob
from client_app.training import LossTerm, OptimConfig, Step, TrainStats, evaluate, local_train, minibatches
from flcore.methods.fedbc import GAMMA_KEY, LAMBDA_KEY, LOCAL_ACC, SQ_DIST, fedbc_config


def dual_variables(job: TrainJob) -> tuple[float, float]:
    """(lambda_k, gamma_k) from this client's message config; a missing or bad value is an error."""
    values = []
    for key in (LAMBDA_KEY, GAMMA_KEY):
        if key not in job.config:
            raise ValueError(f"client {job.cid}: FedBC message config lacks '{key}' (is the server running a "
                             f"FedBC strategy?)")
        v = float(job.config[key])
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"client {job.cid}: FedBC '{key}' must be finite and >= 0, got {v}")
        values.append(v)
    return values[0], values[1]


def squared_distance(model: nn.Module, anchor: dict[str, torch.Tensor]) -> torch.Tensor:
    """||x - z||^2 over the model's parameters (differentiable in x)."""
    total = None
    for name, p in model.named_parameters():
        term = (p - anchor[name]).pow(2).sum()
        total = term if total is None else total + term
    if total is None:
        raise ValueError("model has no parameters")
    return total


class LagrangianPenalty(LossTerm):
    """lambda_k (||x - z||^2 - gamma_k): the constraint part of the local Lagrangian (Eq. 8/9)."""

    def __init__(self, anchor: dict[str, torch.Tensor], lam: float, gamma: float) -> None:
        self.anchor = {k: v.detach() for k, v in anchor.items()}
        self.lam = float(lam)
        self.gamma = float(gamma)

    def value(self, model: nn.Module) -> torch.Tensor | None:
        if self.lam == 0.0:
            return None  # the term and its gradient are exactly zero
        return self.lam * (squared_distance(model, self.anchor) - self.gamma)

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        return self.value(model)


class FirstOrderMAML(LossTerm):
    """Per-FedBC's local step (Algorithm 3, first order) expressed as hooks of the one loop.

    The loop's minibatch is the outer batch B2 and its optimizer does the outer step with lr beta.
    before_step: remember x, then take K inner SGD steps (lr alpha) on f_k + penalty with fresh batches B1
                 drawn from this client's training data;
    (loop)       forward/backward of f_k(x'; B2) at the adapted x';
    on_gradients: put x back, keeping grad f_k(x'; B2) in .grad, so the optimizer applies it to x.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, inner_lr: float, inner_steps: int,
                 penalty: LagrangianPenalty, generator: torch.Generator | None, forward) -> None:
        self.x, self.y, self.batch_size = x, y, batch_size
        self.inner_lr, self.inner_steps = inner_lr, inner_steps
        self.penalty, self.generator, self.forward = penalty, generator, forward
        self._batches: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(())
        self._saved: list[torch.Tensor] = []

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return next(self._batches)
        except StopIteration:
            self._batches = minibatches(self.x, self.y, self.batch_size, self.generator)
            return next(self._batches)

    def before_step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        self._saved = [p.detach().clone() for p in params]
        for _ in range(self.inner_steps):
            xb, yb = self._next_batch()
            logits, _ = self.forward(model, xb, yb)
            loss = F.cross_entropy(logits, yb)
            extra = self.penalty.value(model)
            if extra is not None:
                loss = loss + extra
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    if g is not None:
                        p.add_(g, alpha=-self.inner_lr)

    def on_gradients(self, model: nn.Module) -> None:
        params = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            for p, saved in zip(params, self._saved):
                p.copy_(saved)


def fine_tuned(model: nn.Module, job: TrainJob, steps: int, lr: float, forward) -> nn.Module:
    """A copy of ``model`` after ``steps`` plain-CE SGD steps on local training batches (the one loop)."""
    tuned = copy.deepcopy(model)
    if steps == 0:
        return tuned
    d = job.data
    per_epoch = max(1, math.ceil(d.num_train / job.cfg.batch_size))
    cfg = OptimConfig(lr=lr, epochs=math.ceil(steps / per_epoch), batch_size=job.cfg.batch_size, max_steps=steps)
    local_train(tuned, d.x_train, d.y_train, cfg, (), generator=job.generator, forward=forward)
    return tuned


class FedBCTrainer(Trainer):
    """FedBC client: local SGD on f_k(x) + lambda_k (||x - z||^2 - gamma_k); reports ||x_k - z||^2."""

    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        self.hp = fedbc_config(job.cfg)
        self.lam, self.gamma = dual_variables(job)
        self.penalty = LagrangianPenalty(self.anchor(), self.lam, self.gamma)

    def anchor(self) -> dict[str, torch.Tensor]:
        """z restricted to the model's parameters, on the model's device."""
        names = [n for n, _ in self.job.model.named_parameters()]
        missing = [n for n in names if n not in self.job.global_params]
        if missing:
            raise ValueError(f"client {self.job.cid}: global parameters lack {missing[:3]}")
        dev = next(self.job.model.parameters()).device
        return {n: self.job.global_params[n].detach().to(dev) for n in names}

    def terms(self) -> list[LossTerm]:
        return [self.penalty]

    def extra_metrics(self, stats: TrainStats) -> dict[str, float | int]:
        """||x_k - z||^2, the duals used, and the local model x_k's accuracy on the local test split
        (equal to ``local-accuracy`` for FedBC; the un-adapted reference for the two variants). Without a
        local test split (local-test-fraction = 0) that accuracy is not reported (the server logs None)."""
        d = self.job.data
        with torch.no_grad():
            dist = float(squared_distance(self.job.model, self.penalty.anchor))
        out: dict[str, float | int] = {SQ_DIST: dist, LAMBDA_KEY: self.lam, GAMMA_KEY: self.gamma}
        if d.x_test.shape[0] > 0:
            out[LOCAL_ACC] = evaluate(self.job.model, d.x_test, d.y_test)[1]
        return out


class FedBCFineTuneTrainer(FedBCTrainer):
    """FedBC-FineTune: P-FL on the local model fine-tuned a few steps on local training data."""

    def personalized(self) -> nn.Module:
        return fine_tuned(self.job.model, self.job, self.hp.finetune_steps, self.hp.finetune_lr, self.forward)


class PerFedBCTrainer(FedBCTrainer):
    """Per-FedBC (Algorithm 3): first-order MAML local steps with the Lagrangian penalty in the inner step."""

    def terms(self) -> list[LossTerm]:
        d = self.job.data
        return [FirstOrderMAML(d.x_train, d.y_train, self.cfg.batch_size, self.hp.maml_inner_lr,
                               self.hp.maml_inner_steps, self.penalty, self.job.generator, self.forward)]

    def personalized(self) -> nn.Module:
        """The received global (meta) model, adapted on local training data."""
        meta = copy.deepcopy(self.job.model)
        meta.load_state_dict(self.job.global_params)
        return fine_tuned(meta, self.job, self.hp.finetune_steps, self.hp.finetune_lr, self.forward)
