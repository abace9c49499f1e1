"""FedUFO's loss terms for the one local loop (paper Eqs. 4-12): the prior-feature bank, L_uniform (UAD),
the discriminator step on L^d_cls, CGR against the group consensus and CGL against the global model.

Each term wraps a pure function of client_app/trainers/fedufo/equations.py; the trainer (trainer.py) assembles
them per stage. The discriminator module itself is model construction (models/extras.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from client_app.trainers.fedufo.equations import consensus_kl, discriminator_loss, group_target, uniform_loss
from client_app.training import LossTerm, OptimConfig, Step, forward_features, minibatches
from flcore.methods.fedufo import DISC_PREFIX

def model_only_params(model: nn.Module) -> list[nn.Parameter]:
    return [p for n, p in model.named_parameters() if not n.startswith(DISC_PREFIX)]


def set_trainable(module: nn.Module, flag: bool) -> None:
    for p in module.parameters():
        p.requires_grad_(flag)


class LiveOutputs:
    """D's outputs that enter Eqs. 4-5: those of the registered clients (the paper's K is the number of clients;
    an output no client holds would never be a label, and Eq. 4 would push the model to raise it anyway).

    ``ids``: the registered client ids (sorted, each below D's ``num_outputs``); client id -> logit column.
    With every output registered, logits pass through unchanged.
    """

    def __init__(self, ids: list[int], num_outputs: int, device: torch.device) -> None:
        ids = [int(c) for c in ids]
        if not ids or ids != sorted(set(ids)) or not all(0 <= c < num_outputs for c in ids):
            raise ValueError(f"registered client ids {ids[:8]} must be sorted, distinct and below the "
                             f"discriminator's {num_outputs} outputs (run-config key 'fedufo.num-clients')")
        self.ids = ids
        self.everything = ids == list(range(num_outputs))
        self.index = torch.tensor(ids, dtype=torch.long, device=device)
        self.position = {c: i for i, c in enumerate(ids)}

    def logits(self, disc_logits: torch.Tensor) -> torch.Tensor:
        return disc_logits if self.everything else disc_logits.index_select(1, self.index)

    def column(self, cid: int) -> int:
        if cid not in self.position:
            raise ValueError(f"client {cid} is not among the registered clients {self.ids[:8]}... the server sent")
        return self.position[cid]


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
        outs = [forward_features(m, x) for m in self.models]
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


class CrossEntropyMeter(_Meter):
    """Records L_cls (the cross-entropy of Eqs. 11-12) of every model step, to set against the other terms."""

    def after_step(self, model: nn.Module, step: Step) -> None:
        self.record(F.cross_entropy(step.logits.detach(), step.y))


class UniformTerm(_Meter):
    """UAD loss (Eq. 4) on the posterior's features through the (frozen) discriminator."""

    def __init__(self, disc: nn.Module, outputs: LiveOutputs) -> None:
        super().__init__()
        self.disc, self.outputs = disc, outputs

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor:
        value = uniform_loss(self.outputs.logits(self.disc(step.features)))
        self.record(value.detach())
        return value


class _DiscriminatorUpdates(_Meter):
    """SGD on D with L^d_cls (Eq. 5), the model frozen: own features f^ have class l_k = this client's id,
    the other members' features f~_{.|j} of the same x have class l_j (over the live outputs). Counts D's
    accuracy on f^ (measured before each step) in ``correct`` / ``seen``."""

    def __init__(self, disc: nn.Module, own_label: int, other_labels: list[int], optim: OptimConfig,
                 outputs: LiveOutputs) -> None:
        super().__init__()
        self.disc, self.own_label, self.other_labels, self.optim = disc, own_label, list(other_labels), optim
        self.outputs = outputs
        self.columns = [outputs.column(c) for c in [own_label, *self.other_labels]]
        self.correct = 0
        self.seen = 0
        self.steps = 0
        self.opt: torch.optim.Optimizer | None = None

    def _new_optimizer(self) -> None:
        self.opt = torch.optim.SGD(self.disc.parameters(), lr=self.optim.lr, momentum=self.optim.momentum,
                                   weight_decay=self.optim.weight_decay)

    def _step(self, own: torch.Tensor, others: torch.Tensor | None) -> None:
        """One D step on own features (B, d) and the other members' features (J, B, d) of the same x."""
        num_other = len(self.other_labels)
        set_trainable(self.disc, True)
        try:
            own_logits = self.outputs.logits(self.disc(own))
            if num_other:
                assert others is not None and others.shape[0] == num_other
                flat = self.outputs.logits(self.disc(others.reshape(-1, others.shape[-1])))
                other_logits = flat.reshape(num_other, own.shape[0], -1)
            else:
                other_logits = own_logits.new_zeros((0, own.shape[0], own_logits.shape[1]))
            loss = discriminator_loss(own_logits, self.columns[0], other_logits, self.columns[1:])
            assert self.opt is not None
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        finally:
            set_trainable(self.disc, False)
        self.record(loss.detach())
        self.correct += int((own_logits.detach().argmax(1) == self.columns[0]).sum())
        self.seen += int(own.shape[0])
        self.steps += 1

    @property
    def own_accuracy(self) -> float:
        return self.correct / max(self.seen, 1)


class DiscriminatorTerm(_DiscriminatorUpdates):
    """``fedufo.disc-schedule = "alternating"``: after each model step, one D step on that step's (detached)
    posterior features and the :class:`PriorBank`'s features of the same x."""

    def __init__(self, disc: nn.Module, own_label: int, other_labels: list[int], bank: PriorBank,
                 optim: OptimConfig, outputs: LiveOutputs) -> None:
        super().__init__(disc, own_label, other_labels, optim, outputs)
        self.bank = bank

    def begin(self, model: nn.Module) -> None:
        self._new_optimizer()

    def after_step(self, model: nn.Module, step: Step) -> None:
        feats = self.bank.features
        self._step(step.features.detach(), feats[: len(self.other_labels)] if feats is not None else None)


class DiscriminatorPhase(_DiscriminatorUpdates):
    """``fedufo.disc-schedule = "paper"`` (Sec. 3.4): after the model's local epochs, the model fixed, D trains
    for ``optim.epochs`` epochs over the local data on the features of the trained posterior and of the other
    members' priors (all frozen, computed per minibatch)."""

    def __init__(self, disc: nn.Module, own_label: int, other_labels: list[int], priors: list[nn.Module],
                 optim: OptimConfig, outputs: LiveOutputs) -> None:
        super().__init__(disc, own_label, other_labels, optim, outputs)
        if len(priors) != len(self.other_labels):
            raise ValueError(f"{len(priors)} prior model(s) for {len(self.other_labels)} other member(s)")
        self.priors = priors

    def run(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator | None) -> None:
        self._new_optimizer()
        was_training = model.training
        model.eval()
        try:
            for _ in range(self.optim.epochs):
                for xb, _yb in minibatches(x, y, self.optim.batch_size, generator):
                    with torch.no_grad():
                        own = forward_features(model, xb)[1]
                        others = (torch.stack([forward_features(m, xb)[1] for m in self.priors])
                                  if self.priors else None)
                    self._step(own, others)
                    if self.optim.max_steps and self.steps >= self.optim.max_steps:
                        return
        finally:
            model.train(was_training)


class CGRTerm(_Meter):
    """Group consensus loss (Eq. 8): KL(y^ || y~) with y~ the class-proportion mixture of Eq. 7. Also keeps
    the target's mean max-probability and entropy (how sharp the group consensus is)."""

    def __init__(self, bank: PriorBank, proportions: torch.Tensor, mode: str, direction: str) -> None:
        super().__init__()
        self.bank, self.proportions, self.mode, self.direction = bank, proportions, mode, direction
        self.target_max_prob = _Meter()
        self.target_entropy = _Meter()

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor:
        probs = torch.softmax(self.bank.logits, dim=2)  # type: ignore[arg-type]
        target = group_target(probs, self.proportions, self.mode)
        value = consensus_kl(step.logits, target, self.direction)
        self.record(value.detach())
        self.target_max_prob.record(target.max(dim=1).values.mean())
        self.target_entropy.record(-(target * target.clamp_min(1e-12).log()).sum(dim=1).mean())
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

