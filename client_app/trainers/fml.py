"""FML (Shen et al., arXiv 2006.16765; flcore/methods/fml.py), client side: the meme model (the received global
model) and the client's local model trained together by deep mutual learning on the same minibatches
(authors' src/Trainer.py:train_mutual); the local model persists in the client state, P-FL evaluates it."""

from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from client_app.trainers.base import Trainer, TrainJob
from client_app.trainers.pfl_basic.split import load_entries, state_entries
from client_app.training import Forward, LossTerm, Step, TrainStats, local_train, make_optimizer
from flcore.methods.fml import STATE_FML_LOCAL, FMLConfig
from models import build_model


def kl_to(target_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(p_target || p) averaged over the batch (``batchmean``), p = softmax(logits), the target detached:
    (1/B) sum_b sum_c p_t (log p_t - log p) (authors' KL_Loss(LogSoftmax(out), Softmax(other.detach())))."""
    return F.kl_div(F.log_softmax(logits, dim=1), F.softmax(target_logits.detach(), dim=1), reduction="batchmean")


def mutual_loss(logits: torch.Tensor, other_logits: torch.Tensor, y: torch.Tensor, weight: float) -> torch.Tensor:
    """weight CE(logits, y) + (1 - weight) KL(p_other || p): FML's L_local (weight alpha, other = the meme) and
    L_meme (weight beta, other = the local model) (FML Sec. 3, Eqs. 1-2)."""
    return weight * F.cross_entropy(logits, y) + (1.0 - weight) * kl_to(other_logits, logits)


def scaled_ce(weight: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The meme's data term beta CE (the plain criterion at beta = 1, so that FML's meme is FedAvg's bit for bit)."""
    if weight == 1.0:
        return F.cross_entropy
    return lambda logits, y: weight * F.cross_entropy(logits, y)


class MutualTerm(LossTerm):
    """Trains the local model on each minibatch of the meme's loop (alpha CE + (1 - alpha) KL(p_meme || p_local))
    and adds the meme's (1 - beta) KL(p_local || p_meme); both from the forwards before either step."""

    def __init__(self, local: nn.Module, optimizer: torch.optim.Optimizer, alpha: float, beta: float,
                 forward: Forward) -> None:
        self.local, self.opt, self.alpha, self.beta, self.forward = local, optimizer, alpha, beta, forward

    def begin(self, model: nn.Module) -> None:
        self.local.train()

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        local_logits, _ = self.forward(self.local, step.x, step.y)
        self.opt.zero_grad(set_to_none=True)
        mutual_loss(local_logits, step.logits, step.y, self.alpha).backward()
        self.opt.step()                    # the local step reads the meme's detached output only: the order is free
        if self.beta == 1.0:
            return None
        return (1.0 - self.beta) * kl_to(local_logits, step.logits)


class FMLTrainer(Trainer):
    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        self.hp = job.cfg.section(FMLConfig)
        self.local: nn.Module | None = None

    def initial_local(self) -> nn.Module:
        """l_k before this round: the stored one, or the initial global model w^0 at the first participation."""
        job = self.job
        local = copy.deepcopy(job.model)
        stored = job.state.get_arrays(STATE_FML_LOCAL)
        if stored is not None:
            load_entries(local, stored, list(local.state_dict()), f"client {job.cid}: client state '{STATE_FML_LOCAL}'")
        else:
            with torch.random.fork_rng(devices=[]):  # build_model seeds the global RNG: leave it as it was
                w0 = build_model(self.cfg, tuple(job.data.x_train.shape[1:]), job.data.num_classes)
            local.load_state_dict(w0.state_dict())
        return local

    def fit(self) -> TrainStats:
        d, opt = self.job.data, self.optim_config()
        local = self.initial_local()
        local_opt = make_optimizer([p for p in local.parameters() if p.requires_grad], opt)
        term = MutualTerm(local, local_opt, self.hp.alpha, self.hp.beta, self.forward)
        stats = local_train(self.job.model, d.x_train, d.y_train, opt, [term], generator=self.job.generator,
                            forward=self.forward, criterion=scaled_ce(self.hp.beta))
        self.job.state.put_arrays(STATE_FML_LOCAL, state_entries(local, list(local.state_dict())))
        self.local = local
        return stats

    def personalized(self) -> nn.Module:
        if self.local is None:
            raise RuntimeError(f"client {self.job.cid}: FML's personalized() called before fit()")
        return self.local
