"""FedUFO (seed 002, Zhang et al., ICCV 2021): unified feature learning (adversarial discriminator, UAD) and
objective alignment (group consensus CGR, global consensus CGL); prior models are relayed inside the round
(actions train.prior -> relay -> train.posterior)."""

from dataclasses import dataclass

from flcore.common import CommonConfig
from flcore.declaration import MethodDecl, Payload, own_backward
from flcore.schema import ConfigError, Section, Sectioned, param

LOSSES = ("uad", "cgr", "cgl")
CGR_TARGETS = ("softmax", "normalize")
KL_DIRECTIONS = ("posterior-target", "target-posterior")
DISC_SCHEDULES = ("paper", "alternating")
GLOBAL_TRAIN_ACCURACY = "fedufo-global-model-train-accuracy"  # reply metric: theta_t on the client's training data
DISC_STEPS = "fedufo-disc-steps"     # reply metric: D's SGD steps in the round (paper schedule: disc-epochs x batches)
CE_LOSS = "fedufo-ce-loss"           # reply metric: mean L_cls of the posterior's model steps (Eqs. 11-12)
CGR_MAX_PROB = "fedufo-cgr-target-max-prob"  # reply metric: mean max-probability of the CGR target y~ (Eq. 7)
CGR_ENTROPY = "fedufo-cgr-target-entropy"    # reply metric: mean entropy (nats) of the CGR target y~ (Eq. 7)
# dynamic-sampling rankings: run-config value -> (reply metric, needs a local test split)
SAMPLING_METRICS = {"global-model-train-accuracy": (GLOBAL_TRAIN_ACCURACY, False),
                    "global-model-local-accuracy": ("global-model-local-accuracy", True),
                    "local-accuracy": ("local-accuracy", True)}
STAGE_KEY = "fedufo-stage"           # per-client config: the training stage (1 or 2) of this round
CLIENTS_KEY = "fedufo-clients"       # per-client config (with UAD): ids of the registered clients = D's live outputs
PRIOR_KEY = "fedufo.prior."          # + member id: relayed prior model (ArrayRecord, D stripped)
GROUP_KEY = "fedufo.group"           # ConfigRecord: cids, proportions (flattened J x C), num-classes
COUNTS_KEY = "fedufo.class-counts"   # ConfigRecord in the prior reply: counts
DISC_PREFIX = "extras.disc."         # the discriminator's parameters in the model's state dict
STATE_PRIOR = "fedufo.prior"         # client state: this client's prior model of the round
STATE_PRIOR_ROUND = "fedufo.prior-round"


def parse_losses(text: str) -> frozenset[str]:
    """'uad,cgr' -> {'uad', 'cgr'}; '' or 'none' -> {} (FedAvg); anything else names the key."""
    items = [t.strip().lower() for t in str(text).replace("+", ",").split(",") if t.strip()]
    if items == ["none"]:
        return frozenset()
    bad = [t for t in items if t not in LOSSES]
    if bad:
        raise ConfigError(f"run-config key 'fedufo.losses' has unknown loss(es) {bad}; "
                          f"use a comma-separated subset of {', '.join(LOSSES)}")
    return frozenset(items)


@dataclass(frozen=True)
class FedUFOConfig(Section):
    NAME = "fedufo"
    losses_: str = param("uad,cgr,cgl", "comma-separated subset of {uad, cgr, cgl} (Tables 3-4 ablations); "
                                        "'' is FedAvg; 'cgl' alone needs no relay", old="fedufo-losses")
    num_clients: int = param(100, "the discriminator's outputs (paper: K = the 100 clients); every client id "
                                  "must be below it; in a smaller federation only the registered clients' "
                                  "outputs enter Eqs. 4-5", ge=2, old="fedufo-num-clients")
    stage_one_fraction: float = param(0.5, "share of the rounds spent in stage one (Sec. 3.4; the paper gives "
                                           "no length); only with uad", ge=0, le=1, old="fedufo-stage-one-fraction")
    cgl_lambda: float = param(3.0, "lambda of the CGL term (Eq. 12; paper 3)", ge=0, old="fedufo-cgl-lambda")
    posterior_init: str = param("global", "posterior starts from theta_t (Fig. 2) or from the prior",
                                choices=("global", "prior"), old="fedufo-posterior-init")
    dynamic_sampling: bool = param(True, "K_c/2 worst clients + K_c/2 random ones (Sec. 3.3.2)",
                                   old="fedufo-dynamic-sampling")
    sampling_metric: str = param("global-model-train-accuracy", "what ranks clients for dynamic sampling (the "
                                 "paper's 'local performance'): theta_t's accuracy on the client's training "
                                 "data (no local split needed), on its local test split (also refreshed by "
                                 "federated evaluation), or the posterior's on that split",
                                 choices=tuple(SAMPLING_METRICS), old="fedufo-sampling-metric")
    prior_epochs: int = param(0, "local epochs of the prior phase (0: local-epochs)", ge=0,
                              old="fedufo-prior-epochs")
    disc_schedule: str = param("paper", "stage-one order (Sec. 3.4: 'we first freeze ... D and train the federated "
                                        "model ... Then parameters of the federated model are fixed and we train "
                                        "the discriminator'): paper = model for the round's epochs, then D; "
                                        "alternating = one D step after every model step", choices=DISC_SCHEDULES)
    disc_epochs: int = param(0, "epochs of the discriminator phase of the paper schedule (0: local-epochs; the "
                                "paper gives no number)", ge=0)
    disc_lr: float = param(0.0, "SGD learning rate of the discriminator (0: lr)", ge=0, old="fedufo-disc-lr")
    disc_train_stage_two: bool = param(False, "keep training D in stage two (paper: stage two uses D from "
                                              "stage one)", old="fedufo-disc-train-stage-two")
    cgr_target: str = param("softmax", "group target y~ of CGR: 'softmax' = Eq. 7 as printed, softmax of the "
                                       "class-proportion mixture sum_j p_j * y~_j (same class ranking as the "
                                       "mixture, max probability <= e/(e+C-1)); 'normalize' = the mixture "
                                       "renormalised (docs/FEDUFO.md: both measured)",
                            choices=CGR_TARGETS, old="fedufo-cgr-target")
    kl_direction: str = param("posterior-target", "KL(y^||y~) as written in Eqs. 8/10, or KL(y~||y^)",
                              choices=KL_DIRECTIONS, old="fedufo-kl-direction")

    @property
    def losses(self) -> frozenset[str]:
        return parse_losses(self.losses_)

    def check(self) -> None:
        parse_losses(self.losses_)

    def check_run(self, common: Section) -> None:
        """A fedufo run refuses a sampling metric that needs a local test split when it has none."""
        assert isinstance(common, CommonConfig)  # the run config (flcore.config.RunConfig._check_run)
        has_split = common.local_test_fraction > 0 or common.dataset == "synthetic"
        if self.dynamic_sampling and SAMPLING_METRICS[self.sampling_metric][1] and not has_split:
            raise ConfigError(f"run-config key 'fedufo.sampling-metric' = '{self.sampling_metric}' ranks clients by "
                              "accuracy on their local test split, but 'local-test-fraction' is 0 (no split): set "
                              "local-test-fraction > 0, fedufo.sampling-metric = 'global-model-train-accuracy' or "
                              "fedufo.dynamic-sampling = false")


def check_federation(cfg: Sectioned, num_nodes: int) -> None:
    """The discriminator has one output per client: every client id (0 .. num_nodes - 1) must be below
    fedufo.num-clients (the declaration's federation check, flcore/registry.py)."""
    k = cfg.section(FedUFOConfig).num_clients
    if num_nodes > k:
        raise ConfigError(f"run-config key 'fedufo.num-clients' got {k}, but the federation has {num_nodes} nodes "
                          f"(client ids up to {num_nodes - 1}); allowed: >= {num_nodes}")


def active_terms(stage: int, ufo: "FedUFOConfig") -> frozenset[str]:
    """Which parts of the objective run in a stage: subset of {uad, disc, cgr, cgl} (Eqs. 11, 12)."""
    losses = ufo.losses
    if stage == 1:
        return frozenset({"uad", "disc"}) if "uad" in losses else frozenset()
    terms = set(losses)
    if "uad" in losses and ufo.disc_train_stage_two:
        terms.add("disc")
    return frozenset(terms)


def needs_relay(stage: int, ufo: "FedUFOConfig") -> bool:
    """The prior/relay exchange is needed only when D trains on priors' features or CGR is on."""
    terms = active_terms(stage, ufo)
    return "disc" in terms or "cgr" in terms


METHODS = own_backward([MethodDecl(
    "fedufo", "Zhang, Luo, Bai, Du and Duan, ICCV 2021 (FedUFO)", "strategies.methods.fedufo:FedUFOStrategy",
    "client_app.trainers.fedufo.trainer:FedUFOTrainer", config=FedUFOConfig, model_hook="models.extras:add_discriminator",
    payload=Payload(config=(STAGE_KEY, CLIENTS_KEY), records=(PRIOR_KEY, GROUP_KEY), reply_records=(COUNTS_KEY,),
                    metrics=("fedufo-stage", "fedufo-priors-received", "fedufo-own-prior-retrained",
                             "fedufo-uniform-loss", "fedufo-disc-loss", "fedufo-cgr-loss", "fedufo-cgl-loss",
                             "fedufo-disc-own-accuracy", DISC_STEPS, CE_LOSS, CGR_MAX_PROB, CGR_ENTROPY,
                             GLOBAL_TRAIN_ACCURACY),
                    actions=("train", "train.prior", "train.posterior"), state=(STATE_PRIOR, STATE_PRIOR_ROUND)),
    check_federation=check_federation)])
