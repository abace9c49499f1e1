"""FedProx (Li et al., MLSys 2020): local objective F_k(w) + mu/2 ||w - w^t||^2 (paper Eq. 2)."""

from dataclasses import dataclass

from flcore.declaration import MethodDecl
from flcore.schema import Section, param


@dataclass(frozen=True)
class FedProxConfig(Section):
    NAME = "fedprox"
    mu: float = param(0.01, "mu of the proximal term mu/2 ||w - w^t||^2 (FedProx Eq. 2). The paper has no "
                            "default: it tunes mu per dataset from {0.001, 0.01, 0.1, 1}, and the authors' README "
                            "(litian96/FedProx) says there is no default mu that works for all settings (tune from "
                            "{0.001, 0.01, 0.1, 0.5, 1}); 0.01 is our choice from that grid", ge=0,
                      old="proximal-mu")


METHODS = [MethodDecl("fedprox", "Li et al., MLSys 2020 (FedProx)", "strategies.methods.fedavg:FedAvgStrategy",
                      "client_app.trainers.fedprox:FedProxTrainer", config=FedProxConfig)]
