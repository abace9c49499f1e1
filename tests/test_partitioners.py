import numpy as np
import pytest

from data_partitioning import partitioners as P
from data_partitioning.flower import flower_partition


def labels(n_per_class=100, classes=10):
    return np.repeat(np.arange(classes), n_per_class)


def covers_disjointly(parts, n):
    allidx = np.concatenate(parts)
    return len(allidx) == len(set(allidx.tolist())) and allidx.max() < n


def test_iid_sizes_and_determinism():
    y = np.zeros(1000, dtype=int)
    a = flower_partition(y, "iid", 7, seed=1)
    b = flower_partition(y, "iid", 7, seed=1)
    assert [len(p) for p in a] == [143] * 6 + [142]
    assert all((x == z).all() for x, z in zip(a, b))
    assert covers_disjointly(a, 1000) and sum(map(len, a)) == 1000
    assert any((x != z).any() for x, z in zip(a, flower_partition(y, "iid", 7, seed=2)))  # the seed draws it


def label_skew(parts, y):
    """Mean over clients of the largest class share (1.0 = one class per client)."""
    return np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in parts])


def test_dirichlet_skew_follows_alpha():
    y = labels(200)
    skew = {a: label_skew(flower_partition(y, "dirichlet", 10, seed=0, alpha=a), y) for a in (0.1, 0.5, 5.0, 100.0)}
    assert skew[0.1] > skew[0.5] > skew[5.0] > skew[100.0]
    assert skew[0.1] > 0.5 and skew[100.0] < 0.2  # near-IID has ~1/10 max share


def test_dirichlet_uses_every_sample_once_and_is_deterministic():
    y = labels(50)
    a = flower_partition(y, "dirichlet", 8, seed=3, alpha=0.5, min_size=2)
    b = flower_partition(y, "dirichlet", 8, seed=3, alpha=0.5, min_size=2)
    assert covers_disjointly(a, len(y)) and sum(map(len, a)) == len(y)
    assert all((x == z).all() for x, z in zip(a, b))
    assert min(map(len, a)) >= 2


def test_dirichlet_impossible_minimum_is_a_clear_error():
    with pytest.raises(P.PartitionError, match=r"dirichlet-alpha=0.01\) over 40 clients: flwr-datasets refused"):
        flower_partition(labels(5), "dirichlet", 40, seed=0, alpha=0.01, min_size=10)


def test_shards_give_each_client_s_shards_of_at_most_s_classes():
    y = labels(100)
    parts = flower_partition(y, "shards", 20, seed=0, shards=2)
    assert all(len(p) == 50 for p in parts)  # 2 shards of 1000 // 40 = 25 samples
    assert all(len(np.unique(y[p])) <= 2 for p in parts)
    assert covers_disjointly(parts, len(y))
    # 1003 samples: 40 shards of 25, the 3 samples that fill no shard are left out (flwr-datasets' rule)
    parts = flower_partition(np.sort(np.r_[y, [9, 9, 9]]), "shards", 20, seed=0, shards=2)
    assert sum(map(len, parts)) == 1000
    with pytest.raises(P.PartitionError, match="shards"):
        flower_partition(labels(1), "shards", 20, seed=0, shards=2)


def test_classes_partition_exact_classes_and_counts():
    y = labels(100)
    parts = P.classes(y, 20, 5, 10, np.random.default_rng(0))
    for p in parts:
        counts = np.bincount(y[p], minlength=10)
        assert sorted(counts[counts > 0].tolist()) == [10] * 5
    assert covers_disjointly(parts, len(y))
    with pytest.raises(P.PartitionError, match="samples-per-class"):
        P.classes(y, 100, 5, 30, np.random.default_rng(0))


def test_power_law_sizes_decay_and_head_has_more_classes():
    y = labels(300)
    rng = np.random.default_rng(0)
    parts = P.power_law(y, 10, 1.5, rng, min_size=5)
    sizes = sorted(map(len, parts), reverse=True)
    assert sizes[0] > 5 * sizes[-1]
    assert covers_disjointly(parts, len(y))
    by_size = sorted(parts, key=len)
    assert len(np.unique(y[by_size[-1]])) > len(np.unique(y[by_size[0]]))


def test_local_split_is_75_25_and_disjoint():
    tr, te = P.local_split(100, 0.25, np.random.default_rng(0))
    assert len(tr) == 75 and len(te) == 25 and not set(tr) & set(te)
    tr, te = P.local_split(2, 0.25, np.random.default_rng(0))
    assert len(tr) == 1 and len(te) == 1
