"""FedAvgM (Hsu, Qi and Brown, arXiv 1909.06335, 2019): FedAvg with server momentum on the averaged update.

With the pseudo-gradient Delta_t = w_t - sum_k (n_k / n) w_k^{t+1} the server keeps v_t = beta v_{t-1} + Delta_t
(v_0 = 0) and sets w_{t+1} = w_t - eta_s v_t; beta = 0 and eta_s = 1 is FedAvg. The clients run FedAvg's local
SGD. The paper's rule is heavy-ball momentum with no server learning rate (eta_s = 1); Flower's FedAvgM has the
same rule with ``server_learning_rate``; FL-bench's ``FedAvgMServer`` takes a Nesterov step instead (not offered:
not the paper's rule). docs/methods/fedavgm.md has the equations and every default's source.
"""

from dataclasses import dataclass

from flcore.declaration import BASE_TRAINER, MethodDecl
from flcore.schema import Section, param


@dataclass(frozen=True)
class FedAvgMConfig(Section):
    NAME = "fedavgm"
    server_momentum: float = param(
        0.9, "server momentum beta in v_t = beta v_{t-1} + Delta_t (Hsu et al., Sec. 3; only the paper's abstract "
             "could be read). 0.9: the value Flower's reproduction of the paper's Fig. 5 runs (adap/flower baselines/"
             "fedavgm/fedavgm/conf/base.yaml, server.momentum) and FL-bench's default (KarhouTam/FL-bench "
             "src/server/fedavgm.py, FedAvgMServer.get_hyperparams); Flower's FedAvgM class defaults to 0.0, "
             "which is FedAvg", ge=0, lt=1)
    server_lr: float = param(
        1.0, "server learning rate eta_s in w_{t+1} = w_t - eta_s v_t. 1.0: Flower's default (flwr serverapp/"
             "strategy/fedavgm.py, FedAvgM.__init__ server_learning_rate) and its paper reproduction's (base.yaml, "
             "server.learning_rate); the step is then w - v, the paper's form (Sec. 3)", gt=0)


METHODS = [MethodDecl("fedavgm", "Hsu et al., arXiv 2019 (FedAvgM)", "strategies.methods.fedavgm:FedAvgMStrategy",
                      BASE_TRAINER, config=FedAvgMConfig)]
