"""FedBR (seed 003): local learning bias reduction with pseudo-data (RSM / Mixture, Eq. 4) and a projection
head trained by a max step on L_con and a min step CE + lambda CE_pseudo + mu L_con (Eqs. 3, 5, 6).

``fedbr`` is the paper's text (where the text is silent, the authors' code decides and the key's doc says so);
``fedbr-code`` is the authors' published code (LINs-lab/FedBR) as far as our keys express it: its own section
``fedbr-code.*`` (the same keys, the code's values) and its optimizer, batch and local steps as the method's
recipe (``MethodDecl.recipe``). docs/methods/fedbr.md lists every default with its source."""

import dataclasses
from dataclasses import dataclass

from flcore.common import CommonConfig
from flcore.declaration import MethodDecl, Payload, own_backward
from flcore.schema import ConfigError, KeySpec, Section, Sectioned, param

PSEUDO_KINDS = ("mixture", "rsm")
REFRESH = ("once", "round")
WEIGHTINGS = ("uniform", "samples")
PAIRINGS = ("index", "all-pairs", "mean")
PROXY_KINDS = ("dataset", "smooth-noise", "white-noise")
GENERATED_PROXIES = ("smooth-noise", "white-noise")
GLOBAL_FEATURES = ("step", "round")
RSM_SCOPES = ("client", "shared")
PARTNERS = ("local", "batch")
# fedbr.proxy-dataset = auto: the offline set of ANOTHER distribution each dataset's proxy is drawn from. The
# authors' code pairs CIFAR-10 with CIFAR-100 both ways (scripts/train_fed.py, lines 179-196); for MNIST its
# proxy branch raises NotImplementedError (and its first commit's CIFAR-10 proxy has 3 channels against MNIST's
# 1), so the 28 x 28 grey sets take Fashion-MNIST (mnist-5k for Fashion-MNIST itself). Datasets absent here have
# no offline set of another distribution at their shape (digits' 8 x 8, synthetic's vectors, hf:*): auto gives
# the generated smooth-noise proxy there, by the dataset's name (never because a file is missing).
# the datasets a proxy can come from: ours with a training pool of images (flcore/common.py DATASETS less
# synthetic and rotated-mnist, which are generated from others), or a Hugging Face image set
PROXY_DATASETS = ("auto", "mnist", "fmnist", "emnist-letters", "cifar10", "cifar100", "mnist-5k", "digits", "hf:*")
AUTO_PROXY = {"mnist": "fmnist", "mnist-5k": "fmnist", "rotated-mnist": "fmnist", "emnist-letters": "fmnist",
              "fmnist": "mnist-5k", "cifar10": "cifar100", "cifar100": "cifar10"}
STATE_KEY = "fedbr-rsm"   # client state: the RSM pseudo set built at the client's first round
NUM_CLIENTS = "fedbr-num-clients"  # per-client config from the server: clients in the federation (shared RSM)
# reply metrics (means over the round's local steps unless said otherwise), averaged by the server every round:
CON_BEFORE_MAX = "fedbr-max-con-loss"  # L_con at the max step's start (theta^{k-1}, phi^{k-1})
CON_AFTER_MAX = "fedbr-con-loss"       # L_con after the max step, the min step's term (theta^k, phi^{k-1})
CON_END = "fedbr-con-end"              # L_con of the round's final theta, phi on the last batch
SIM_GLOBAL = "fedbr-sim-global"        # cos(P phi_i(x_p), P phi_g(x_p)) in the min step (f1's similarity)
SIM_REAL = "fedbr-sim-real"            # cos(P phi_i(x_p), P phi_i(x)) in the min step (f2's similarity)
PSEUDO_CE = "fedbr-pseudo-ce"          # CE_soft of the pseudo batch (component 1)
METRICS = (CON_BEFORE_MAX, CON_AFTER_MAX, CON_END, SIM_GLOBAL, SIM_REAL, PSEUDO_CE)
REPO = "authors' code, LINs-lab/FedBR, "
CODE = REPO + "fedbr/"


@dataclass(frozen=True)
class FedBRConfig(Section):
    NAME = "fedbr"
    mu: float = param(0.5, "weight of L_con in the min step, Eq. 3 (the text gives no value; authors' code 0.5: "
                           "algorithms.py FedBR.update)", ge=0, old="fedbr-mu")
    lambda_: float = param(1.0, "weight of the pseudo-data classification loss, Eq. 3 (the text gives no value; "
                                "authors' code 1.0: algorithms.py FedBR.update)", ge=0, old="fedbr-lambda")
    tau1: float = param(0.5, "temperature of f1, Eq. 5 (the text gives no value; authors' code multiplies the "
                             "cosine by 2, i.e. 0.5: algorithms.py FedBR.update)", gt=0, old="fedbr-tau1")
    tau2: float = param(0.5, "temperature of f2, Eq. 6 (as tau1: algorithms.py FedBR.update)", gt=0,
                        old="fedbr-tau2")
    pseudo: str = param("mixture", "pseudo-data: mixture (Eq. 4; the text states no default, the authors' README "
                                   "generates 32 Mixture pseudo-data by default) or rsm (random sample mean, label "
                                   "1/C)", choices=PSEUDO_KINDS, old="fedbr-pseudo")
    pseudo_size: int = param(0, "|D_p| (0: the run's batch-size, Alg. 1's |D_p| = B; authors' code: "
                                "hparams batch_size, scripts/train_fed.py lines 348-355)", ge=0,
                             old="fedbr-pseudo-size")
    rsm_size: int = param(10, "samples one RSM sample averages (the text: 'a random subset'; authors' code 10, "
                              "drawn with replacement: scripts/train_fed.py get_augmentation_mean_data)", gt=0,
                          old="fedbr-rsm-size")
    rsm_scope: str = param("client", "RSM over whose samples: client (the text: 'a random subset of local "
                                     "samples', each client its own set) or shared (authors' code: ONE set for all "
                                     "clients, each sample the mean of rsm-size samples of one uniformly drawn "
                                     "client: scripts/train_fed.py get_augmentation_mean_data; needs every "
                                     "client's data, i.e. nodes with partition-id, not data-path)",
                           choices=RSM_SCOPES)
    mixture_k: int = param(1, "K in Eq. 4: local samples mixed into each proxy sample, redrawn every step "
                              "(the text gives no value; authors' code K = 1: algorithms.py FedBR.update)",
                           ge=0, old="fedbr-mixture-k")
    mixture_partners: str = param("local", "where Eq. 4's x_1..x_K come from: local (the text: 'local samples', "
                                           "drawn from the client's training set) or batch (authors' code: from "
                                           "the step's minibatch, algorithms.py FedBR.get_unlabeled_by_self)",
                                  choices=PARTNERS)
    pseudo_refresh: str = param("once", "'transfer once' (Tables 2/6/7, Fig. 6b; authors' code builds it once: "
                                        "scripts/train_fed.py lines 348-355) or rebuilt every round",
                                choices=REFRESH, old="fedbr-pseudo-refresh")
    proxy: str = param("dataset", "Mixture's x_p: dataset (the text: 'the sample mean of a proxy dataset', "
                                  "'irrelevant and globally shared'; each x_p the mean of proxy-mean-size images "
                                  "of proxy-dataset, as scripts/train_fed.py get_augmentation_proxy_data) or a "
                                  "generated set: smooth-noise / white-noise (seeded noise samples, ours)",
                       choices=PROXY_KINDS, old="fedbr-proxy")
    proxy_dataset: str = param("auto", "the proxy dataset (a dataset name of ours, never the run's own): auto "
                                       "= fmnist for the 28x28 grey sets, mnist-5k for fmnist, cifar100 for "
                                       "cifar10 and cifar10 for cifar100 (scripts/train_fed.py lines 179-196), "
                                       "smooth-noise where no offline set of another distribution has the "
                                       "input's shape (digits, synthetic, hf:*). Read from data-root; missing "
                                       "is an error", choices=PROXY_DATASETS)
    proxy_mean_size: int = param(10, "proxy images averaged into one x_p (the text: 'the procedure of RSM' on the "
                                     "proxy data; authors' code 10, drawn with replacement: "
                                     "scripts/train_fed.py get_augmentation_proxy_data)", gt=0)
    pairing: str = param("index", "which real feature a pseudo sample meets in f2 (authors' code: row i with row "
                                  "i, algorithms.py FedBR.update)", choices=PAIRINGS, old="fedbr-pairing")
    classifier_debias: bool = param(True, "component 1: the pseudo-data classification term",
                                    old="fedbr-classifier-debias")
    feature_debias: bool = param(True, "component 2: the L_con term of the min step (with the max step)",
                                 old="fedbr-feature-debias")
    max_step: bool = param(True, "run the max step (Table 4 'w/o max step' = false)", old="fedbr-max-step")
    mixup: bool = param(False, "'FedBR + Mixup': mixup on the real batch", old="fedbr-mixup")
    mixup_alpha: float = param(0.2, "mixup lam ~ Beta(alpha, alpha) (authors' code 0.2: algorithms.py "
                                    "FedBR.get_new_all_x)", gt=0, old="fedbr-mixup-alpha")
    proj_lr: float = param(0.0, "learning rate of the max step (0: the run's lr, as the authors' code: "
                                "algorithms.py FedBR.__init__ disc_opt)", ge=0, old="fedbr-proj-lr")
    global_features: str = param("step", "phi_g(x_p) in f1 (Eq. 5): of this step's pseudo batch (step), or of the "
                                         "round's first pseudo batch reused all round, as the authors' code caches "
                                         "it (round: algorithms.py FedBR.update, all_global_unlabeled_z; differs "
                                         "only when Mixture redraws x_p)",
                                 choices=GLOBAL_FEATURES)
    max_momentum: float = param(0.0, "momentum of the max step's SGD on theta (authors' code: plain SGD with the "
                                     "run's weight decay, algorithms.py FedBR.__init__ disc_opt; the min step uses "
                                     "the run's optimizer)", ge=0, lt=1)
    weighting: str = param("uniform", "server averaging: uniform (Alg. 1 lines 13-15) or n_k-weighted",
                           choices=WEIGHTINGS, old="fedbr-weighting")

    @property
    def uses_pseudo(self) -> bool:
        return self.classifier_debias or self.feature_debias

    @property
    def runs_max_step(self) -> bool:
        return self.feature_debias and self.max_step

    def pseudo_count(self, batch_size: int) -> int:
        """|D_p|: pseudo-size, or the batch size B when 0 (Alg. 1)."""
        return self.pseudo_size or int(batch_size)

    def proxy_source(self, dataset: str) -> str:
        """The proxy a run on ``dataset`` draws Mixture's x_p from: a dataset name or a generated kind."""
        if self.proxy != "dataset":
            return self.proxy
        if self.proxy_dataset != "auto":
            return self.proxy_dataset
        return AUTO_PROXY.get(dataset, "smooth-noise")

    def check_run(self, common: Section) -> None:
        """The proxy dataset must be another dataset than the run's (its training pool is the clients' data)."""
        assert isinstance(common, CommonConfig)  # the run config (flcore.config.RunConfig._check_run)
        dataset = str(common.dataset)
        key = f"{self.NAME}.proxy-dataset"
        if self.pseudo == "mixture" and self.proxy == "dataset" and self.proxy_source(dataset) == dataset:
            raise ConfigError(f"run-config key '{key}' = '{self.proxy_dataset}' is the run's own dataset "
                              f"'{dataset}': the proxy must be another dataset (its training pool is the "
                              "clients' data)")


def _code(doc: str) -> str:
    return doc + ": " + CODE


@dataclass(frozen=True)
class FedBRCodeConfig(FedBRConfig):
    """FedBR as the authors' public code runs it (LINs-lab/FedBR): every key of ``fedbr.*`` under
    ``fedbr-code.*``, the defaults that differ set to the code's values (each doc names the file and function).
    Read there: algorithms.py (FedBR.__init__, update, get_unlabeled_by_self), scripts/train_fed.py
    (get_augmentation_proxy_data, get_augmentation_mean_data, the proxy set of lines 176-198 and 348-355),
    networks.py (MNIST_CNN, MLP), hparams_registry.py (_hparams). The code's common values (lr, momentum, weight
    decay, batch, local steps, model) are the method's recipe (docs/methods/fedbr.md)."""

    NAME = "fedbr-code"

    @classmethod
    def specs(cls) -> list[KeySpec]:
        """The keys as declared, without the flat names of before sectioning (those name fedbr.* keys)."""
        return [dataclasses.replace(s, old=None) for s in super().specs()]
    mixture_partners: str = param("batch", _code("x_1..x_K drawn from the step's minibatch: algorithms.py "
                                                 "FedBR.get_unlabeled_by_self"), choices=PARTNERS)
    global_features: str = param("round", _code("phi_g(x_p) of the round's first pseudo batch, cached: "
                                                "algorithms.py FedBR.update (all_global_unlabeled_z, if_updated)"),
                                 choices=GLOBAL_FEATURES)
    rsm_scope: str = param("shared", _code("one RSM set for all clients (with pseudo = rsm): "
                                           "scripts/train_fed.py get_augmentation_mean_data"), choices=RSM_SCOPES)


def br_config(cfg: Sectioned) -> FedBRConfig:
    """The FedBR section a run reads: its method's (``fedbr-code.*`` for fedbr-code), else ``fedbr.*``."""
    own = cfg.method_section
    return own if isinstance(own, FedBRConfig) else cfg.section(FedBRConfig)


PAPER = "FedBR: local learning bias reduction (Guo, Tang and Lin, ICML 2023)"
TRAINER = "client_app.trainers.fedbr.trainer:FedBRTrainer"
STRATEGY = "strategies.methods.fedbr:FedBRStrategy"
HOOK = "models.extras:add_fedbr_projection"
PAYLOAD = Payload(config=(NUM_CLIENTS,), metrics=METRICS, state=(STATE_KEY,))
# fedbr-code's common keys: the authors' hyper-parameters for RotatedMNIST (Table 1's first setting), each with
# its source; CIFAR's differ (hparams_registry.py _hparams: lr 1e-2, batch 32; networks.py Featurizer: a ViT).
CODE_RECIPE = {"lr": 1e-3, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 64, "local-epochs": 50,
               "max-local-steps": 50, "model": "domainbed-cnn"}
CODE_RECIPE_SOURCES = {
    "lr": CODE + "hparams_registry.py _hparams: lr 1e-3 for RotatedMNIST (SMALL_IMAGES; CIFAR 1e-2)",
    "momentum": CODE + "algorithms.py FedBR.__init__: gen_opt and disc_opt are torch.optim.SGD without momentum",
    "weight-decay": CODE + "hparams_registry.py _hparams: weight_decay 0 for RotatedMNIST",
    "batch-size": CODE + "hparams_registry.py _hparams: batch_size 64 for RotatedMNIST (CIFAR 32)",
    "local-epochs": REPO + "README.md's command (--local_steps 50, 50,000 steps = Table 1's 1000 rounds; "
                    "fedbr/scripts/train_fed.py's own default is 20): 50 epochs capped at 50 steps give every "
                    "client 50 steps",
    "max-local-steps": REPO + "README.md's command --local_steps 50 (fedbr/scripts/train_fed.py: aggregation at "
                              "step % local_steps == 0)",
    "model": CODE + "networks.py MNIST_CNN (Featurizer for 28x28 inputs) with a linear Classifier",
}
METHODS = own_backward([
    MethodDecl("fedbr", PAPER, STRATEGY, TRAINER, config=FedBRConfig, model_hook=HOOK, payload=PAYLOAD),
    MethodDecl("fedbr-code", PAPER, STRATEGY, TRAINER, config=FedBRCodeConfig, model_hook=HOOK, payload=PAYLOAD,
               description="FedBR as the authors' public code runs it (keys fedbr-code.*, recipe: SGD lr 1e-3 "
                           "without momentum, B = 64, 50 local steps, DomainBed's MNIST CNN; docs/methods/fedbr.md)",
               recipe=CODE_RECIPE, recipe_sources=CODE_RECIPE_SOURCES),
])
__all__ = ["ConfigError", "FedBRConfig", "FedBRCodeConfig", "METHODS", "br_config"]
