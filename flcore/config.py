"""Typed, validated view of the run config shared by every method.

Flower hands the run config over as a flat ``dict`` with kebab-case keys (``[tool.flwr.app.config]`` in
pyproject.toml, overridden with ``flwr run . local -c "key=value"``). :class:`RunConfig` turns it into a
frozen dataclass and rejects bad values *before the first round*, naming the key and what is allowed.
Method-specific keys stay in :attr:`RunConfig.raw`; each method parses them with its own dataclass via
:func:`method_config`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, TypeVar

DATASETS = ("mnist", "fmnist", "emnist-letters", "cifar10", "cifar100", "mnist-5k", "digits",
            "synthetic", "rotated-mnist")
PARTITIONS = ("iid", "dirichlet", "shards", "classes", "power-law", "natural")
MODELS = ("auto", "logistic", "mlp", "convnet", "vgg11", "resnet18")
HEADS = ("linear", "etf")
DEVICES = ("auto", "cpu", "cuda")
ENGINES = ("inprocess", "ray")


class ConfigError(ValueError):
    """A run-config value is missing, of the wrong type or out of range."""


def _kebab(name: str) -> str:
    return name.replace("_", "-")


@dataclass(frozen=True)
class RunConfig:
    """Common run-config keys (see pyproject.toml for the defaults a run starts from)."""

    method: str = "fedavg"
    seed: int = 0
    num_server_rounds: int = 10
    out_dir: str = "runs/latest"
    resume_from: str = ""
    checkpoint: bool = True
    client_state_dir: str = ""
    device: str = "auto"
    engine: str = "inprocess"
    engine_workers: int = 1
    dataset: str = "mnist-5k"
    data_root: str = "data"
    download: bool = False
    partition: str = "dirichlet"
    dirichlet_alpha: float = 0.5
    shards_per_client: int = 2
    classes_per_client: int = 2
    samples_per_class: int = 20
    power_law_exponent: float = 1.5
    min_partition_size: int = 4
    local_test_fraction: float = 0.25
    global_test_fraction: float = 0.2
    synthetic_alpha: float = 1.0
    synthetic_beta: float = 1.0
    rotation_step_deg: float = 15.0
    model: str = "auto"
    head: str = "linear"
    etf_scale: float = 1.0
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    max_local_steps: int = 0
    fraction_train: float = 1.0
    min_train_nodes: int = 2
    min_train_replies: int = 1
    round_timeout: float = 600.0
    reply_poll_interval: float = 0.1
    round_retries: int = 1
    max_update_norm: float = 1000.0
    federated_eval_every: int = 1
    federated_eval_clients: int = 0
    target_accuracy: float = 0.8
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "RunConfig":
        """Build from a kebab-case run-config mapping; missing keys take the defaults."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "raw":
                continue
            key = _kebab(f.name)
            if key in values:
                kwargs[f.name] = _coerce(key, values[key], f.type)
        cfg = cls(**kwargs, raw=dict(values))
        cfg.validate()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """Kebab-case mapping of every key, method keys included (what results.json records)."""
        out = dict(self.raw)
        for f in fields(self):
            if f.name != "raw":
                out[_kebab(f.name)] = getattr(self, f.name)
        return out

    def replace(self, **changes: Any) -> "RunConfig":
        raw = dict(self.raw)
        raw.update({_kebab(k): v for k, v in changes.items()})
        return dataclasses.replace(self, **changes, raw=raw)

    def validate(self) -> None:
        from flcore.registry import METHODS  # local import: registry imports nothing heavy

        _choice("method", self.method, tuple(METHODS))
        _choice("dataset", self.dataset, DATASETS)
        _choice("partition", self.partition, PARTITIONS)
        _choice("model", self.model, MODELS)
        _choice("head", self.head, HEADS)
        _choice("device", self.device, DEVICES)
        _choice("engine", self.engine, ENGINES)
        _positive("engine-workers", self.engine_workers)
        _positive("num-server-rounds", self.num_server_rounds)
        _positive("local-epochs", self.local_epochs)
        _positive("batch-size", self.batch_size)
        _positive("lr", self.lr)
        _positive("dirichlet-alpha", self.dirichlet_alpha)
        _positive("shards-per-client", self.shards_per_client)
        _positive("classes-per-client", self.classes_per_client)
        _positive("samples-per-class", self.samples_per_class)
        _positive("round-timeout", self.round_timeout)
        _positive("reply-poll-interval", self.reply_poll_interval)
        _positive("max-update-norm", self.max_update_norm)
        _positive("etf-scale", self.etf_scale)
        _positive("min-train-replies", self.min_train_replies)
        _nonneg("min-train-nodes", self.min_train_nodes)
        _nonneg("momentum", self.momentum)
        _nonneg("weight-decay", self.weight_decay)
        _nonneg("max-local-steps", self.max_local_steps)
        _nonneg("round-retries", self.round_retries)
        _nonneg("federated-eval-every", self.federated_eval_every)
        _nonneg("federated-eval-clients", self.federated_eval_clients)
        _nonneg("min-partition-size", self.min_partition_size)
        _in_open_unit("fraction-train", self.fraction_train, allow_one=True)
        _in_open_unit("local-test-fraction", self.local_test_fraction)
        _in_open_unit("global-test-fraction", self.global_test_fraction)
        if self.momentum >= 1:
            raise ConfigError(f"run-config key 'momentum' must be in [0, 1), got {self.momentum}")
        if self.dataset == "synthetic" and self.partition not in ("natural", "power-law"):
            raise ConfigError(
                "dataset 'synthetic' is generated per client (Synthetic(alpha, beta) with power-law "
                f"sizes): run-config key 'partition' must be 'natural' or 'power-law', got '{self.partition}'"
            )
        if self.partition == "natural" and self.dataset != "synthetic":
            raise ConfigError(
                f"partition 'natural' exists only for dataset 'synthetic', not '{self.dataset}'")


def _coerce(key: str, value: Any, typ: Any) -> Any:
    name = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if name == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false"):
                return value.lower() == "true"
            raise TypeError
        if name == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if name == "float":
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if name == "str":
            if not isinstance(value, str):
                raise TypeError
            return value
    except (TypeError, ValueError):
        raise ConfigError(f"run-config key '{key}' must be a {name}, got {value!r}") from None
    return value


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"run-config key '{key}' has unknown value '{value}'; allowed: {', '.join(allowed)}")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"run-config key '{key}' must be > 0, got {value}")


def _nonneg(key: str, value: float) -> None:
    if not value >= 0:
        raise ConfigError(f"run-config key '{key}' must be >= 0, got {value}")


def _in_open_unit(key: str, value: float, allow_one: bool = False) -> None:
    ok = 0 < value <= 1 if allow_one else 0 < value < 1
    if not ok:
        hi = "1]" if allow_one else "1)"
        raise ConfigError(f"run-config key '{key}' must be in (0, {hi}, got {value}")


T = TypeVar("T")


def method_config(cls: type[T], run_config: Mapping[str, Any]) -> T:
    """Parse a method's frozen dataclass from the kebab-case run config.

    Field ``foo_bar`` reads key ``foo-bar``; missing keys keep the dataclass default. If the dataclass
    defines ``validate()``, it is called (it should raise :class:`ConfigError` naming the key).
    """
    kwargs = {}
    for f in fields(cls):  # type: ignore[arg-type]
        key = _kebab(f.name)
        if key in run_config:
            kwargs[f.name] = _coerce(key, run_config[key], f.type)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


PROJECT_ROOT = Path(__file__).resolve().parent.parent


def load_defaults(pyproject: Path | None = None) -> dict[str, Any]:
    """The ``[tool.flwr.app.config]`` table of the project's pyproject.toml (the run defaults)."""
    path = pyproject or PROJECT_ROOT / "pyproject.toml"
    if not path.exists():
        raise ConfigError(f"cannot read run-config defaults: {path} does not exist")
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    return dict(data["tool"]["flwr"]["app"]["config"])


def resolve_run_config(overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Defaults from pyproject.toml updated with ``overrides``; unknown keys are an error."""
    values = load_defaults()
    for key, value in (overrides or {}).items():
        if key not in values:
            raise ConfigError(f"unknown run-config key '{key}' (not declared in pyproject.toml)")
        values[key] = value
    return values
