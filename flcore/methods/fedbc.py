"""FedBC (seed 001): federated learning beyond consensus. Client k minimises f_k(x) + lambda_k(||x - z||^2 -
gamma_k); the server takes dual steps on lambda_k (Eq. 11) and gamma_k and averages by lambda (paper Alg. 1).

``fedbc-code`` is the authors' published code (chenfan95/FedBC, "official implementation" per its README) as far
as our keys express it: its dual step (one torch SGD over the whole [lambda, gamma] vectors, main_fed.py
__main__), its local optimizer (the recipe below) and its initial values. docs/methods/fedbc.md lists every
default with its source and every difference between the paper's text and the code.
"""

import dataclasses
from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload, own_backward
from flcore.schema import ConfigError, KeySpec, Section, Sectioned, param

LAMBDA_KEY = "fedbc-lambda"   # per-client config (server -> client) and reply metric: lambda_k
GAMMA_KEY = "fedbc-gamma"     # likewise gamma_k
SQ_DIST = "fedbc-sq-dist"     # reply metric: ||x_k - z||^2
LOCAL_ACC = "fedbc-local-model-accuracy"   # reply metric: the local model on its local test split (if any)
DUAL_STEPS = ("per-client", "code")
CODE = "chenfan95/FedBC "


@dataclass(frozen=True)
class FedBCConfig(Section):
    NAME = "fedbc"
    lambda_init: float = param(0.0, "lambda_k^0; the paper states none (silent), its authors' code starts at 0 "
                                    "(main_fed.py __main__: torch.zeros), so round 1 is FedAvg's local problem",
                               ge=0, old="fedbc-lambda-init")
    gamma_init: float = param(0.0, "gamma_k^0 (paper Sec. 5, 'Selection of gamma': initialised at 0; authors' code "
                                   "main_fed.py __main__: torch.zeros); the constant gamma with fix-gamma", ge=0,
                              old="fedbc-gamma-init")
    eta_lambda: float = param(0.001, "dual step size eta_lambda of Eq. 11; the paper tunes it on a grid whose digits "
                                     "our copy lost (App. E.2), its authors' jobs use 1e-3 (synthetic_jobs.sh "
                                     "--lamb_lr, Table 1) and 5e-4 (CIFAR-10)", ge=0, old="fedbc-eta-lambda")
    eta_gamma: float = param(0.001, "step size of the gamma heuristic (paper App. E.2: 'set equal to eta_lambda', "
                                    "so set both when tuning; authors' code: one optimizer, one lr, for both)",
                             ge=0, old="fedbc-eta-gamma")
    lambda_momentum: float = param(0.5, "heavy-ball momentum of the lambda/gamma steps: the paper's setup 'momentum "
                                        "0.5 for lambda' (as the project's method specification restates it; the "
                                        "digits are lost in our copy) and the authors' --lamb_momentum 0.5 "
                                        "(utils/options.py)", ge=0, lt=1,
                                   old="fedbc-lambda-momentum")
    dual_step: str = param("per-client", "'per-client': Eq. 11 per client, each multiplier with its own momentum "
                                         "buffer, moved only when its client returns an update (the paper's text); "
                                         "'code': the authors' one torch.optim.SGD(momentum) over the whole "
                                         "[lambda, gamma] vectors of all devices, stepped after each returned "
                                         "client, so every buffer keeps moving its multiplier "
                                         "(main_fed.py __main__, 'Update lamb (dual ascent)')", choices=DUAL_STEPS)
    lambda_max: float = param(0.0, "upper end of the projection [0, lambda_max] of Eq. 11 (the paper derives it "
                                   "only in the analysis; 0: no bound, as the authors' code: lamb.clamp_(min=0))",
                              ge=0, old="fedbc-lambda-max")
    fix_gamma: bool = param(False, "keep gamma_k = gamma-init for ever (authors' --fix_gamma; the paper's "
                                   "default is the gamma heuristic)", old="fedbc-fix-gamma")
    finetune_steps: int = param(1, "SGD steps of the P-FL fine-tuning (FedBC-FineTune, Per-FedBC; paper App. E.2: "
                                   "one step, authors' evaluate_local.train_one_step)", ge=0,
                                old="fedbc-finetune-steps")
    finetune_lr: float = param(0.01, "step size of that fine-tuning (authors' --inner_lr 0.01)", gt=0,
                               old="fedbc-finetune-lr")
    maml_inner_steps: int = param(1, "K inner steps per Per-FedBC step (Alg. 3; authors' --K 1)", ge=1,
                                  old="fedbc-maml-inner-steps")
    maml_inner_lr: float = param(0.01, "alpha of the Per-FedBC inner step (outer beta = lr; authors' --inner_lr "
                                       "0.01)", gt=0, old="fedbc-maml-inner-lr")

    def check(self) -> None:
        if self.lambda_max > 0 and self.lambda_init > self.lambda_max:
            raise ConfigError(f"run-config key '{self.NAME}.lambda-init' ({self.lambda_init}) must not exceed "
                              f"'{self.NAME}.lambda-max' ({self.lambda_max})")

    @property
    def upper(self) -> float | None:
        return self.lambda_max if self.lambda_max > 0 else None


@dataclass(frozen=True)
class FedBCCodeConfig(FedBCConfig):
    """FedBC as its authors' code runs it (chenfan95/FedBC main_fed.py, models/Update.py, utils/options.py,
    synthetic_jobs.sh): every key of ``fedbc.*`` under ``fedbc-code.*``, the defaults that differ set to the
    code's values, each doc naming the file and function. The common keys of the code's local optimizer are the
    method's recipe (lr, momentum, weight decay, batch, epochs: see METHODS below)."""

    NAME = "fedbc-code"

    @classmethod
    def specs(cls) -> list[KeySpec]:
        """The keys as declared, without the flat names of before sectioning (those name ``fedbc.*`` keys)."""
        return [dataclasses.replace(s, old=None) for s in super().specs()]

    dual_step: str = param("code", "one torch.optim.SGD([lamb, gamma], lr=lamb_lr, momentum=lamb_momentum) over "
                                   "all devices, stepped after each client (gradient of (||x_k - z||^2 - gamma_k) "
                                   "lambda_k, lambda's negated), then lamb.clamp_(min=0): " + CODE
                           + "main_fed.py __main__", choices=DUAL_STEPS)
    eta_lambda: float = param(0.001, "--lamb_lr 1e-3: " + CODE + "synthetic_jobs.sh (FedBC line), utils/options.py",
                              ge=0)
    eta_gamma: float = param(0.001, "gamma shares lamb's optimizer, so its lr is --lamb_lr 1e-3: " + CODE
                             + "main_fed.py __main__ (opt_lamb)", ge=0)
    lambda_momentum: float = param(0.5, "--lamb_momentum 0.5: " + CODE + "utils/options.py args_parser", ge=0, lt=1)


def fedbc_config(cfg: Sectioned) -> FedBCConfig:
    """The FedBC section a run reads: its method's (``fedbc-code.*`` for fedbc-code), else ``fedbc.*``."""
    own = cfg.method_section
    return own if isinstance(own, FedBCConfig) else cfg.section(FedBCConfig)


PAPER = "FedBC: calibrating global and local models via FL beyond consensus"
STRATEGY = "strategies.methods.fedbc.strategy:FedBCStrategy"
TRAINER = "client_app.trainers.fedbc:FedBCTrainer"
PAYLOAD = Payload(config=(LAMBDA_KEY, GAMMA_KEY), metrics=(SQ_DIST, LAMBDA_KEY, GAMMA_KEY, LOCAL_ACC))
CODE_RECIPE = {"lr": 0.01, "momentum": 0.5, "weight-decay": 0.0, "batch-size": 20, "local-epochs": 1}
CODE_RECIPE_SOURCES = {
    "lr": CODE + "synthetic_jobs.sh (FedBC line: --lr 0.01; utils/options.py default 0.01)",
    "momentum": CODE + "models/Update.py LocalUpdate.train (torch.optim.SGD(momentum=args.momentum)), "
                       "utils/options.py --momentum 0.5",
    "weight-decay": CODE + "models/Update.py LocalUpdate.train (torch.optim.SGD without weight_decay)",
    "batch-size": CODE + "utils/options.py --local_bs 20 (models/Update.py LocalUpdate: DataLoader(shuffle=True))",
    "local-epochs": CODE + "synthetic_jobs.sh (FedBC line: --local_ep 1; utils/options.py default 5)",
}
METHODS = own_backward([
    MethodDecl("fedbc", PAPER, STRATEGY, TRAINER, config=FedBCConfig, payload=PAYLOAD),
    MethodDecl("fedbc-finetune", PAPER, STRATEGY, "client_app.trainers.fedbc:FedBCFineTuneTrainer",
               config=FedBCConfig, payload=PAYLOAD, description="FedBC-FineTune: fine-tuned local model for P-FL"),
    MethodDecl("per-fedbc", PAPER, STRATEGY, "client_app.trainers.fedbc:PerFedBCTrainer", config=FedBCConfig,
               payload=PAYLOAD, description="Per-FedBC: first-order MAML local step (Alg. 3)"),
    MethodDecl("fedbc-uniform", PAPER, "strategies.methods.fedbc.strategy:FedBCUniformStrategy",
               TRAINER, config=FedBCConfig, payload=PAYLOAD,
               description="control: FedBC's local objective and dual steps, unweighted mean of the models"),
    MethodDecl("fedbc-code", PAPER, STRATEGY, TRAINER, config=FedBCCodeConfig, payload=PAYLOAD,
               recipe=CODE_RECIPE, recipe_sources=CODE_RECIPE_SOURCES,
               description="FedBC as the authors' public code runs it (keys fedbc-code.*, docs/methods/fedbc.md)"),
])
