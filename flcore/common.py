"""The common run-config keys (run, data, model, local training, sampling/evaluation/failures): the flat section
of the run config, declared once with default, bounds and doc (flcore/schema.py). flcore/config.py assembles it with
every method's section into :class:`flcore.config.RunConfig`."""

from __future__ import annotations

from dataclasses import dataclass

from flcore.presets import get_preset
from flcore.schema import ConfigError, Section, param

DATASETS = ("mnist", "fmnist", "emnist-letters", "cifar10", "cifar100", "mnist-5k", "digits",
            "synthetic", "rotated-mnist")
PARTITIONS = ("iid", "dirichlet", "shards", "classes", "power-law", "natural")
MODELS = ("auto", "logistic", "mlp", "convnet", "vgg11", "resnet18", "domainbed-cnn")
HEADS = ("linear", "etf")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed")      # models/numerics.py (flcore imports no torch)
MEMORY_FORMATS = ("auto", "contiguous", "channels-last")
ENGINES = ("inprocess", "ray")


@dataclass(frozen=True)
class CommonConfig(Section):
    """The common keys: run, data, model, local training, sampling/evaluation/failures."""

    # --- run
    method: str = param("fedavg", "the FL method (`noniid-fl methods` lists them)")
    preset: str = param("", "a paper's setting, '<paper>-<setting>' (`noniid-fl methods` lists them): sets "
                            "every value the paper states; the keys you set win (under `flwr run`: keys you set "
                            "to non-default values)")
    preset_applied: bool = param(False, "set by the library once the preset's values and the method's recipe "
                                        "are in the run config (a client does not apply them again); not for "
                                        "users")
    seed: int = param(0, "seed of data split, partitions, sampling and model init", ge=0)
    num_server_rounds: int = param(10, "federated rounds", ge=1)
    out_dir: str = param("", "where results.json, metrics.csv, models and checkpoints go; '' = "
                             "runs/<method>-<timestamp> (runs/latest links the newest; a resumed run continues "
                             "in its resume-from directory)")
    overwrite: bool = param(False, "replace the run files in an existing non-empty out-dir (else the run is "
                                   "refused); `noniid-fl run --overwrite`")
    resume_from: str = param("", "continue the run whose out-dir holds this checkpoint ('' = start fresh)")
    checkpoint: bool = param(True, "write checkpoint.pt after every round")
    tensorboard: bool = param(False, "also write every per-round scalar of results.json as TensorBoard event "
                                     "files under <out-dir>/tensorboard (needs the extra: pip install "
                                     "'noniid-fl[tensorboard]')")
    metrics_port: int = param(0, "serve the run's per-round gauges and counters for Prometheus on this port at "
                                 "/metrics (server_app/metrics.py; 0 = off)", ge=0, le=65535)
    metrics_host: str = param("127.0.0.1", "the address the metrics endpoint binds (loopback by default; "
                                           "'0.0.0.0' exposes it on every interface)")
    client_state_dir: str = param("", "persist client state (SCAFFOLD c_i, MOON previous model) under this "
                                      "directory ('' = in the node's memory only)")
    device: str = param("auto", "torch device; auto = CUDA when available", choices=DEVICES)
    precision: str = param("fp32", "arithmetic of local training and evaluation (models/numerics.py): fp32 (as the "
                                   "papers ran); bf16-mixed = bf16 autocast, parameters, gradients and messages "
                                   "fp32 (about 2x a round on CPUs with AVX-512 BF16: docs/PERFORMANCE.md); "
                                   "fp16-mixed = fp16 autocast with a gradient scaler (CUDA only)",
                           choices=PRECISIONS)
    memory_format: str = param("auto", "tensor layout of the model's 4-D weights in training and evaluation: auto = "
                                       "channels-last under a mixed precision for a model with 2-D convolutions, "
                                       "contiguous at fp32 (fp32 runs unchanged); contiguous; channels-last",
                               choices=MEMORY_FORMATS)
    tf32: bool = param(False, "let fp32 matrix products and convolutions use TF32 tensor cores (CUDA only)")
    engine: str = param("inprocess", "engine of `noniid-fl run` and the experiments runner on one box: "
                                     "inprocess (Flower Grid in this process) or ray; `flwr run` always uses "
                                     "Flower's", choices=ENGINES)
    engine_workers: int = param(1, "worker processes of the in-process engine", ge=1)
    # --- data
    dataset: str = param("mnist-5k", "dataset (offline: mnist-5k, digits, synthetic, rotated-mnist; "
                                     "hf:<name>[?image=<column>&label=<column>]: a Hugging Face image-classification "
                                     "dataset through flwr-datasets)", choices=DATASETS + ("hf:*",))
    data_root: str = param("data", "directory of the torchvision datasets")
    download: bool = param(False, "let torchvision download missing datasets")
    partition: str = param("dirichlet", "how the training pool is split over clients", choices=PARTITIONS)
    dirichlet_alpha: float = param(0.5, "concentration of the Dirichlet label split", gt=0)
    shards_per_client: int = param(2, "shards per client (McMahan's shard split)", ge=1)
    classes_per_client: int = param(2, "classes per client (partition 'classes')", ge=1)
    samples_per_class: int = param(20, "samples per class and client (partition 'classes')", ge=1)
    power_law_exponent: float = param(1.5, "exponent of the power-law client sizes", gt=0)
    min_partition_size: int = param(4, "smallest allowed client partition", ge=0)
    local_test_fraction: float = param(0.0, "share of each client's data held out as its local test split for "
                                            "P-FL and federated evaluation (0 = none: every sample trains; "
                                            "the P-FL papers use 0.25, set by their presets)", ge=0, lt=1)
    validation_fraction: float = param(0.0, "share of each client's training data held out as its validation "
                                            "split (tuning selects on it; 0 = none)", ge=0, lt=1)
    pfl_eval_split: str = param("test", "which held-out split of its own a client's P-FL evaluation (local-accuracy) "
                                        "reads: 'test' (its local test split) or 'validation' (its validation "
                                        "split: what a tuning trial selects a P-FL method on, so no local test "
                                        "sample is evaluated while tuning; needs validation-fraction > 0)",
                                choices=("test", "validation"))
    global_test_fraction: float = param(0.2, "share of an offline pool held out as the global test set (G-FL); "
                                             "synthetic: of each client's data (the union is the test set, as "
                                             "in FedProx; local-test-fraction, if set, takes its place)",
                                        gt=0, lt=1)
    synthetic_alpha: float = param(1.0, "alpha of Synthetic(alpha, beta) (FedProx paper)", ge=0)
    synthetic_beta: float = param(1.0, "beta of Synthetic(alpha, beta)", ge=0)
    synthetic_prior_scale: str = param("std", "how alpha/beta scale u_k ~ N(0, alpha), B_k ~ N(0, beta): 'std' "
                                              "(standard deviations, as the FedBC and FedProx authors' generators: "
                                              "chenfan95/FedBC utils/synthetic.py:generate_synthetic) or "
                                              "'variance'; equal at alpha = beta = 1 (data_partitioning/synthetic.py)",
                                       choices=("std", "variance"))
    synthetic_max_samples: int = param(2000, "cap on a synthetic client's sample count floor(lognormal(4, 2)) + 50 "
                                             "(0 = no cap, as the FedBC authors' utils/synthetic.py:"
                                             "generate_synthetic)", ge=0)
    synthetic_federation: str = param("fixed", "which generated federation a synthetic run trains on: 'fixed' = "
                                               "one federation for every seed (the dataset's own seed, like a "
                                               "real dataset's split); 'per-seed' = each run seed generates its "
                                               "own clients and so its own G-FL test set (independent "
                                               "federations: seeds differ in data, not only in initialisation and "
                                               "sampling; a tuning seed never sees a reported seed's samples)",
                                      choices=("fixed", "per-seed"))
    rotation_step_deg: float = param(15.0, "rotation between consecutive clients (rotated-mnist)")
    # --- model
    model: str = param("auto", "backbone; auto picks per dataset", choices=MODELS)
    head: str = param("linear", "classifier head: linear or a fixed simplex ETF (composes with any method)",
                      choices=HEADS)
    etf_scale: float = param(1.0, "scale beta of the fixed ETF classifier, W = beta W* (neural-collapse FL Sec. 5.1: "
                                  "'the default setting of ETF is 1.0'; Table 5 tries 0.5, 1.0, 1.5)", gt=0)
    restricted_softmax_alpha: float = param(1.0, "FedRS's restricted softmax (Li & Zhan, KDD 2021), composing with "
                                                 "any method: local training scales the logit of each class this "
                                                 "client lacks by alpha before the softmax (1 = off, plain "
                                                 "softmax; method fedrs sets 0.5)", ge=0, le=1)
    restricted_softmax_form: str = param("paper", "which classes the restriction scales: paper = 1 for every "
                                                  "class the client holds, alpha for the missing ones (FedRS "
                                                  "Sec. 4); code = alpha + (1 - alpha) n_c / max_j n_j from the "
                                                  "client's class counts (the authors' FedRepo "
                                                  "algorithms/fedrs.py: FedRS.update_local)",
                                         choices=("paper", "code"))
    # --- local training
    local_epochs: int = param(1, "local epochs E", ge=1)
    batch_size: int = param(32, "local minibatch size B", ge=1)
    lr: float = param(0.03, "local SGD learning rate (chosen by the tuning protocol on validation data: "
                            "results/default-fedavg/tuning.json)", gt=0)
    momentum: float = param(0.9, "local SGD momentum (0.9: the optimizer of FedUFO, FedETF and most non-IID "
                                 "FL papers)", ge=0, lt=1)
    weight_decay: float = param(5e-4, "local SGD weight decay (5e-4: FedETF's; FedUFO uses 2e-4, see its "
                                      "presets)", ge=0)
    max_local_steps: int = param(0, "cap on local steps per round (0 = none)", ge=0)
    # --- sampling, evaluation, failures
    fraction_train: float = param(1.0, "share of clients sampled per round", gt=0, le=1)
    min_train_nodes: int = param(2, "clients that must be registered before a round starts", ge=0)
    min_train_replies: int = param(1, "usable updates a round needs (else retried, then failed)", ge=1)
    round_timeout: float = param(600.0, "seconds a round waits for replies", gt=0)
    reply_poll_interval: float = param(0.1, "longest pause between reply polls (s)", gt=0)
    round_retries: int = param(1, "new samples tried when a round gets too few updates", ge=0)
    evict_after_timeouts: int = param(3, "a client whose replies time out this many times in a row (each costing "
                                         "the round its round-timeout) is no longer sampled nor evaluated until "
                                         "it answers a liveness probe (0 = never evicted)", ge=0)
    probe_timeout: float = param(10.0, "seconds a liveness probe of an evicted client waits; an unanswered probe is "
                                       "repeated after 1, 2, 4, ... rounds (at most 64)", gt=0)
    max_update_norm: float = param(1000.0, "updates with a larger norm ||theta_k - theta|| are rejected", gt=0)
    update_norm_factor: float = param(10.0, "with 3 or more updates in a round, an update whose norm exceeds "
                                            "this multiple of the round's median update norm is rejected "
                                            "(0 = off); see update-norm-scale", ge=0)
    update_norm_scale: str = param("local-steps", "the update-norm-factor limit of a client whose registered "
                                                  "samples allow more local steps than the round's median "
                                                  "client grows with ||a||_1 of those steps (FedNova's, with "
                                                  "momentum): honest heavy clients pass; 'none': one limit for "
                                                  "all (before issue 31)", choices=("local-steps", "none"))
    examples_cap_ratio: float = param(10.0, "with node bindings (NODE_BINDINGS, a deployment), a bound client whose "
                                            "training-set size the operator did not declare is weighted by its "
                                            "claimed size capped at this multiple of the median claim of the "
                                            "registered clients (and screened as the median client at most): "
                                            "one node cannot take over the global model by claiming 10^9 "
                                            "samples. Without bindings (simulation) claims are used as they are", ge=1)
    federated_eval_every: int = param(0, "evaluate the global model on the clients' local test splits every N "
                                         "rounds and after the last one (0 = never; needs local-test-fraction "
                                         "> 0)", ge=0)
    test_evaluation: bool = param(True, "evaluate the global model on the global test set every round (tuning "
                                        "runs turn it off: they select on validation data only)")
    federated_eval_clients: int = param(0, "evaluate on a fixed seeded sample of M clients (0 = all)", ge=0)
    target_accuracy: float = param(0.8, "accuracy for the rounds-to-target metric", ge=0, le=1)

    def check(self) -> None:
        """Cross-field constraints of the common keys (whether ``method`` is registered is checked by
        flcore.config.RunConfig, which reads the registry)."""
        if self.dataset == "synthetic" and self.partition not in ("natural", "power-law"):
            raise ConfigError(
                "dataset 'synthetic' is generated per client (Synthetic(alpha, beta) with power-law "
                f"sizes): run-config key 'partition' must be 'natural' or 'power-law', got '{self.partition}'")
        if self.preset:
            get_preset(self.preset)
        if self.device == "cpu" and (self.precision == "fp16-mixed" or self.tf32):
            key = "precision = 'fp16-mixed'" if self.precision == "fp16-mixed" else "tf32 = true"
            raise ConfigError(f"run-config {key} needs CUDA, but device = 'cpu': on a CPU use precision = "
                              "'bf16-mixed' (or device = 'cuda' / 'auto' on a GPU node)")
        if self.federated_eval_every and self.local_test_fraction == 0 and self.dataset != "synthetic":
            raise ConfigError("run-config key 'federated-eval-every' > 0 evaluates the global model on each "
                              "client's local test split, but 'local-test-fraction' is 0 (no split): set "
                              "local-test-fraction (e.g. 0.25) or federated-eval-every = 0")
        if self.pfl_eval_split == "validation" and self.validation_fraction == 0:
            raise ConfigError("run-config key 'pfl-eval-split' = 'validation' evaluates each client's model on its "
                              "validation split, but 'validation-fraction' is 0 (no split): set "
                              "validation-fraction (e.g. 0.2) or pfl-eval-split = 'test'")
        if self.partition == "natural" and self.dataset != "synthetic":
            raise ConfigError(f"partition 'natural' exists only for dataset 'synthetic', not '{self.dataset}'")
