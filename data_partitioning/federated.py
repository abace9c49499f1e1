"""From run config to one client's arrays, and to the server's global test set.

``client_arrays(cfg, cid, num_partitions)``: partition the pool (cached per process and per setting, so
a Ray worker partitions once, not every round; ``iid``, ``dirichlet`` and ``shards`` by flwr-datasets'
partitioners, data_partitioning/flower.py, ``classes`` and ``power-law`` by our own), take client ``cid``'s part, hold out ``local-test-fraction``
of it as the client's local test split (P-FL; 0 = none, every sample trains) and then ``validation-fraction`` of
the rest as its validation split (hyper-parameter tuning; never trained on), both seeded by (seed, cid). ``rotated-mnist`` rotates client k's images by k * rotation-step-deg.
``synthetic`` generates client k's data directly. ``node_arrays(path)`` reads a node-local ``.npz`` for
deployments (see docs/DEPLOYMENT.md for the format).

Test data is fixed per dataset (``data_seed``), never drawn from the run or tuning seed, as a real dataset's
test split is: the torchvision sets use their official test set; mnist-5k / rotated-mnist / digits hold out
``global-test-fraction`` of the pool with the dataset's own seed; ``synthetic`` generates one fixed federation
(the dataset's seed) whose per-client held-out parts form the G-FL test set, or with ``synthetic-federation =
'per-seed'`` one federation per run seed (its own clients and test set: independent federations). The run seed draws the partition of
the remaining training pool, the validation and local test splits, the model and the client sampling.
"""

from __future__ import annotations

import functools
import hashlib
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_partitioning import partitioners as P
from data_partitioning.datasets import DatasetError, dataset_shape, load_pool
from data_partitioning.flower import FLOWER_PARTITIONS, flower_partition
from data_partitioning.synthetic import synthetic_client
from flcore.config import RunConfig


@dataclass(frozen=True)
class ClientArrays:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None


_SAME_DATA = {"rotated-mnist": "mnist-5k"}  # rotated-mnist rotates mnist-5k's images: the same split


def data_seed(dataset: str) -> int:
    """The fixed seed of ``dataset``'s test split (and of ``synthetic``'s generated federation): CRC-32 of the
    dataset's name (rotated-mnist uses mnist-5k's), the same for every run and tuning seed."""
    return zlib.crc32(_SAME_DATA.get(dataset, dataset).encode())


def _pool(cfg: RunConfig):
    return load_pool(cfg.dataset, data_seed(cfg.dataset), cfg.global_test_fraction, cfg.data_root, cfg.download)


@functools.lru_cache(maxsize=32)  # index arrays only: 32 paper-scale partitions are ~16 MB
def _partition(dataset: str, partition: str, seed: int, num_partitions: int, alpha: float, shards: int,
               classes: int, per_class: int, exponent: float, min_size: int, test_fraction: float,
               data_root: str, download: bool) -> tuple[np.ndarray, ...]:
    labels = load_pool(dataset, data_seed(dataset), test_fraction, data_root, download).y_train
    if partition in FLOWER_PARTITIONS:  # flwr-datasets' own partitioner, seeded with the run seed
        return tuple(flower_partition(labels, partition, num_partitions, seed, alpha=alpha, shards=shards,
                                      min_size=min_size))
    rng = np.random.default_rng([int(seed), 0x9A27])  # the run seed draws the partition of the training pool
    if partition == "classes":
        parts = P.classes(labels, num_partitions, classes, per_class, rng)
    elif partition == "power-law":
        parts = P.power_law(labels, num_partitions, exponent, rng, min_size)
    else:
        raise P.PartitionError(f"partition '{partition}' does not apply to dataset '{dataset}'")
    return tuple(parts)


def partition_indices(cfg: RunConfig, num_partitions: int) -> tuple[np.ndarray, ...]:
    return _partition(cfg.dataset, cfg.partition, cfg.seed, num_partitions, cfg.dirichlet_alpha,
                      cfg.shards_per_client, cfg.classes_per_client, cfg.samples_per_class,
                      cfg.power_law_exponent, cfg.min_partition_size, cfg.global_test_fraction,
                      cfg.data_root, cfg.download)


def rotate(x: np.ndarray, degrees: float) -> np.ndarray:
    """Rotate a batch of images (N, C, H, W) counter-clockwise by ``degrees``."""
    if degrees % 360 == 0 or len(x) == 0:
        return x
    import torch
    import torchvision.transforms.functional as TF

    return TF.rotate(torch.from_numpy(x), float(degrees)).numpy()


def client_angle(cfg: RunConfig, cid: int) -> float:
    return (cid * cfg.rotation_step_deg) % 360.0


def synthetic_seed(cfg: RunConfig) -> int:
    """The seed that generates ``synthetic``'s federation: the dataset's fixed seed (``synthetic-federation =
    'fixed'``), or one derived from it and the run seed (``'per-seed'``: each run seed its own clients, own local
    test splits and so its own G-FL test set)."""
    if cfg.synthetic_federation == "fixed":
        return data_seed("synthetic")
    return int(np.random.SeedSequence([data_seed("synthetic"), int(cfg.seed)]).generate_state(1)[0])


def synthetic_data(cfg: RunConfig, cid: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``cid``'s generated Synthetic(alpha, beta) data (data_partitioning/synthetic.py) under ``cfg``."""
    return synthetic_client(cfg.synthetic_alpha, cfg.synthetic_beta, synthetic_seed(cfg), cid,
                            max_samples=cfg.synthetic_max_samples, prior_scale=cfg.synthetic_prior_scale)


def held_out_fraction(cfg: RunConfig) -> float:
    """Share of a client's partition held out as its local test split: ``local-test-fraction``, except for
    ``synthetic``, whose test set is by definition (FedProx) the union of per-client held-out parts: there it is
    ``local-test-fraction`` if set, else ``global-test-fraction``."""
    if cfg.dataset == "synthetic" and cfg.local_test_fraction == 0:
        return cfg.global_test_fraction
    return cfg.local_test_fraction


def client_indices(cfg: RunConfig, cid: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Client ``cid``'s (train, local test, validation) samples as indices: into the pool's training part, or
    for ``synthetic`` into client ``cid``'s generated data. Its local test split is drawn with the run seed
    (a part of the run's partition), except for ``synthetic``, whose held-out parts are the G-FL test set and
    therefore drawn with the seed that generated the federation (:func:`synthetic_seed`)."""
    if not 0 <= cid < num_partitions:
        raise DatasetError(f"partition-id {cid} is out of range for num-partitions={num_partitions}")
    if cfg.dataset == "synthetic":
        n = len(synthetic_data(cfg, cid)[1])
        idx, split_seed = np.arange(n), synthetic_seed(cfg)
    else:
        idx, split_seed = partition_indices(cfg, num_partitions)[cid], int(cfg.seed)
    tr, te = P.local_split(len(idx), held_out_fraction(cfg), np.random.default_rng([split_seed, int(cid), 0x5917]))
    keep, val = P.local_split(len(tr), cfg.validation_fraction, np.random.default_rng([int(cfg.seed), int(cid), 0x7A11]))
    return idx[tr[keep]], idx[te], idx[tr[val]]


def split_digest(cfg: RunConfig, num_partitions: int) -> str:
    """16 hex digits of sha256 over every client's (train, local test, validation) indices as
    :func:`client_indices` draws them for ``cfg`` over ``num_partitions`` clients: the same digest means the same
    client data. experiments/run.py records it beside each run and redoes a run whose split is no longer the one
    its config draws (as when iid/dirichlet/shards moved to flwr-datasets' partitioners, issue 33)."""
    h = hashlib.sha256(f"{cfg.dataset}|{num_partitions}".encode())
    if cfg.dataset == "synthetic" and cfg.synthetic_federation == "per-seed":  # same indices, other generated data
        h.update(f"|generated by {synthetic_seed(cfg)}".encode())
    for cid in range(num_partitions):
        for part in client_indices(cfg, cid, num_partitions):
            h.update(np.asarray(part, dtype=np.int64).tobytes())
            h.update(b"|")
    return h.hexdigest()[:16]


def client_arrays(cfg: RunConfig, cid: int, num_partitions: int) -> ClientArrays:
    tr, te, va = client_indices(cfg, cid, num_partitions)
    if cfg.dataset == "synthetic":
        x, y = synthetic_data(cfg, cid)
        num_classes = dataset_shape("synthetic")[1]
    else:
        pool = _pool(cfg)
        x, y = pool.x_train, pool.y_train
        num_classes = pool.num_classes
        if cfg.dataset == "rotated-mnist":
            angle = client_angle(cfg, cid)
            return ClientArrays(rotate(x[tr], angle), y[tr], rotate(x[te], angle), y[te], num_classes,
                                rotate(x[va], angle), y[va])
    return ClientArrays(x[tr], y[tr], x[te], y[te], num_classes, x[va], y[va])


def validation_set(cfg: RunConfig, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """The union of the clients' validation splits (``validation-fraction`` of each client's training data):
    what tuning selects on. Only a simulation can build it (the server derives every client's split from the
    seed); empty when validation-fraction is 0."""
    parts = [client_arrays(cfg, cid, num_clients) for cid in range(num_clients)]
    return np.concatenate([a.x_val for a in parts]), np.concatenate([a.y_val for a in parts])


def global_test_set(cfg: RunConfig, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """The G-FL test set. synthetic: the union of the clients' local test splits (as in FedProx);
    rotated-mnist: test image i rotated by client (i mod K)'s angle; otherwise the pool's test split."""
    if cfg.dataset == "synthetic":
        xs, ys = [], []
        for cid in range(num_clients):
            arr = client_arrays(cfg, cid, num_clients)
            xs.append(arr.x_test)
            ys.append(arr.y_test)
        return np.concatenate(xs), np.concatenate(ys)
    pool = _pool(cfg)
    if cfg.dataset == "rotated-mnist":
        x = pool.x_test.copy()
        for k in range(max(num_clients, 1)):
            sel = np.arange(k, len(x), max(num_clients, 1))
            x[sel] = rotate(x[sel], client_angle(cfg, k))
        return x, pool.y_test
    return pool.x_test, pool.y_test


def node_arrays(path: str, test_fraction: float, seed: int) -> ClientArrays:
    """Node-local data for deployments: an ``.npz`` with ``x`` and ``y`` (split 75/25 here) or with
    ``x_train, y_train, x_test, y_test``; optional ``num_classes``. x is float32 (N, ...) already normalised."""
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"node data file '{path}' (node-config data-path) does not exist")
    with np.load(p) as z:
        keys = set(z.files)
        if {"x_train", "y_train", "x_test", "y_test"} <= keys:
            xtr, ytr, xte, yte = (z[k] for k in ("x_train", "y_train", "x_test", "y_test"))
        elif {"x", "y"} <= keys:
            tr, te = P.local_split(len(z["y"]), test_fraction, np.random.default_rng([int(seed), 0x5917]))
            xtr, ytr, xte, yte = z["x"][tr], z["y"][tr], z["x"][te], z["y"][te]
        else:
            raise DatasetError(f"node data file '{path}' must hold arrays x, y or x_train, y_train, x_test, y_test; "
                               f"found {sorted(keys)}")
        ncls = int(z["num_classes"]) if "num_classes" in keys else int(max(ytr.max(), yte.max()) + 1)
    return ClientArrays(xtr.astype(np.float32), ytr.astype(np.int64), xte.astype(np.float32),
                        yte.astype(np.int64), ncls)
