"""Fed-RoD (Chen & Chao, ICLR 2022), client side (Sec. 4).

Two predictors on one body z = f(x; theta):
    generic       g = h_G(z; psi)                       (the model's head; aggregated with the body: FedAvg)
    personalized  g + h_P(z; phi_k)                     (phi_k: this client's personal head, its state)
One local SGD pass minimises, per minibatch,
    L_BSM(theta, psi)  = -log( N_y^gamma e^{g_y} / sum_c N_c^gamma e^{g_c} )       (balanced risk, N_c the
                                                                                 client's class counts)
    + L_CE(phi_k)       = CE(sg[g] + h_P(sg[z]; phi_k), y)                          (empirical risk)
with sg = stop-gradient: the balanced risk alone trains the body and the generic head (the generic model's
objective is the same on every client), the empirical risk trains only the personal head, on top of the
generic logits (Sec. 4: "a lightweight adaptive module learned to minimize each client's empirical risk on
top of the generic predictor"). The authors published no code (hongyouc/Fed-RoD holds a README only), so the
stop-gradients are our reading of the paper, stated in docs/methods/pfl-basic.md. h_P is a linear layer like
the generic head, zero at first participation (our choice: the personalized predictor starts as the generic
one). G-FL evaluates the server's model (generic head); P-FL the client's g + h_P.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from client_app.trainers.base import Trainer, TrainJob
from client_app.training import LossTerm, Step, TrainStats, local_train
from flcore.methods.pfl_basic import STATE_FEDROD_HEAD, FedRoDConfig
from models.base import FLModel


def balanced_softmax_loss(logits: torch.Tensor, y: torch.Tensor, counts: torch.Tensor, gamma: float) -> torch.Tensor:
    """Mean over the batch of -log( N_y^gamma e^{g_y} / sum_c N_c^gamma e^{g_c} ): cross-entropy of
    g + gamma log N (a class the client lacks, N_c = 0, gets no probability mass when gamma > 0)."""
    if gamma == 0:
        return F.cross_entropy(logits, y)
    counts = counts.to(device=logits.device, dtype=logits.dtype)
    shift = torch.where(counts > 0, gamma * torch.log(counts.clamp_min(1)), torch.full_like(counts, -torch.inf))
    return F.cross_entropy(logits + shift, y)


class PersonalHeadTerm(LossTerm):
    """CE(sg[g] + h_P(sg[neck(z)]), y): trains the personal head only."""

    def __init__(self, head: nn.Module) -> None:
        self.head = head

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor:
        assert isinstance(model, FLModel)
        personal = self.head(model.neck(step.features.detach()))
        return F.cross_entropy(step.logits.detach() + personal, step.y)


class GenericPlusPersonal(nn.Module):
    """Fed-RoD's personalized predictor: the generic logits plus the personal head's."""

    def __init__(self, model: FLModel, head: nn.Module) -> None:
        super().__init__()
        self.model, self.head = model, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits, z = self.model.forward_features(x)
        return logits + self.head(self.model.neck(z))


class FedRoDTrainer(Trainer):
    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        self.gamma = job.cfg.section(FedRoDConfig).gamma
        self.head = self.personal_head()

    def personal_head(self) -> nn.Linear:
        """phi_k from the client state, or zero at the first participation."""
        model, job = self.job.model, self.job
        device = next(model.parameters()).device
        head = nn.Linear(int(model.feature_dim), int(model.num_classes)).to(device)
        stored = job.state.get_arrays(STATE_FEDROD_HEAD)
        with torch.no_grad():
            if stored is None:
                head.weight.zero_()
                head.bias.zero_()
            else:
                if set(stored) != {"weight", "bias"}:
                    raise KeyError(f"client {job.cid}: client state '{STATE_FEDROD_HEAD}' holds {sorted(stored)}, "
                                   "expected weight and bias")
                head.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in stored.items()})
        return head

    def fit(self) -> TrainStats:
        d, model = self.job.data, self.job.model
        counts = torch.bincount(d.y_train, minlength=d.num_classes)

        def criterion(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return balanced_softmax_loss(logits, y, counts, self.gamma)

        params = [p for p in model.parameters() if p.requires_grad] + list(self.head.parameters())
        stats = local_train(model, d.x_train, d.y_train, self.optim_config(), [PersonalHeadTerm(self.head)],
                            generator=self.job.generator, forward=self.forward, criterion=criterion, params=params)
        self.job.state.put_arrays(STATE_FEDROD_HEAD, OrderedDict(
            (k, v.detach().cpu().numpy().copy()) for k, v in self.head.state_dict().items()))
        return stats

    def personalized(self) -> nn.Module:
        return GenericPlusPersonal(self.job.model, self.head)
