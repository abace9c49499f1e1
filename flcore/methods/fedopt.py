"""FedAdam / FedYogi (Reddi et al., ICLR 2021, Adaptive Federated Optimization, Alg. 2)."""

from dataclasses import dataclass

from flcore.declaration import BASE_TRAINER, MethodDecl
from flcore.schema import Section, param


@dataclass(frozen=True)
class FedOptConfig(Section):
    NAME = "fedopt"
    eta: float = param(0.01, "server learning rate eta (Alg. 2). The paper tunes eta per task on a log grid (no "
                             "default); 0.01: our choice, Flower's FedYogi default (flwr serverapp/strategy/"
                             "fedyogi.py FedYogi.__init__)", gt=0, old="fedopt-eta")
    tau: float = param(0.001, "adaptivity tau (Alg. 2). Tuned per task in the paper (no default); 1e-3: our choice, "
                              "Flower's FedYogi default", gt=0, old="fedopt-tau")
    beta1: float = param(0.9, "first-moment decay beta_1 (Alg. 2; 0.9 in the paper's experiments)", ge=0, lt=1,
                         old="fedopt-beta1")
    beta2: float = param(0.99, "second-moment decay beta_2 (Alg. 2; 0.99 in the paper's experiments)", ge=0, lt=1,
                         old="fedopt-beta2")
    bias_correction: bool = param(False, "Adam-style bias correction of the moments (not in Alg. 2)",
                                  old="fedopt-bias-correction")


PAPER = "Reddi et al., ICLR 2021 (Adaptive Federated Optimization)"
METHODS = [MethodDecl("fedadam", PAPER, "strategies.methods.fedopt:FedAdamStrategy", BASE_TRAINER, config=FedOptConfig),
           MethodDecl("fedyogi", PAPER, "strategies.methods.fedopt:FedYogiStrategy", BASE_TRAINER, config=FedOptConfig)]
