"""FedCM (Xu, Wang, Wang and Yao, "FedCM: Federated Learning with Client-level Momentum", arXiv 2106.10874,
2021): every local step moves along a mix of the client's stochastic gradient and the server's last global
update direction Delta_t, a momentum held by the server and broadcast with the model (paper Alg. 1).

    client i (from y_0 = x_t):  v_k = alpha g_i(y_k) + (1 - alpha) Delta_t,   y_{k+1} = y_k - eta_l v_k
    server:                     Delta_{t+1} = sum_{i in S_t} p_i (x_t - y_{i,K_i}) / (eta_l K_i)
                                x_{t+1}     = x_t + eta_g sum_{i in S_t} p_i (y_{i,K_i} - x_t)
Delta_0 = 0; alpha = 1 is FedAvg (with server step size eta_g). Delta is a gradient-scale quantity: the mean
model change divided by eta_l times the client's local step count, so (1 - alpha) Delta_t stands in for the
gradient the other clients would see. Our choices, where the paper's setting (equal clients, uniform 1/|S_t|,
plain SGD) is silent: p_i = n_i / sum n (FedAvg's weights, uniform for equal clients), each client's own
K_i (its reported ``local-steps``), and under heavy-ball momentum beta (torch SGD, buffer reset every round;
the recipe sets 0, the paper's plain step) K_i is replaced by S(K_i, beta), the gradient-lengths K_i momentum
steps travel (as SCAFFOLD's option II, client_app/trainers/scaffold.py). Weight decay, if set, is added to
v_k by the optimizer. Delta costs a second model's worth per client each round, down (FedBR's Table 7 lists
FedCM at twice FedAvg's parameters); the reply is FedAvg's.

What was read: the paper's abstract only (its text could not be opened here); the algorithm above is the
paper's Alg. 1 as we know it, cross-checked (never copied) against a port that cites it: RickZack/GHBM
src/algo/fed_clients/fedcm_client.py (FedCMClient._before_opt_step: g <- alpha g + (1 - alpha) m / (lr K)),
src/algo/center_server/fedcm_center_server.py (the server keeps the last pseudo-gradient) and
config/algo/fedcm.yaml (alpha 0.1). The authors published no code we could find.
"""

from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload
from flcore.schema import Section, param

DELTA = "fedcm-delta"      # server -> client record: the global momentum Delta_t (gradient scale, per parameter)


@dataclass(frozen=True)
class FedCMConfig(Section):
    NAME = "fedcm"
    alpha: float = param(0.1, "weight of the local gradient in v = alpha g + (1 - alpha) Delta_t (FedCM Alg. 1); "
                              "0.1: the paper's experiments (Sec. 5, as cross-checked in the GHBM port's "
                              "config/algo/fedcm.yaml); 1 = FedAvg", gt=0, le=1)
    server_lr: float = param(1.0, "global step size eta_g in x_{t+1} = x_t + eta_g mean(y_i - x_t) (FedCM Alg. 1; "
                                  "1: plain averaging, as the paper's experiments)", gt=0)


METHODS = [MethodDecl("fedcm", "Xu, Wang, Wang and Yao, arXiv 2021 (FedCM: client-level momentum)",
                      "strategies.methods.fedcm:FedCMStrategy", "client_app.trainers.fedcm:FedCMTrainer",
                      config=FedCMConfig, payload=Payload(records=(DELTA,)),
                      recipe={"momentum": 0.0},
                      recipe_sources={"momentum": "FedCM Alg. 1: the local step y <- y - eta_l v is plain SGD "
                                                  "(v is the momentum; no heavy-ball buffer)"})]
