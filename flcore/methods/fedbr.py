"""FedBR (seed 003): local learning bias reduction with pseudo-data (RSM / Mixture, Eq. 4) and a projection
head trained by a max step on L_con and a min step CE + lambda CE_pseudo + mu L_con (Eqs. 3, 5, 6)."""

from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload
from flcore.schema import Section, param

PSEUDO_KINDS = ("mixture", "rsm")
REFRESH = ("once", "round")
WEIGHTINGS = ("uniform", "samples")
PAIRINGS = ("index", "all-pairs", "mean")
PROXY_KINDS = ("smooth-noise", "white-noise")
GLOBAL_FEATURES = ("step", "round")
STATE_KEY = "fedbr-rsm"   # client state: the RSM pseudo set built at the client's first round
# reply metrics (means over the round's local steps unless said otherwise), averaged by the server every round:
CON_BEFORE_MAX = "fedbr-max-con-loss"  # L_con at the max step's start (theta^{k-1}, phi^{k-1})
CON_AFTER_MAX = "fedbr-con-loss"       # L_con after the max step, the min step's term (theta^k, phi^{k-1})
CON_END = "fedbr-con-end"              # L_con of the round's final theta, phi on the last batch
SIM_GLOBAL = "fedbr-sim-global"        # cos(P phi_i(x_p), P phi_g(x_p)) in the min step (f1's similarity)
SIM_REAL = "fedbr-sim-real"            # cos(P phi_i(x_p), P phi_i(x)) in the min step (f2's similarity)
PSEUDO_CE = "fedbr-pseudo-ce"          # CE_soft of the pseudo batch (component 1)
METRICS = (CON_BEFORE_MAX, CON_AFTER_MAX, CON_END, SIM_GLOBAL, SIM_REAL, PSEUDO_CE)


@dataclass(frozen=True)
class FedBRConfig(Section):
    NAME = "fedbr"
    mu: float = param(0.5, "weight of L_con in the min step, Eq. 3 (authors' code 0.5)", ge=0, old="fedbr-mu")
    lambda_: float = param(1.0, "weight of the pseudo-data classification loss, Eq. 3 (authors' code 1.0)",
                           ge=0, old="fedbr-lambda")
    tau1: float = param(0.5, "temperature of f1, Eq. 5 (authors' code: sim x 2, i.e. 0.5)", gt=0, old="fedbr-tau1")
    tau2: float = param(0.5, "temperature of f2, Eq. 6", gt=0, old="fedbr-tau2")
    pseudo: str = param("mixture", "pseudo-data: mixture (Eq. 4, the authors' default) or rsm (random sample "
                                   "mean, label 1/C)", choices=PSEUDO_KINDS, old="fedbr-pseudo")
    pseudo_size: int = param(32, "|D_p| (paper: the batch size, 32)", gt=0, old="fedbr-pseudo-size")
    rsm_size: int = param(10, "local samples one RSM sample averages (authors' code 10)", gt=0,
                          old="fedbr-rsm-size")
    mixture_k: int = param(1, "K in Eq. 4: local samples mixed into each proxy sample, redrawn every step",
                           ge=0, old="fedbr-mixture-k")
    pseudo_refresh: str = param("once", "'transfer once' (Fig. 6b) or rebuilt every round", choices=REFRESH,
                                old="fedbr-pseudo-refresh")
    proxy: str = param("smooth-noise", "the shared proxy set of Mixture", choices=PROXY_KINDS, old="fedbr-proxy")
    pairing: str = param("index", "which real feature a pseudo sample meets in f2", choices=PAIRINGS,
                         old="fedbr-pairing")
    classifier_debias: bool = param(True, "component 1: the pseudo-data classification term",
                                    old="fedbr-classifier-debias")
    feature_debias: bool = param(True, "component 2: the L_con term of the min step (with the max step)",
                                 old="fedbr-feature-debias")
    max_step: bool = param(True, "run the max step (Table 4 'w/o max step' = false)", old="fedbr-max-step")
    mixup: bool = param(False, "'FedBR + Mixup': mixup on the real batch", old="fedbr-mixup")
    mixup_alpha: float = param(0.2, "mixup lam ~ Beta(alpha, alpha)", gt=0, old="fedbr-mixup-alpha")
    proj_lr: float = param(0.0, "learning rate of the max step (0: the run's lr, as the authors' code)", ge=0,
                           old="fedbr-proj-lr")
    global_features: str = param("step", "phi_g(x_p) in f1 (Eq. 5): of this step's pseudo batch (step), or of the "
                                         "round's first pseudo batch reused all round, as the authors' code caches "
                                         "it (round; differs only when Mixture redraws x_p)",
                                 choices=GLOBAL_FEATURES)
    max_momentum: float = param(0.0, "momentum of the max step's SGD on theta (authors' code: plain SGD with the "
                                     "run's weight decay; the min step uses the run's optimizer)", ge=0, lt=1)
    weighting: str = param("uniform", "server averaging: uniform (Alg. 1 lines 13-15) or n_k-weighted",
                           choices=WEIGHTINGS, old="fedbr-weighting")

    @property
    def uses_pseudo(self) -> bool:
        return self.classifier_debias or self.feature_debias

    @property
    def runs_max_step(self) -> bool:
        return self.feature_debias and self.max_step


METHODS = [MethodDecl(
    "fedbr", "FedBR: local learning bias reduction (Guo, Tang and Lin, ICML 2023)",
    "strategies.methods.fedbr:FedBRStrategy",
    "client_app.trainers.fedbr.trainer:FedBRTrainer", config=FedBRConfig,
    model_hook="models.extras:add_fedbr_projection",
    payload=Payload(metrics=METRICS, state=(STATE_KEY,)))]
