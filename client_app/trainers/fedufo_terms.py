"""FedUFO's loss terms for the one local loop (paper Eqs. 4-12): the prior-feature bank, L_uniform (UAD),
the discriminator step on L^d_cls, CGR against the group consensus and CGL against the global model.

Each term wraps a pure function of client_app/trainers/ufo_losses.py; the trainer (fedufo.py) assembles
them per stage. The discriminator module itself is model construction (models/extras.py).
"""

from __future__ import annotations

import torch
from torch import nn

from client_app.trainers.ufo_losses import consensus_kl, discriminator_loss, group_target, uniform_loss
from client_app.training import LossTerm, OptimConfig, Step
from flcore.methods.fedufo import DISC_PREFIX

def model_only_params(model: nn.Module) -> list[nn.Parameter]:
    return [p for n, p in model.named_parameters() if not n.startswith(DISC_PREFIX)]


def set_trainable(module: nn.Module, flag: bool) -> None:
    for p in module.parameters():
        p.requires_grad_(flag)


# ===================================================================================== loss terms
class PriorBank(LossTerm):
    """Per minibatch, the frozen priors' (logits, features) of the same x, computed once for all terms.

    models[:num_others] are the other members' priors (for D and CGR), an optional last one is this
    client's own prior (for CGR only: Eq. 7 sums over every member of the group).
    """

    def __init__(self, models: list[nn.Module], num_others: int) -> None:
        self.models = models
        self.num_others = num_others
        self.logits: torch.Tensor | None = None    # (J, B, C)
        self.features: torch.Tensor | None = None  # (J, B, d)

    @torch.no_grad()
    def before_step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        if not self.models:
            return
        outs = [m.forward_features(x) for m in self.models]
        self.logits = torch.stack([o[0] for o in outs])
        self.features = torch.stack([o[1] for o in outs])


class _Meter(LossTerm):
    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def record(self, value: torch.Tensor | float) -> None:
        self.total += float(value)
        self.count += 1

    @property
    def mean(self) -> float:
        return self.total / max(self.count, 1)


class UniformTerm(_Meter):
    """UAD loss (Eq. 4) on the posterior's features through the (frozen) discriminator."""

    def __init__(self, disc: nn.Module) -> None:
        super().__init__()
        self.disc = disc

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor:
        value = uniform_loss(self.disc(step.features))
        self.record(value.detach())
        return value


class DiscriminatorTerm(_Meter):
    """After each model step, one SGD step of D on L^d_cls (Eq. 5) with the model frozen.

    Own features f^ are the step's (detached) posterior features, class l_k = this client's id; the
    other members' features f~_{.|j} of the same x come from the :class:`PriorBank`, class l_j.
    """

    def __init__(self, disc: nn.Module, own_label: int, other_labels: list[int], bank: PriorBank,
                 optim: OptimConfig) -> None:
        super().__init__()
        self.disc, self.own_label, self.other_labels, self.bank, self.optim = disc, own_label, other_labels, bank, optim
        self.correct = 0
        self.seen = 0

    def begin(self, model: nn.Module) -> None:
        self.opt = torch.optim.SGD(self.disc.parameters(), lr=self.optim.lr, momentum=self.optim.momentum,
                                   weight_decay=self.optim.weight_decay)

    def after_step(self, model: nn.Module, step: Step) -> None:
        own = step.features.detach()
        num_other = len(self.other_labels)
        set_trainable(self.disc, True)
        try:
            own_logits = self.disc(own)
            if num_other:
                feats = self.bank.features[:num_other]  # type: ignore[index]
                other_logits = self.disc(feats.reshape(-1, feats.shape[-1])).reshape(num_other, own.shape[0], -1)
            else:
                other_logits = own_logits.new_zeros((0, own.shape[0], own_logits.shape[1]))
            loss = discriminator_loss(own_logits, self.own_label, other_logits, self.other_labels)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        finally:
            set_trainable(self.disc, False)
        self.record(loss.detach())
        self.correct += int((own_logits.detach().argmax(1) == self.own_label).sum())
        self.seen += int(own.shape[0])


class CGRTerm(_Meter):
    """Group consensus loss (Eq. 8): KL(y^ || y~) with y~ the class-proportion mixture of Eq. 7."""

    def __init__(self, bank: PriorBank, proportions: torch.Tensor, mode: str, direction: str) -> None:
        super().__init__()
        self.bank, self.proportions, self.mode, self.direction = bank, proportions, mode, direction

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor:
        probs = torch.softmax(self.bank.logits, dim=2)  # type: ignore[arg-type]
        value = consensus_kl(step.logits, group_target(probs, self.proportions, self.mode), self.direction)
        self.record(value.detach())
        return value


class CGLTerm(_Meter):
    """Global consensus loss (Eq. 10), weighted by lambda (Eq. 12): KL(y^ || softmax(h(x | theta_t)))."""

    def __init__(self, global_model: nn.Module, weight: float, direction: str) -> None:
        super().__init__()
        self.global_model, self.weight, self.direction = global_model, weight, direction

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor:
        with torch.no_grad():
            target = torch.softmax(self.global_model(step.x), dim=1)
        value = consensus_kl(step.logits, target, self.direction)
        self.record(value.detach())
        return self.weight * value

