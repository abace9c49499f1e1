"""APPLE (Luo & Wu, "Adapt to Adaptation: Learning Personalization for Cross-Silo Federated Learning", IJCAI 2022,
arXiv 2110.08394; authors' code ljaiverson/pFL-APPLE): each client i trains its own "core model" w_c^(i) and a
directed-relationship (DR) vector p_i over every client's core model; its personalized model is

    w_p^(i) = sum_j p_ij w_c^(j)                                 (the authors' utils/models.py: ClientNet.compress;
                                                                  ClientNet.superBlock computes the same layer-wise)
and client i minimises, on its data, over its own core w_c^(i) and p_i (the other cores fixed, requires_grad
False in utils/apple.py: prepare_client_model):

    CE(f(x; w_p^(i)), y) + lambda(r) ||p_i - p_0||^2,   p_0[j] = n_j / sum_k n_k    (utils/losses.py: reg_loss;
                                                                                     utils/apple.py: init_pss)
with the proximal coefficient lambda(r) of round r = 0, 1, ... (utils/losses.py: get_reg_coef), R_d = int(R x
reg-fraction): exponential mu 0.001^(r / R_d), cosine mu (cos(pi r / R_d) + 1) / 2, both for r < R_d, 0 after
(the paper's "flexibly control the focus between global and local objectives": p_0 is the FedAvg-like mixture).
p_i starts at p_0 (init_pss). The gradient w.r.t. the own core is p_ii grad_w CE, w.r.t. p_ij it is
<grad_w CE, w_c^(j)>; one SGD with two parameter groups (train_APPLE.py: train_one_round): the core at ``lr``,
p at ``apple.p-lr``, both with momentum 0.9 there (``apple.p-momentum``; the core's is the common ``momentum``).

The downloads go through the server (the paper's Fig. 1 workflow: clients upload their core, download the
others'): the server keeps every registered client's latest core (a never-trained client's is the initial
model, the authors' "same set of initial core models on every client"), sends client i its own core as the
message's model and every other client's core as records ``apple-core.<j>``, plus ``apple-group`` (the client
ids and their sample counts, for p_0). Bandwidth: K models per client per round downstream (the model + K - 1
relayed cores; FedAvg: 1), one model upstream. The P-FL model is w_p^(i) (val_with_local_model evaluates the
client's ClientNet). p_i is client state ``apple-p``; the own core lives on the server (it is relayed anyway).

What the server's model is: the sample-weighted mean of the round's updated cores (FedAvg over cores). APPLE
itself has no global model (FedRANE reports APPLE in its P-FL Table 2 only); G-FL of this mean is not APPLE's.

Differences from the authors' code: (1) every core starts from the one initial model (their cores are separate
random inits that every client downloads in round 0: equivalent up to the seed); (2) the limited-bandwidth mode
(--limit_downloaded_models, default 10000 = download all) is not offered: every core is relayed; (3) their lr
decay per round (--decay, default 1.0 = none) is not offered; (4) clients not sampled keep their core and p_i
(the authors run every client every round: fraction-train = 1, the cross-silo setting). Buffers (BatchNorm
statistics) are the own core's (the authors' Net has none). Only the abstract and introduction of the paper
could be read here; the equations above are the authors' code's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload
from flcore.schema import Section, param

CORE_PREFIX = "apple-core."     # server -> client record prefix, + client id: another client's core model w_c^(j)
GROUP = "apple-group"           # server -> client record: "cids" (every relayed client, sorted) and "samples" (n_j)
STATE_P = "apple-p"             # client state: this client's DR vector p_i ("p") over the client ids ("cids")
P_SELF = "apple-p-self"         # reply metric: p_ii after local training (how much the client relies on itself)


def reg_coef(mu: float, r: int, num_rounds: int, fraction: float, scheduler: str) -> float:
    """lambda(r) of round r = 0, 1, ... (the authors' utils/losses.py: get_reg_coef): R_d = int(R x fraction);
    0 when mu = 0 or r >= R_d; exponential mu 0.001^(r / R_d); cosine mu (cos(pi r / R_d) + 1) / 2."""
    if mu == 0:
        return 0.0
    dynamic = int(num_rounds * fraction)
    if r >= dynamic:
        return 0.0
    if scheduler == "cosine":
        return (math.cos(math.pi * r / dynamic) + 1.0) / 2.0 * mu
    if scheduler == "exponential":
        return (0.001 ** (r / dynamic)) * mu
    raise ValueError(f"apple.scheduler must be 'exponential' or 'cosine', got {scheduler!r}")


def initial_p(samples: list[int]) -> list[float]:
    """p_0: every client's share of the samples, n_j / sum_k n_k (the authors' utils/apple.py: init_pss)."""
    total = float(sum(samples))
    if total <= 0:
        raise ValueError(f"APPLE's p_0 needs a positive total of samples, got {samples}")
    return [n / total for n in samples]


@dataclass(frozen=True)
class AppleConfig(Section):
    NAME = "apple"
    p_lr: float = param(0.001, "step size of the DR vector p_i (the authors' utils/utils.py create_parser "
                               "--lr_coef = 0.001; the README's CIFAR-10 command); 0: p_i stays at its init", ge=0)
    p_momentum: float = param(0.9, "heavy-ball momentum of p_i's SGD (the authors' train_APPLE.py train_one_round: "
                                   "one optim.SGD(..., momentum=0.9) over the cores and ps)", ge=0, lt=1)
    mu: float = param(0.1, "mu, the scale of the proximal term lambda(r) ||p_i - p_0||^2 (the authors' "
                           "create_parser --mu = 0.1; utils/losses.py reg_loss); 0: no proximal term", ge=0)
    reg_fraction: float = param(0.1, "R_d / R, the fraction of the rounds with lambda(r) > 0 (the authors' "
                                     "create_parser --reg_last_round_over_total_round = 0.1)", ge=0, le=1)
    scheduler: str = param("exponential", "the shape of lambda(r) (the authors' create_parser --scheduler = "
                                          "exponential; utils/losses.py get_reg_coef)",
                           choices=("exponential", "cosine"))


METHODS = [MethodDecl("apple", "Luo & Wu, IJCAI 2022 (APPLE: Adapt to Adaptation)",
                      "strategies.methods.apple:AppleStrategy", "client_app.trainers.apple:AppleTrainer",
                      config=AppleConfig,
                      payload=Payload(records=(CORE_PREFIX, GROUP), metrics=(P_SELF,), state=(STATE_P,)),
                      description="APPLE (Luo & Wu, IJCAI 2022): personalized model sum_j p_ij w_c^(j) over every "
                                  "client's core model (relayed by the server); learned p_i, proximal to p_0")]
