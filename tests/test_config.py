"""The run config: declared defaults = pyproject.toml, declared bounds enforced with messages naming the key,
unknown and renamed keys refused with a hint, the registry's method names."""

import math
import re
import subprocess
import sys
import tomllib

import pytest
from flwr.common.config import flatten_dict

from flcore.config import PROJECT_ROOT, ConfigError, RunConfig, all_specs, defaults, resolve_run_config
from flcore.methods.fedprox import FedProxConfig
from flcore.registry import get_method, methods


def test_pyproject_tables_equal_the_declared_defaults():
    with open(PROJECT_ROOT / "pyproject.toml", "rb") as fh:
        tables = tomllib.load(fh)["tool"]["flwr"]["app"]["config"]
    flat = flatten_dict(tables)  # what Flower hands the ServerApp as context.run_config
    declared = defaults()
    assert list(flat) == list(declared)
    for key, value in declared.items():
        assert flat[key] == value and type(flat[key]) is type(value), \
            f"default of {key}: pyproject {flat[key]!r} vs declared {value!r}"


def test_pyproject_generator_check_passes():
    done = subprocess.run([sys.executable, "-m", "flcore.pyproject", "--check"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_defaults_parse_to_the_dataclass_defaults():
    cfg = RunConfig.from_dict({})
    assert cfg.to_dict() == defaults()
    assert cfg.lr == 0.03 and cfg.momentum == 0.9 and cfg.method == "fedavg"
    assert cfg.section(FedProxConfig).mu == 0.01


def test_every_key_has_a_doc():
    specs = all_specs()
    assert len(specs) > 100
    for key, spec in specs.items():
        assert spec.doc.strip(), f"run-config key {key} has no doc"
        assert spec.key == key


FLOAT_KEYS = [key for key, spec in all_specs().items() if spec.type == "float"]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_float_keys_refuse_non_finite(key, bad):
    with pytest.raises(ConfigError, match=re.escape(f"run-config key '{key}' got {bad!r}; allowed: ") + ".*finite"):
        RunConfig.from_dict(resolve_run_config({key: bad}))


def test_float_keys_include_method_sections():
    assert {"lr", "fedprox.mu", "fedbc.eta-lambda", "fedetf.alpha", "fedbr.lambda"} <= set(FLOAT_KEYS)


@pytest.mark.parametrize("over,match", [
    ({"method": "fedfoo"}, "run-config key 'method' got 'fedfoo'; allowed: one of "),
    ({"dataset": "imagenet"}, "run-config key 'dataset' got 'imagenet'; allowed: one of mnist, fmnist"),
    ({"partition": "random"}, "run-config key 'partition' got 'random'; allowed: one of iid, dirichlet"),
    ({"lr": -0.1}, "run-config key 'lr' got -0.1; allowed: > 0, finite"),
    ({"fraction-train": 1.5}, "run-config key 'fraction-train' got 1.5; allowed: > 0, <= 1, finite"),
    ({"num-server-rounds": 0}, "run-config key 'num-server-rounds' got 0; allowed: >= 1"),
    ({"momentum": 1.0}, "run-config key 'momentum' got 1.0; allowed: >= 0, < 1, finite"),
    ({"local-epochs": "two"}, "run-config key 'local-epochs' must be a int, got 'two'"),
    ({"fedprox.mu": -1.0}, "run-config key 'fedprox.mu' got -1.0; allowed: >= 0, finite"),
    ({"dataset": "synthetic", "partition": "dirichlet"}, "'partition' must be 'natural' or 'power-law'"),
    ({"partition": "natural"}, "only for dataset 'synthetic'"),
])
def test_bad_config_names_the_key(over, match):
    values = resolve_run_config(over)
    with pytest.raises(ConfigError, match=re.escape(match)):
        RunConfig.from_dict(values)


def test_unknown_key_is_rejected():
    with pytest.raises(ConfigError, match=re.escape("unknown run-config key 'learning-rate'")):
        resolve_run_config({"learning-rate": 0.1})
    with pytest.raises(ConfigError, match=re.escape("unknown run-config key 'learning-rate'")):
        RunConfig.from_dict({"learning-rate": 0.1})


@pytest.mark.parametrize("key,closest", [("fedprox.muu", "fedprox.mu"), ("lrr", "lr"),
                                         ("num-server-round", "num-server-rounds")])
def test_misspelled_key_suggests_the_closest(key, closest):
    with pytest.raises(ConfigError, match=re.escape(f"unknown run-config key '{key}'; did you mean '{closest}'?")):
        resolve_run_config({key: 1})
    with pytest.raises(ConfigError, match=re.escape(f"did you mean '{closest}'?")):
        RunConfig.from_dict({key: 1})


@pytest.mark.parametrize("old,new", [("proximal-mu", "fedprox.mu"), ("fedbc-eta-lambda", "fedbc.eta-lambda"),
                                     ("fedbr-lambda", "fedbr.lambda")])
def test_old_flat_key_names_its_new_name(old, new):
    with pytest.raises(ConfigError, match=re.escape(f"run-config key '{old}' was renamed to '{new}'")):
        resolve_run_config({old: 0.1})
    with pytest.raises(ConfigError, match=re.escape(f"'{old}' was renamed to '{new}'")):
        RunConfig.from_dict({old: 0.1})


def test_every_old_key_maps_to_a_declared_key():
    specs = all_specs()
    olds = {spec.old: key for key, spec in specs.items() if spec.old}
    assert olds["proximal-mu"] == "fedprox.mu"
    for old, new in olds.items():
        assert old not in specs  # an old name is never also a current key
        with pytest.raises(ConfigError, match=re.escape(f"was renamed to '{new}'")):
            resolve_run_config({old: specs[new].default})


def test_registry_names_are_kebab_case_and_complete():
    table = methods()
    for name in ("fedavg", "fedprox", "scaffold", "moon", "feddyn", "qfedavg", "fednova", "fedadam", "fedrane",
                 "fedrane-no-lra", "fedrane-no-gne", "fedbc", "fedbc-finetune", "per-fedbc", "fedufo", "fedbr",
                 "fedetf"):
        assert name in table
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name)
    with pytest.raises(ValueError, match="unknown method 'x'"):
        get_method("x")
