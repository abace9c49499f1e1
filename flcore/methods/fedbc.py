"""FedBC (seed 001): federated learning beyond consensus. Client k minimises f_k(x) + lambda_k(||x - z||^2 -
gamma_k); the server takes dual steps on lambda_k (Eq. 11) and gamma_k and averages by lambda (paper Alg. 1)."""

from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload
from flcore.schema import ConfigError, Section, param

LAMBDA_KEY = "fedbc-lambda"   # per-client config (server -> client) and reply metric: lambda_k
GAMMA_KEY = "fedbc-gamma"     # likewise gamma_k
SQ_DIST = "fedbc-sq-dist"     # reply metric: ||x_k - z||^2
LOCAL_ACC = "fedbc-local-model-accuracy"   # reply metric: the local model on its local test split (if any)


@dataclass(frozen=True)
class FedBCConfig(Section):
    NAME = "fedbc"
    lambda_init: float = param(0.0, "lambda_k^0; the paper states none, its authors' code starts at 0 "
                                    "(torch.zeros), so round 1 is FedAvg's local problem", ge=0,
                               old="fedbc-lambda-init")
    gamma_init: float = param(0.0, "gamma_k^0 (paper, 'Selection of gamma': initialised at 0; authors' code "
                                   "zeros); the constant gamma with fix-gamma", ge=0, old="fedbc-gamma-init")
    eta_lambda: float = param(0.001, "dual step size eta_lambda of Eq. 11; the paper tunes it on a grid (App. "
                                     "E.2), its authors' jobs use 1e-3 (synthetic, Table 1) and 5e-4 (CIFAR-10)",
                              ge=0, old="fedbc-eta-lambda")
    eta_gamma: float = param(0.001, "step size of the gamma heuristic (paper App. E.2: set equal to eta_lambda; "
                                    "authors' code: one optimizer for both)", ge=0, old="fedbc-eta-gamma")
    lambda_momentum: float = param(0.5, "heavy-ball momentum of the lambda/gamma steps (authors' code, "
                                        "--lamb_momentum 0.5; the paper states none)", ge=0, lt=1,
                                   old="fedbc-lambda-momentum")
    lambda_max: float = param(0.0, "upper end of the projection [0, lambda_max] of Eq. 11 (0: no bound, as "
                                   "the authors' code)", ge=0, old="fedbc-lambda-max")
    fix_gamma: bool = param(False, "keep gamma_k = gamma-init for ever (authors' --fix_gamma)",
                            old="fedbc-fix-gamma")
    finetune_steps: int = param(1, "SGD steps of the P-FL fine-tuning (FedBC-FineTune, Per-FedBC)", ge=0,
                                old="fedbc-finetune-steps")
    finetune_lr: float = param(0.01, "step size of that fine-tuning (authors' inner_lr)", gt=0,
                               old="fedbc-finetune-lr")
    maml_inner_steps: int = param(1, "K inner steps per Per-FedBC step (Alg. 3; authors' K = 1)", ge=1,
                                  old="fedbc-maml-inner-steps")
    maml_inner_lr: float = param(0.01, "alpha of the Per-FedBC inner step (outer beta = lr)", gt=0,
                                 old="fedbc-maml-inner-lr")

    def check(self) -> None:
        if self.lambda_max > 0 and self.lambda_init > self.lambda_max:
            raise ConfigError(f"run-config key 'fedbc.lambda-init' ({self.lambda_init}) must not exceed "
                              f"'fedbc.lambda-max' ({self.lambda_max})")

    @property
    def upper(self) -> float | None:
        return self.lambda_max if self.lambda_max > 0 else None


PAPER = "FedBC: calibrating global and local models via FL beyond consensus"
STRATEGY = "strategies.methods.fedbc.strategy:FedBCStrategy"
PAYLOAD = Payload(config=(LAMBDA_KEY, GAMMA_KEY), metrics=(SQ_DIST, LAMBDA_KEY, GAMMA_KEY, LOCAL_ACC))
METHODS = [
    MethodDecl("fedbc", PAPER, STRATEGY, "client_app.trainers.fedbc:FedBCTrainer", config=FedBCConfig,
               payload=PAYLOAD),
    MethodDecl("fedbc-finetune", PAPER, STRATEGY, "client_app.trainers.fedbc:FedBCFineTuneTrainer",
               config=FedBCConfig, payload=PAYLOAD, description="FedBC-FineTune: fine-tuned local model for P-FL"),
    MethodDecl("per-fedbc", PAPER, STRATEGY, "client_app.trainers.fedbc:PerFedBCTrainer", config=FedBCConfig,
               payload=PAYLOAD, description="Per-FedBC: first-order MAML local step (Alg. 3)"),
    MethodDecl("fedbc-uniform", PAPER, "strategies.methods.fedbc.strategy:FedBCUniformStrategy",
               "client_app.trainers.fedbc:FedBCTrainer", config=FedBCConfig, payload=PAYLOAD,
               description="control: FedBC's local objective and dual steps, unweighted mean of the models"),
]
