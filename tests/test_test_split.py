"""Test data fixed per dataset (issue 31, item 7): the G-FL test set does not move with the run or tuning seed,
and no test sample a ledger row reports on is in any of its tuning trials' training or validation data."""

from __future__ import annotations

import itertools

import tomllib

import numpy as np
import pytest

from data_partitioning.federated import client_arrays, data_seed, global_test_set
from experiments.claims import CLAIMS, load_claims
from experiments.run import load_experiment
from flcore.config import PROJECT_ROOT, RunConfig, resolve_run_config

CONFIGS = PROJECT_ROOT / "experiments" / "configs"


def _cfg(values: dict) -> RunConfig:
    return RunConfig.from_dict(resolve_run_config(values))


def _rows(x: np.ndarray) -> set[bytes]:
    """Each sample's bytes: the identity of an image or feature vector (mnist-5k, digits and Synthetic hold
    no two equal samples, so equal bytes mean the same sample)."""
    flat = np.ascontiguousarray(x.reshape(len(x), -1))
    return {row.tobytes() for row in flat}


@pytest.mark.parametrize("dataset,partition", [("mnist-5k", "dirichlet"), ("rotated-mnist", "dirichlet"),
                                               ("digits", "dirichlet"), ("synthetic", "power-law")])
def test_the_global_test_set_is_the_same_for_every_seed(dataset, partition):
    base = {"dataset": dataset, "partition": partition, "dirichlet-alpha": 0.1}
    x0, y0 = global_test_set(_cfg({**base, "seed": 0}), 10)
    for seed, vf in ((1, 0.0), (100, 0.2), (7, 0.5)):
        x, y = global_test_set(_cfg({**base, "seed": seed, "validation-fraction": vf}), 10)
        np.testing.assert_array_equal(x, x0)
        np.testing.assert_array_equal(y, y0)
    a, b = client_arrays(_cfg({**base, "seed": 0}), 0, 10), client_arrays(_cfg({**base, "seed": 1}), 0, 10)
    if dataset == "synthetic":  # one fixed federation: its clients' data does not follow the seed either
        np.testing.assert_array_equal(a.x_train, b.x_train)
    else:  # the training data follows the seed: another seed partitions the same pool differently
        assert a.x_train.shape != b.x_train.shape or not np.array_equal(a.x_train, b.x_train)


def test_data_seed_is_fixed_per_dataset():
    import zlib

    assert data_seed("mnist-5k") == data_seed("rotated-mnist") == zlib.crc32(b"mnist-5k")
    assert data_seed("digits") != data_seed("mnist-5k") != data_seed("synthetic")


def _experiments() -> list[str]:
    return sorted({c.experiment for c in load_claims(CLAIMS)})


@pytest.mark.parametrize("experiment", _experiments())
def test_no_reported_test_sample_is_in_any_tuning_trials_training_or_validation_data(experiment):
    doc = load_experiment(CONFIGS / f"{experiment}.toml")
    plan, exp = doc["tuning"], doc["experiment"]
    n = int(exp["num-supernodes"])
    min_seeds = min(c.min_seeds for c in load_claims(CLAIMS) if c.experiment == experiment)  # 5 unless declared
    assert not set(plan.seeds) & set(exp["seeds"]) and len(exp["seeds"]) >= min_seeds >= 3
    # rotation only turns images: compare the unrotated samples (the same ones, by the same indices)
    unrotate = {"rotation-step-deg": 0.0}
    reported: set[bytes] = set()
    for seed in exp["seeds"]:
        for over in doc["runs"].values():
            x, _ = global_test_set(_cfg({**doc["base"], **over, **unrotate, "seed": seed}), n)
            reported |= _rows(x)
    assert len(reported) == len(x)  # one test set for every seed and run
    for label, over in doc["runs"].items():
        # the data does not depend on lr or knobs; it does on the tuning seed: each tuning federation is checked
        for trial, tuning_seed in itertools.product(plan.trials(label)[:1] + plan.trials(label)[-1:], plan.seeds):
            cfg = _cfg({**doc["base"], **over, **trial, **unrotate, "seed": tuning_seed,
                        "validation-fraction": plan.validation_fraction, "test-evaluation": False})
            seen: set[bytes] = set()
            for cid in range(n):
                arr = client_arrays(cfg, cid, n)
                assert len(arr.x_val) > 0 or len(arr.x_train) < 2
                seen |= _rows(arr.x_train) | _rows(arr.x_val)
            assert len(seen) > 0
            assert not reported & seen, f"{experiment}/{label}: {len(reported & seen)} test samples in tuning data"


def test_the_check_would_catch_a_seed_dependent_split():
    """The previous split (the pool's test part drawn with the run seed) put most of a reported seed's test
    images into the tuning seed's training pool: the same byte comparison finds them."""
    from data_partitioning.datasets import load_pool

    reported = _rows(load_pool("mnist-5k", 0, 0.2).x_test)
    tuning_pool = _rows(load_pool("mnist-5k", 100, 0.2).x_train)
    assert len(reported & tuning_pool) > 0.7 * len(reported)


def test_committed_claim_configs_keep_tuning_and_reported_seeds_apart():
    for experiment in _experiments():
        with (CONFIGS / f"{experiment}.toml").open("rb") as fh:
            doc = tomllib.load(fh)
        tuning = doc["tuning"]
        assert ("seed" in tuning) != ("seeds" in tuning), experiment
        assert not set(tuning.get("seeds", [tuning.get("seed")])) & set(doc["experiment"]["seeds"]), experiment


SEED_CONFIG = """
[experiment]
name = "tiny-seeds"
seeds = [0, 100]
num-supernodes = 3
[base]
dataset = "digits"
[runs.fedavg]
method = "fedavg"
[tuning]
seed = 100
lr = [0.01]
"""


def test_a_tuning_seed_that_is_also_reported_is_refused_naming_both(tmp_path, monkeypatch):
    import experiments.run as run_mod
    from flcore.config import ConfigError

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(SEED_CONFIG)
    with pytest.raises(ConfigError, match=r"tuning seed 100 .*also a reported seed .*seeds = \[0, 100\]"):
        load_experiment(cfg)
    cfg.write_text(SEED_CONFIG.replace("seeds = [0, 100]", "seeds = [0]"))
    monkeypatch.setattr(run_mod, "RESULTS_ROOT", tmp_path / "results")
    with pytest.raises(ConfigError, match=r"tuning seed 100 .*--seeds = \[1, 100\]"):
        run_mod.main([str(cfg), "--seeds", "1", "100"])
