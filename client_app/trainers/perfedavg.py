"""Per-FedAvg (Fallah et al., NeurIPS 2020; flcore/methods/perfedavg.py), client side: the MAML local step
(paper Alg. 1, FO or HF) and the one-step personalization evaluated for P-FL."""

from __future__ import annotations

import copy
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from client_app.trainers.base import Trainer
from client_app.training import Forward, TrainStats, default_forward, minibatches
from flcore.methods.perfedavg import PerFedAvgConfig

Batch = tuple[torch.Tensor, torch.Tensor]


def gradients(model: nn.Module, params: list[nn.Parameter], batch: Batch, forward: Forward,
              weight_decay: float = 0.0) -> tuple[list[torch.Tensor], torch.Tensor]:
    """grad of mean CE (+ wd/2 ||w||^2) on ``batch`` at the model's current parameters, and the CE."""
    x, y = batch
    logits, _ = forward(model, x, y)
    loss = F.cross_entropy(logits, y)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    out = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
    if weight_decay:
        out = [g + weight_decay * p.detach() for g, p in zip(out, params)]
    return out, loss.detach()


def _set(params: list[nn.Parameter], values: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, v in zip(params, values):
            p.copy_(v)


def maml_step(model: nn.Module, params: list[nn.Parameter], batches: list[Batch], alpha: float, beta: float,
              variant: str = "fo", delta: float = 1e-3, forward: Forward | None = None,
              weight_decay: float = 0.0) -> torch.Tensor:
    """One Per-FedAvg local step in place on ``params`` (paper Alg. 1): ``batches`` = [D, D'] (fo) or
    [D, D', D''] (hf). Returns the loss at the adapted point w_tmp on D' (what the step minimises)."""
    fwd = forward or default_forward
    need = 2 if variant == "fo" else 3
    if variant not in ("fo", "hf") or len(batches) != need:
        raise ValueError(f"Per-FedAvg variant {variant!r} needs {need} batches, got {len(batches)}")
    w = [p.detach().clone() for p in params]
    g1, _ = gradients(model, params, batches[0], fwd, weight_decay)
    _set(params, [wi - alpha * gi for wi, gi in zip(w, g1)])                 # w_tmp = w - alpha grad f(w; D)
    g, loss = gradients(model, params, batches[1], fwd, weight_decay)         # grad f(w_tmp; D')
    step = g
    if variant == "hf":
        _set(params, [wi + delta * gi for wi, gi in zip(w, g)])
        plus, _ = gradients(model, params, batches[2], fwd, weight_decay)
        _set(params, [wi - delta * gi for wi, gi in zip(w, g)])
        minus, _ = gradients(model, params, batches[2], fwd, weight_decay)
        step = [gi - alpha * (a - b) / (2.0 * delta) for gi, a, b in zip(g, plus, minus)]   # (I - alpha H) g
    _set(params, [wi - beta * si for wi, si in zip(w, step)])
    return loss


def batch_cycle(x: torch.Tensor, y: torch.Tensor, batch_size: int, generator: torch.Generator) -> Iterator[Batch]:
    """Minibatches of seeded shuffles, reshuffled whenever one is used up (the codes' get_next_train_batch)."""
    while True:
        yield from minibatches(x, y, batch_size, generator)


class PerFedAvgTrainer(Trainer):
    def fit(self) -> TrainStats:
        c, opt, d, model = self.cfg.section(PerFedAvgConfig), self.optim_config(), self.job.data, self.job.model
        params = [p for p in model.parameters() if p.requires_grad]
        per_step = 2 if c.variant == "fo" else 3
        batches = -(-d.num_train // opt.batch_size)
        steps = max(1, opt.epochs * batches // per_step)
        if opt.max_steps:
            steps = min(steps, opt.max_steps)
        stream = batch_cycle(d.x_train, d.y_train, opt.batch_size, self.job.generator)
        stats = TrainStats()
        model.train()
        for _ in range(steps):
            group = [next(stream) for _ in range(per_step)]
            loss = maml_step(model, params, group, c.alpha, opt.lr, c.variant, c.delta, self.forward,
                             opt.weight_decay)
            stats.steps += 1
            stats.num_examples += sum(int(b[0].shape[0]) for b in group)
            stats.losses.add(loss)
        return stats

    def personalized(self) -> nn.Module:
        """The received global model after one step w - alpha grad f_i(w; D) on one training minibatch (the
        paper's personalized model; the pFedMe and FedBC codes' train_one_step)."""
        return adapted_copy(self.job.model, self.job.global_params, self.job.data.x_train, self.job.data.y_train,
                            self.optim_config().batch_size, self.cfg.section(PerFedAvgConfig).alpha,
                            torch.Generator().manual_seed(int(self.job.generator.initial_seed()) + 1),
                            self.forward, self.optim_config().weight_decay)


def adapted_copy(model: nn.Module, global_params, x: torch.Tensor, y: torch.Tensor, batch_size: int, alpha: float,
                 generator: torch.Generator, forward: Forward | Callable, weight_decay: float = 0.0) -> nn.Module:
    """A copy of ``model`` holding ``global_params``, moved one step of size alpha on one seeded minibatch."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        for name, t in other.state_dict().items():
            t.copy_(global_params[name])
    other.train()
    params = [p for p in other.parameters() if p.requires_grad]
    batch = next(minibatches(x, y, batch_size, generator))
    g, _ = gradients(other, params, batch, forward, weight_decay)
    _set(params, [p.detach() - alpha * gi for p, gi in zip(params, g)])
    other.eval()
    return other
