"""FedDyn (Acar et al., ICLR 2021): dynamic regulariser -<grad_k, w> + alpha/2 ||w - w^t||^2 (paper Alg. 1)."""

from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload
from flcore.schema import Section, param

STATE_GRAD = "feddyn-grad"   # client state: the client's linear-term gradient


@dataclass(frozen=True)
class FedDynConfig(Section):
    NAME = "feddyn"
    alpha: float = param(0.01, "regularisation strength alpha (Alg. 1; the paper tunes {0.1, 0.01, 0.001}; 0.01: "
                               "the authors' code, alpemreacar/FedDyn example_cifar_10.py alpha_coef = 1e-2)",
                         gt=0, old="feddyn-alpha")


METHODS = [MethodDecl("feddyn", "Acar et al., ICLR 2021 (FedDyn)", "strategies.methods.feddyn:FedDynStrategy",
                      "client_app.trainers.feddyn:FedDynTrainer", config=FedDynConfig,
                      payload=Payload(state=(STATE_GRAD,)))]
