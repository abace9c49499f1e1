"""Independent Synthetic federations (issue 43 item 3): with ``synthetic-federation = 'per-seed'`` every run seed
generates its own clients, so seeds differ in data (distinct client-split digests) and a tuning seed's trials
never evaluate a sample a reported seed tests on; ``'fixed'`` (the default) keeps one federation for all seeds."""

from __future__ import annotations

import numpy as np

from data_partitioning.federated import (client_arrays, client_indices, data_seed, global_test_set, split_digest,
                                         synthetic_seed, validation_set)
from data_partitioning.synthetic import synthetic_client
from flcore.config import RunConfig, resolve_run_config

K = 6


def cfg(seed: int, federation: str = "per-seed", **extra) -> RunConfig:
    values = {"method": "fedavg", "dataset": "synthetic", "partition": "power-law", "model": "logistic",
              "synthetic-alpha": 0.5, "synthetic-beta": 0.5, "seed": seed, "synthetic-federation": federation}
    values.update(extra)
    return RunConfig.from_dict(resolve_run_config(values))


def rows(x: np.ndarray) -> set[bytes]:
    return {r.tobytes() for r in np.ascontiguousarray(x)}


def test_the_fixed_federation_is_one_dataset_for_every_seed():
    a, b = cfg(0, "fixed"), cfg(7, "fixed")
    assert synthetic_seed(a) == synthetic_seed(b) == data_seed("synthetic")
    assert split_digest(a, K) == split_digest(b, K)  # no validation split: the seed changes nothing in the data
    xa, ya = global_test_set(a, K)
    xb, yb = global_test_set(b, K)
    assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    ref = synthetic_client(0.5, 0.5, data_seed("synthetic"), 2, max_samples=a.synthetic_max_samples)
    assert np.array_equal(client_arrays(a, 2, K).x_train, ref[0][client_indices(a, 2, K)[0]])


def test_per_seed_federations_differ_in_data_and_repeat_per_seed():
    seeds = range(5)
    digests = {split_digest(cfg(s), K) for s in seeds}
    assert len(digests) == 5
    assert len({synthetic_seed(cfg(s)) for s in seeds}) == 5
    again = client_arrays(cfg(3), 1, K)
    first = client_arrays(cfg(3), 1, K)
    assert np.array_equal(again.x_train, first.x_train) and np.array_equal(again.y_test, first.y_test)
    assert split_digest(cfg(3), K) == split_digest(cfg(3), K)
    x0, x1 = client_arrays(cfg(0), 1, K).x_train, client_arrays(cfg(1), 1, K).x_train
    assert not rows(x0) & rows(x1)  # other generated points, not a reshuffle of the same ones


def test_a_tuning_seed_never_sees_a_reported_seeds_test_samples():
    reported = [cfg(s, **{"validation-fraction": 0.2}) for s in range(3)]
    tuning = cfg(100, **{"validation-fraction": 0.2})
    tuned_on = rows(validation_set(tuning, K)[0])
    tuned_on |= rows(np.concatenate([client_arrays(tuning, c, K).x_train for c in range(K)]))
    tuned_on |= rows(global_test_set(tuning, K)[0])  # what a tuning trial evaluates P-FL/G-FL on
    for r in reported:
        assert not tuned_on & rows(global_test_set(r, K)[0])
    # the fixed federation is the case this replaces: there the tuning seed's local splits are the test set
    fixed_tuning, fixed_reported = cfg(100, "fixed"), cfg(0, "fixed")
    assert rows(global_test_set(fixed_tuning, K)[0]) == rows(global_test_set(fixed_reported, K)[0])


def test_the_g_fl_test_set_is_the_union_of_that_federations_local_test_splits():
    c = cfg(4, **{"local-test-fraction": 0.2})
    x, y = global_test_set(c, K)
    parts = [client_arrays(c, k, K) for k in range(K)]
    assert np.array_equal(x, np.concatenate([p.x_test for p in parts]))
    assert np.array_equal(y, np.concatenate([p.y_test for p in parts]))
    assert not rows(x) & rows(np.concatenate([p.x_train for p in parts]))
