"""The basic personalized-FL baselines (issue 41): ``local``, Ditto, FedPer, FedBABU and Fed-RoD.

What is personal stays in the client's state (``context.state``, persisted like SCAFFOLD's c_i); the server
keeps and aggregates only what the method shares (docs/methods/pfl-basic.md):

- ``local``: every client trains its own model alone (the P-FL floor); nothing is shared, so the server's
  model stays at its initialisation and G-FL is that of the initial model.
- Ditto (Li et al., ICML 2021, Alg. 1): the global model w is FedAvg's; each sampled client also takes the
  local steps v_k <- v_k - eta (grad F_k(v_k) + lambda (v_k - w^t)) on its personal model v_k (state).
- FedPer (Arivazhagan et al., 2019, Sec. 3): base layers W_B shared and averaged, the last K_P
  (personalization) layers W_P kept by each client (state); both trained locally.
- FedBABU (Oh et al., ICLR 2022, Sec. 4 / Alg. 1): the head stays at its random initialisation during
  federated training; only the body is updated locally and aggregated. P-FL fine-tunes the broadcast model
  on local training data (authors' analysis.ipynb) before the local test.
- Fed-RoD (Chen & Chao, ICLR 2022, Sec. 4): body + generic head trained with the balanced-softmax risk and
  aggregated; a personal head kept by each client (state), trained with the empirical risk on top of the
  generic logits. G-FL: generic head; P-FL: generic + personal head.

The split of a model into parts is by state-dict names (:func:`head_names`, :func:`last_layers`): pure
functions both sides call with the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from flcore.declaration import FEDAVG_STRATEGY, MethodDecl, Payload
from flcore.schema import Section, param

STATE_LOCAL = "local-model"             # client state: the client's own whole model (local)
STATE_DITTO_V = "ditto-v"               # client state: Ditto's personal model v_k
STATE_FEDPER = "fedper-personal"        # client state: FedPer's personalization layers W_P of this client
STATE_FEDROD_HEAD = "fedrod-personal-head"  # client state: Fed-RoD's personal head phi_k (never sent)

HEAD_PREFIX = "head."  # models/base.py FLModel.head: the classifier's state-dict names start with it


def head_names(names: Iterable[str]) -> list[str]:
    """The classifier's entries (FLModel.head) among state-dict ``names``, in order."""
    return [n for n in names if n.startswith(HEAD_PREFIX)]


def layer_of(name: str) -> str:
    """The module a state-dict entry belongs to: ``backbone.3.weight`` -> ``backbone.3``."""
    return name.rsplit(".", 1)[0] if "." in name else ""


def last_layers(names: Sequence[str], k: int) -> list[str]:
    """The entries of the last ``k`` layers (modules holding entries, in state-dict order) among ``names``;
    k = 0: none; k >= the number of layers: all."""
    if k < 0:
        raise ValueError(f"the number of personalization layers must be >= 0, got {k}")
    layers: list[str] = []
    for n in names:
        if layer_of(n) not in layers:
            layers.append(layer_of(n))
    keep = set(layers[len(layers) - k:]) if k else set()
    return [n for n in names if layer_of(n) in keep]


@dataclass(frozen=True)
class DittoConfig(Section):
    NAME = "ditto"
    lam: float = param(1.0, "lambda of h_k(v; w) = F_k(v) + lambda/2 ||v - w^t||^2 (Ditto Sec. 3.1, the Ditto objective; Alg. 1); "
                            "1: the authors' scripts (run_fashion_clean_ditto_lam1.sh --lam=1); 0: v_k is local "
                            "training", ge=0)
    v_init: str = param("initial", "v_k before the client's first participation: initial = the initial model w^0 "
                                   "(authors' trainers_MTL/fedbase.py BaseFedarated.__init__: local_models = copies "
                                   "of it), received = the global model of that round", choices=("initial", "received"))


@dataclass(frozen=True)
class FedPerConfig(Section):
    NAME = "fedper"
    personal_layers: int = param(1, "K_P, the number of personalization layers W_P kept by each client, counted "
                                    "from the output (FedPer Sec. 3: base layers W_B are shared); 1 = the classifier, "
                                    "the split FedBABU's authors run as FedPer (FedBABU scripts/run_fedper.sh "
                                    "--aggr_part body); 0 = every layer shared (FedAvg)", ge=0)


@dataclass(frozen=True)
class FedBABUConfig(Section):
    NAME = "fedbabu"
    update_part: str = param("body", "what local training updates and the server aggregates: body = the head stays "
                                     "at its random init (FedBABU Sec. 4; authors' scripts/run_fedbabu.sh "
                                     "--local_upt_part body --aggr_part body), full = FedAvg's (ablation)",
                             choices=("body", "full"))
    finetune_epochs: int = param(5, "tau_f, epochs of fine-tuning on local training data before the P-FL test "
                                    "(FedBABU Sec. 4 fine-tuning; authors' analysis.ipynb personalization_epoch = "
                                    "5); 0: the broadcast model as is", ge=0)
    finetune_max_steps: int = param(0, "cap on the fine-tuning's SGD steps (0 = none: the paper's tau_f full "
                                       "epochs); for a reduced budget whose local training is step-capped too "
                                       "(max-local-steps), so that the P-FL evaluation does not cost 100x the "
                                       "training it evaluates", ge=0)
    finetune_part: str = param("full", "what the fine-tuning updates: full = body and head (authors' "
                                       "analysis.ipynb, the evaluation of the paper's tables: one SGD over "
                                       "body_params and head_params), head (the abstract's 'the head is "
                                       "fine-tuned'), body",
                               choices=("full", "head", "body"))
    finetune_lr: float = param(1e-3, "step size of the fine-tuning (authors' analysis.ipynb lr = 1e-3)", gt=0)
    finetune_momentum: float = param(0.9, "heavy-ball momentum of the fine-tuning (authors' analysis.ipynb "
                                          "momentum = 0.90)", ge=0, lt=1)


@dataclass(frozen=True)
class FedRoDConfig(Section):
    NAME = "fedrod"
    gamma: float = param(1.0, "exponent of the class counts in the balanced softmax of the generic risk, "
                              "-log(N_y^gamma e^{g_y} / sum_c N_c^gamma e^{g_c}) (Fed-RoD Sec. 4, BSM of Ren et al. "
                              "2020, whose form is gamma = 1); 0: plain cross-entropy", ge=0)


SPLIT = "strategies.methods.pfl_basic"
TRAINERS = "client_app.trainers.pfl_basic"
METHODS = [
    MethodDecl("local", "no paper: the P-FL floor (FedBABU authors' main_local.py)",
               f"{SPLIT}:LocalStrategy", f"{TRAINERS}.split:LocalTrainer",
               payload=Payload(state=(STATE_LOCAL,)),
               description="every client trains its own model alone, never averaged; the server's model stays at its init"),
    MethodDecl("ditto", "Li et al., ICML 2021 (Ditto)", FEDAVG_STRATEGY, f"{TRAINERS}.ditto:DittoTrainer",
               config=DittoConfig, payload=Payload(state=(STATE_DITTO_V,)),
               description="Ditto (Li et al., ICML 2021): FedAvg's global model + a personal v_k pulled towards it by "
                           "lambda/2 ||v - w||^2"),
    MethodDecl("fedper", "Arivazhagan et al., arXiv 2019 (FedPer)", f"{SPLIT}:FedPerStrategy",
               f"{TRAINERS}.split:FedPerTrainer", config=FedPerConfig, payload=Payload(state=(STATE_FEDPER,)),
               description="FedPer (Arivazhagan et al., 2019): shared base layers, personal last K_P layers"),
    MethodDecl("fedbabu", "Oh et al., ICLR 2022 (FedBABU)", f"{SPLIT}:FedBABUStrategy",
               f"{TRAINERS}.fedbabu:FedBABUTrainer", config=FedBABUConfig,
               description="FedBABU (Oh et al., ICLR 2022): body only, head frozen at its init; fine-tuned for P-FL"),
    MethodDecl("fedrod", "Chen & Chao, ICLR 2022 (Fed-RoD)", FEDAVG_STRATEGY, f"{TRAINERS}.fedrod:FedRoDTrainer",
               config=FedRoDConfig, payload=Payload(state=(STATE_FEDROD_HEAD,)),
               description="Fed-RoD (Chen & Chao, ICLR 2022): balanced-softmax generic model + personal head on top "
                           "of the generic logits"),
]
