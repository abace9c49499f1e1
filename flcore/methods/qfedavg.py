"""q-FedAvg (Li et al., ICLR 2020, q-FFL): fairness-weighted aggregation with L = 1/lr (paper Alg. 2)."""

from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload
from flcore.schema import Section, param

LOSS_KEY = "global-model-train-loss"   # reply metric: F_k, the received model's loss on the training split


@dataclass(frozen=True)
class QFedAvgConfig(Section):
    NAME = "qfedavg"
    q: float = param(0.2, "fairness exponent q of q-FFL (Eq. 2; q = 0 is FedAvg's objective). The paper has no "
                          "default: q is tuned per dataset (the authors' code, litian96/fair_flearn main.py "
                          "read_options --q default 0 = FedAvg; its README runs q = 5 on Vehicle). 0.2: our choice, "
                          "Flower's flwr.server.strategy.QFedAvg q_param default", ge=0, old="qfedavg-q")


METHODS = [MethodDecl("qfedavg", "Li et al., ICLR 2020 (q-FFL / q-FedAvg)",
                      "strategies.methods.qfedavg:QFedAvgStrategy",
                      "client_app.trainers.qfedavg:QFedAvgTrainer", config=QFedAvgConfig,
                      payload=Payload(metrics=(LOSS_KEY,)))]
