"""Neural-collapse FL (seed 004): a fixed simplex-ETF classifier (head='etf', usable with any method) and
global memory vectors mu_c = (1/|S_t|) sum over the sampled clients of their class means, added to the
features as h = f + alpha mu_y from round R_warm on; the backbone is averaged uniformly (paper Alg. 1).
Every default is Alg. 1's (docs/methods/fedetf.md: the algorithm line by line against the code)."""

from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload
from flcore.schema import Section, param

GMV_WEIGHTINGS = ("sampled", "clients", "samples")
AGGREGATIONS = ("uniform", "samples")
GMV_FEATURES = ("final", "train")
ACTIVE_KEY = "fedetf-gmv-active"      # config: train on h = f + alpha*mu_y this round
REPORT_KEY = "fedetf-report-means"    # config: report class means + counts this round
MEMORY_RECORD = "etf-memory"          # ArrayRecord {"mu": (C, d) float32, "valid": (C,) bool}
MEANS_RECORD = "class-means"          # ArrayRecord {"means": (C, d) float32, "counts": (C,) int64}


@dataclass(frozen=True)
class FedETFConfig(Section):
    NAME = "fedetf"
    alpha: float = param(0.5, "alpha in h = f + alpha mu_y (Alg. 1; Table 3 tries 0.1, 0.5, 1.0, Sec. 5.3.3 "
                              "suggests [0.5, 1]; 0.5 gives Table 1's C10-100-5 figure)", ge=0, old="fedetf-alpha")
    warmup_fraction: float = param(0.9, "R_warm / R: memory vectors are used from round round(fraction R) on "
                                        "(Table 1's C10-100-2 and C10-100-5 figures use R_warm = 900 of 1000 "
                                        "rounds, Table 3; Sec. 5.3.3: the warm-up should be long)", ge=0, le=1,
                                   old="fedetf-warmup-fraction")
    gmv_weighting: str = param("sampled", "mu_c = (1/|S_t|) sum over the round's clients of their class-c means, "
                                          "a client without class c adding 0 (sampled: Alg. 1, replaced every "
                                          "round); the mean over the clients holding c (clients) or count-"
                                          "weighted (samples), both keeping mu_c of an unseen class",
                               choices=GMV_WEIGHTINGS, old="fedetf-gmv-weighting")
    gmv_features: str = param("train", "features the class means are taken of: train (Alg. 1: the f_{i,k}^t of the "
                                       "training forward passes, detached, of the last local epoch; the mu_j^t "
                                       "line averages the f computed in the minibatch loop) or final (our option: "
                                       "one no-grad eval-mode pass of the returned local model over the client's "
                                       "training data; the default before issue 40)", choices=GMV_FEATURES,
                               old="fedetf-gmv-features")
    aggregation: str = param("uniform", "backbone averaging: the plain mean of the round's models (uniform: Alg. 1, "
                                        "theta = (1/K) sum_k theta_k) or n_k-weighted (samples)",
                             choices=AGGREGATIONS)


PAPER = "Huang et al., Neural Collapse Inspired FL with Non-iid Data (fixed ETF classifier + memory vectors)"
PAYLOAD = Payload(config=(ACTIVE_KEY, REPORT_KEY), records=(MEMORY_RECORD,), reply_records=(MEANS_RECORD,),
                  metrics=("gmv-active",))
STRATEGY = "strategies.methods.fedetf:FedETFStrategy"
TRAINER = "client_app.trainers.fedetf:ETFTrainer"
METHODS = [
    MethodDecl("fedetf", PAPER, STRATEGY, TRAINER, config=FedETFConfig, head="etf", payload=PAYLOAD),
    MethodDecl("fedgmv", PAPER, STRATEGY, TRAINER, config=FedETFConfig, payload=PAYLOAD,
               description="ablation '+GMV': memory vectors with the run config's head"),
]
