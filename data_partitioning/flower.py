"""Partitions through Flower Datasets' partitioners (issue 33 item 3), on in-memory datasets built from our arrays.

Where flwr-datasets has the partition we offer, the split is flwr-datasets' own, drawn as a Flower user's
``FederatedDataset(..., partitioners={"train": P}, shuffle=True, seed=seed)`` draws it: the training pool as a
``datasets.Dataset`` (a ``label`` column and the pool ``index`` of each row), shuffled with the run seed (what
FederatedDataset does before partitioning), then partitioned by P seeded with the run seed; each client's
partition is handed back as sorted pool indices. Offline: nothing is downloaded.

=================  ===========================================================================================
our ``partition``  flwr-datasets partitioner
=================  ===========================================================================================
``iid``            ``IidPartitioner(K)``: the shuffled pool in K contiguous parts (sizes differ by at most 1)
``dirichlet``      ``DirichletPartitioner(K, "label", alpha=dirichlet-alpha, min_partition_size=
                   min-partition-size, self_balancing=False, seed=seed)``: per class, shares ~ Dir(alpha 1_K);
                   redrawn (at most 10 times) until every client holds min-partition-size samples
``shards``         ``ShardPartitioner(K, "label", num_shards_per_partition=shards-per-client, seed=seed)``:
                   label-sorted pool in K*s shards of floor(n / (K*s)) samples, s random shards per client; the
                   n mod (K*s) samples that fill no shard are left out, as in flwr-datasets
=================  ===========================================================================================

Kept as our own (data_partitioning/partitioners.py), because flwr-datasets has no equivalent:
``classes`` (exactly samples-per-class samples of each of classes-per-client classes per client, a subsample:
flwr-datasets' PathologicalPartitioner gives each client all of its classes' samples, shared evenly among the
clients that hold the class), ``power-law`` (power-law sizes whose number of classes grows with the size:
flwr-datasets' Size/Exponential/Linear/Square partitioners set sizes only, with IID labels) and ``natural``
(synthetic's generated clients: no pool to partition).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from data_partitioning.partitioners import PartitionError, check_sizes

FLOWER_PARTITIONS = ("iid", "dirichlet", "shards")


def pool_dataset(labels: np.ndarray, seed: int):
    """The training pool as a ``datasets.Dataset`` (``label``, ``index``), shuffled with ``seed`` as
    FederatedDataset shuffles a dataset before partitioning it. In the Arrow format: a column then reads as one
    Arrow array (the python format's lazy column is read row by row, 7x slower over 60,000 labels; the same
    rows either way)."""
    import datasets

    labels = np.asarray(labels, dtype=np.int64)
    ds = datasets.Dataset.from_dict({"label": labels, "index": np.arange(len(labels), dtype=np.int64)})
    return ds.shuffle(seed=int(seed)).with_format("arrow")


def make_partitioner(partition: str, num_partitions: int, seed: int, *, alpha: float = 0.5, shards: int = 2,
                     min_size: int = 1) -> Any:
    """The flwr-datasets partitioner of ``partition`` (one of FLOWER_PARTITIONS)."""
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, ShardPartitioner

    if partition == "iid":
        return IidPartitioner(num_partitions=num_partitions)
    if partition == "dirichlet":
        return DirichletPartitioner(num_partitions=num_partitions, partition_by="label", alpha=float(alpha),
                                    min_partition_size=max(int(min_size), 1), self_balancing=False, seed=int(seed))
    if partition == "shards":
        return ShardPartitioner(num_partitions=num_partitions, partition_by="label",
                                num_shards_per_partition=int(shards), seed=int(seed))
    raise PartitionError(f"partition '{partition}' has no flwr-datasets partitioner here (those that do: "
                         f"{', '.join(FLOWER_PARTITIONS)})")


def _setting(partition: str, alpha: float, shards: int) -> str:
    return {"dirichlet": f"partition 'dirichlet' (dirichlet-alpha={alpha})",
            "shards": f"partition 'shards' (shards-per-client={shards})"}.get(partition, f"partition '{partition}'")


def flower_partition(labels: np.ndarray, partition: str, num_partitions: int, seed: int, *, alpha: float = 0.5,
                     shards: int = 2, min_size: int = 1) -> list[np.ndarray]:
    """Every client's part of the pool (sorted pool indices) as flwr-datasets splits it; a PartitionError naming
    the setting when it cannot (or a client would hold fewer than ``min_size`` samples)."""
    partitioner = make_partitioner(partition, num_partitions, seed, alpha=alpha, shards=shards, min_size=min_size)
    partitioner.dataset = pool_dataset(labels, seed)
    what = _setting(partition, alpha, shards)
    try:
        with warnings.catch_warnings():  # each Dirichlet redraw warns; the outcome is what matters
            warnings.simplefilter("ignore", UserWarning)
            parts = [np.sort(partitioner.load_partition(k)["index"].to_numpy().astype(np.int64, copy=False))
                     for k in range(num_partitions)]
    except ValueError as exc:
        raise PartitionError(f"{what} over {num_partitions} clients: flwr-datasets refused it ({exc}); use fewer "
                             "clients or change the partition settings") from None
    return check_sizes(parts, min_size, what)
