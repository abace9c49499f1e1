"""pFedMe (T. Dinh, Tran and Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020):
each client keeps a personalized model theta_i, the proximal point of its loss around its copy w of the global
model; the server moves the global model part of the way (beta) to the average of the clients' w.

Bi-level problem (paper Eq. 2-3): min_w (1/N) sum_i F_i(w),  F_i(w) = min_theta f_i(theta) + lambda/2
||theta - w||^2 (the Moreau envelope; theta_i(w) its minimiser). Client i, local rounds r = 0 .. R-1, each on a
minibatch D_r (paper Alg. 1, authors' code FLAlgorithms/users/userpFedMe.py: UserpFedMe.train):
    K steps  theta <- theta - eta_p (grad f_i(theta; D_r) + lambda (theta - w_r) [+ mu theta])  (~ theta_i(w_r))
             w_{r+1} = w_r - eta lambda (w_r - theta)                                           (paper Eq. 8)
then it sends w_R. Server (paper Alg. 1, serverbase.py: persionalized_aggregate_parameters):
    x_{t+1} = (1 - beta) x_t + beta sum_{i in S_t} p_i w_{i,R},   p_i = n_i / sum_{j in S_t} n_j
(the paper's 1/S for its equal clients; beta = 1 is FedAvg's aggregation). theta starts at the received model
each round (the code's UserpFedMe.set_parameters copies x_t into both; ``pfedme.theta-init = personal`` starts
from the client's stored theta_i instead) and is kept as the client's personal model: client state
``pfedme-theta``, evaluated for P-FL as the paper and the code do (evaluate_personalized_model tests theta).
The common keys map as: eta = ``lr``, one local round per minibatch of ``batch-size`` (the FedBC authors' run
of pFedMe, models/Update.py: train_pfedme, loops epochs x batches; the pFedMe code draws one batch per
"local epoch"), R capped by ``max-local-steps``; ``weight-decay`` is the code's mu on theta (pFedMeOptimizer's
mu = 0.001 default, absent from the paper); the recipe sets momentum 0 (the updates above are plain steps).

Deviation from Alg. 1: the paper lets every client compute its update and samples afterwards which ones send;
here only the sampled clients train (fraction-train = 1 is the paper's full participation).
"""

from dataclasses import dataclass

from flcore.common import CommonConfig
from flcore.declaration import MethodDecl, Payload, own_backward
from flcore.schema import ConfigError, Section, param

STATE_THETA = "pfedme-theta"   # client state: this client's personalized model theta_i (its trainable parameters)


@dataclass(frozen=True)
class PFedMeConfig(Section):
    NAME = "pfedme"
    lamda: float = param(15.0, "lambda of the Moreau envelope f_i(theta) + lambda/2 ||theta - w||^2 (paper Eq. 3); "
                               "15: the authors' main.py --lamda default, the value of their README's MNIST "
                               "commands", gt=0)
    k_steps: int = param(5, "K, gradient steps approximating theta_i(w) per local round (paper Alg. 1); 5: the "
                            "authors' main.py --K default", ge=1)
    personal_lr: float = param(0.09, "eta_p, step size of the K inner steps on theta (paper Alg. 1); 0.09: the "
                                     "authors' main.py --personal_learning_rate default and README's MNIST DNN "
                                     "command (0.1 for their convex MCLR)", gt=0)
    beta: float = param(1.0, "beta of the server's x <- (1 - beta) x + beta mean(w_i) (paper Alg. 1); 1: the authors' "
                             "main.py --beta default (FedAvg's aggregation)", gt=0)
    theta_init: str = param("global", "where theta starts each round: global = the received model (the authors' "
                                      "userbase.py set_parameters), personal = the client's stored theta_i",
                            choices=("global", "personal"))

    def check_run(self, common: Section) -> None:
        """pFedMe's steps are plain gradient steps: a local momentum would be silently unused."""
        assert isinstance(common, CommonConfig)  # the run config (flcore.config.RunConfig._check_run)
        if common.momentum != 0.0:
            raise ConfigError(f"method pfedme takes plain gradient steps (paper Alg. 1): run-config key 'momentum' "
                              f"must be 0, got {common.momentum}")
        if common.lr * self.lamda >= 2.0:
            raise ConfigError(f"pfedme: lr * pfedme.lamda = {common.lr * self.lamda:g} >= 2 makes the local step "
                              "w <- w - lr lambda (w - theta) overshoot and diverge: lower 'lr' or 'pfedme.lamda'")


METHODS = own_backward([MethodDecl("pfedme", "T. Dinh, Tran and Nguyen, NeurIPS 2020 (pFedMe: Moreau envelopes)",
                      "strategies.methods.pfedme:PFedMeStrategy", "client_app.trainers.pfedme:PFedMeTrainer",
                      config=PFedMeConfig, payload=Payload(state=(STATE_THETA,)),
                      recipe={"momentum": 0.0, "weight-decay": 0.001},
                      recipe_sources={"momentum": "pFedMe Alg. 1: plain gradient steps on theta and w",
                                      "weight-decay": "the authors' FLAlgorithms/optimizers/fedoptimizer.py: "
                                                      "pFedMeOptimizer mu = 0.001 (the L2 on theta of every inner "
                                                      "step; userpFedMe.py constructs it without mu)"})])
