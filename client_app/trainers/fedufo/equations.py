"""FedUFO's loss functions and group statistics as pure functions (Zhang et al., ICCV 2021, seed 002).

Notation (paper Sec. 3.1): K clients in the federation, the round's group S_t of K_c clients, client k
trains a prior model w~_k (CE only), receives the priors of the other members, then trains its posterior
model w_k. f^ / y^ are the posterior's features / prediction of x, f~_{.|j} / y~_{.|j} those of the same
x under member j's prior. D is the feature discriminator with K outputs (one per client id l_j).

Everything here works on tensors / arrays only (no Flower, no models) so each equation is unit-tested.
"""

from __future__ import annotations

from typing import Sequence

from flcore.methods.fedufo import CGR_TARGETS, KL_DIRECTIONS

import torch
import torch.nn.functional as F



def uniform_loss(disc_logits: torch.Tensor) -> torch.Tensor:
    """UAD loss, paper Eq. 4: L_uniform = -(1/K) sum_j log d^_j with d^ = softmax(D(f^)).

    ``disc_logits`` is (B, K); the result is the batch mean. By Jensen's inequality
    -(1/K) sum_j log d_j >= -log((1/K) sum_j d_j) = log K, with equality iff d is uniform: the loss is
    minimal (= log K) exactly when the discriminator cannot tell which client a feature comes from.
    """
    if disc_logits.dim() != 2:
        raise ValueError(f"disc_logits must be (batch, K), got shape {tuple(disc_logits.shape)}")
    return -F.log_softmax(disc_logits, dim=1).mean(dim=1).mean()


def discriminator_loss(own_logits: torch.Tensor, own_label: int, other_logits: torch.Tensor,
                       other_labels: Sequence[int]) -> torch.Tensor:
    """Discriminator loss, paper Eq. 5 (batch mean):

        L^d_cls = -log d^^{l_k} - 1/(K_c - 1) sum_{j != k} log d~_{.|j}^{l_j}

    own_logits:   (B, K) D-logits of the posterior's features f^ (class = this client's id l_k);
    other_logits: (J, B, K) D-logits of f~_{.|j}, the same x under the other members' priors, j = 1..J
                  (J = K_c - 1 members that delivered a prior), class = member j's id l_j.
    With no other member (J = 0) only the first term remains.
    """
    if own_logits.dim() != 2:
        raise ValueError(f"own_logits must be (batch, K), got shape {tuple(own_logits.shape)}")
    num_out = own_logits.shape[1]
    labels = [int(own_label), *[int(j) for j in other_labels]]
    bad = [lbl for lbl in labels if not 0 <= lbl < num_out]
    if bad:
        raise ValueError(f"client ids {bad} are outside the discriminator's {num_out} outputs "
                         "(run-config key 'fedufo.num-clients' must exceed every client id)")
    batch = own_logits.shape[0]
    own_target = torch.full((batch,), int(own_label), dtype=torch.long, device=own_logits.device)
    loss = F.cross_entropy(own_logits, own_target)
    num_other = len(other_labels)
    if num_other == 0:
        return loss
    if other_logits.dim() != 3 or other_logits.shape[0] != num_other:
        raise ValueError(f"other_logits must be ({num_other}, batch, K), got {tuple(other_logits.shape)}")
    other_targets = torch.tensor([int(j) for j in other_labels], dtype=torch.long, device=own_logits.device)
    other_targets = other_targets.repeat_interleave(batch)  # row j*B + i belongs to member j
    per_member_sum = F.cross_entropy(other_logits.reshape(num_other * batch, num_out), other_targets,
                                     reduction="sum") / batch
    return loss + per_member_sum / num_other


def group_target(prior_probs: torch.Tensor, proportions: torch.Tensor, mode: str = "softmax") -> torch.Tensor:
    """The group consensus prediction y~ of paper Eq. 7.

    prior_probs: (J, B, C) y~_{.|j} = softmax(h(x | w~_j)) for every member j of the group (own prior
                 included, Eq. 6 runs over 1 <= j <= K_c); proportions: (J, C) the p_j.
    mode "softmax" (default, Eq. 7 as printed): y~ = softmax(sum_j p_j (x) y~_{.|j}). Softmax is monotone, so y~
    ranks the classes as the mixture does, but since the mixture lies in [0, 1] class-probability ratios are
    at most e: with C classes the max probability is at most e/(e + C - 1) (0.23 for C = 10), a soft target.
    mode "normalize" (option): the mixture renormalised to sum 1, a class-proportion mixture of the members'
    predictions. Under a label-skewed split every member's prior votes for its own classes on any x, so this
    target spreads its mass over the group's classes.
    """
    if prior_probs.dim() != 3 or proportions.shape != (prior_probs.shape[0], prior_probs.shape[2]):
        raise ValueError(f"prior_probs (J, B, C) and proportions (J, C) disagree: "
                         f"{tuple(prior_probs.shape)} vs {tuple(proportions.shape)}")
    mix = (proportions.unsqueeze(1).to(prior_probs.dtype) * prior_probs).sum(dim=0)  # (B, C)
    if mode == "softmax":
        return torch.softmax(mix, dim=1)
    if mode == "normalize":
        return mix / mix.sum(dim=1, keepdim=True).clamp_min(1e-12)
    raise ValueError(f"unknown CGR target mode '{mode}'; allowed: {', '.join(CGR_TARGETS)}")


def consensus_kl(logits: torch.Tensor, target: torch.Tensor, direction: str = "posterior-target") -> torch.Tensor:
    """KLDiv(y^ || y~) of paper Eqs. 8 (CGR) and 10 (CGL), batch mean; y^ = softmax(logits).

    direction "posterior-target" (the paper's text): KL(y^ || y~) = sum_c y^_c (log y^_c - log y~_c).
    direction "target-posterior": KL(y~ || y^), what ``nn.KLDivLoss(log_softmax(logits), y~)`` computes
    (the usual distillation form). Targets are treated as constants (no gradient).
    """
    target = target.detach()
    log_p = F.log_softmax(logits, dim=1)
    log_t = torch.log(target.clamp_min(1e-12))
    if direction == "posterior-target":
        return (log_p.exp() * (log_p - log_t)).sum(dim=1).mean()
    if direction == "target-posterior":
        return (target * (log_t - log_p)).sum(dim=1).mean()
    raise ValueError(f"unknown KL direction '{direction}'; allowed: {', '.join(KL_DIRECTIONS)}")
