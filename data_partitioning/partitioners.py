"""Our own partitioners: pure functions ``labels -> list of index arrays`` (one per client), seeded by ``rng``:
the partitions flwr-datasets has no equivalent of (``classes``, ``power-law``; data_partitioning/flower.py says
why). ``iid``, ``dirichlet`` and ``shards`` are flwr-datasets' own partitioners (data_partitioning/flower.py).

Every partitioner raises :class:`PartitionError` naming the setting when a client would end up with
fewer than ``min_size`` samples, instead of handing a client an empty dataset.
"""

from __future__ import annotations

import math

import numpy as np


class PartitionError(ValueError):
    pass


def check_sizes(parts: list[np.ndarray], min_size: int, what: str) -> list[np.ndarray]:
    """``parts``, or a PartitionError naming the first client below ``min_size`` (at least 1) samples."""
    small = [(k, len(p)) for k, p in enumerate(parts) if len(p) < max(min_size, 1)]
    if small:
        k, n = small[0]
        raise PartitionError(f"{what} leaves client {k} with {n} samples (< min-partition-size={max(min_size, 1)}); "
                             f"{len(small)} client(s) affected: use fewer clients or change the partition settings")
    return parts


def classes(labels: np.ndarray, num_clients: int, classes_per_client: int, samples_per_class: int,
            rng: np.random.Generator) -> list[np.ndarray]:
    """Each client gets ``classes_per_client`` classes with ``samples_per_class`` distinct samples each.

    The neural-collapse paper's "C10-100-5" setting. Classes are dealt round-robin from a random class
    order so every class is used about equally; samples are never shared between clients.
    """
    labels = np.asarray(labels)
    all_classes = np.unique(labels)
    if classes_per_client > len(all_classes):
        raise PartitionError(f"classes-per-client={classes_per_client} exceeds the {len(all_classes)} classes")
    pools = {int(c): list(rng.permutation(np.flatnonzero(labels == c))) for c in all_classes}
    order = rng.permutation(all_classes)
    need: dict[int, int] = {int(c): 0 for c in all_classes}
    plan = []
    for k in range(num_clients):
        mine = [int(order[(k * classes_per_client + j) % len(order)]) for j in range(classes_per_client)]
        plan.append(mine)
        for c in mine:
            need[c] += samples_per_class
    short = {c: (need[c], len(pools[c])) for c in need if need[c] > len(pools[c])}
    if short:
        c, (want, have) = next(iter(short.items()))
        raise PartitionError(
            f"partition 'classes' needs {want} samples of class {c} ({num_clients} clients x classes-per-client="
            f"{classes_per_client} x samples-per-class={samples_per_class} spread over the classes) but the "
            f"dataset has {have}: lower samples-per-class or the number of clients")
    parts = []
    for mine in plan:
        idx = []
        for c in mine:
            idx.extend(pools[c][:samples_per_class])
            del pools[c][:samples_per_class]
        parts.append(np.sort(np.asarray(idx, dtype=np.int64)))
    return parts


def power_law(labels: np.ndarray, num_clients: int, exponent: float, rng: np.random.Generator,
              min_size: int = 1) -> list[np.ndarray]:
    """Power-law sizes, more classes for head clients (FedBC's setting, after Stripelis & Ambite 2020).

    Client k (0 = head) gets a share proportional to (k+1)^(-exponent) of the data and
    ceil(C * n_k / n_0) classes chosen at random; its samples are drawn evenly from those classes'
    remaining pools (without replacement across clients). Client order is then shuffled.
    """
    labels = np.asarray(labels)
    all_classes = np.unique(labels)
    n_cls = len(all_classes)
    weights = (np.arange(1, num_clients + 1, dtype=np.float64)) ** (-exponent)
    sizes = np.maximum(np.floor(weights / weights.sum() * len(labels)).astype(int), max(min_size, 1))
    pools = {int(c): list(rng.permutation(np.flatnonzero(labels == c))) for c in all_classes}
    parts = []
    for k in range(num_clients):
        n_k = int(sizes[k])
        c_k = max(1, min(n_cls, math.ceil(n_cls * n_k / sizes[0])))
        mine = [int(c) for c in rng.choice(all_classes, size=c_k, replace=False)]
        idx: list[int] = []
        per = [n_k // c_k + (1 if j < n_k % c_k else 0) for j in range(c_k)]
        for c, want in zip(mine, per):
            take = pools[c][:want]
            del pools[c][:want]
            idx.extend(take)
        if len(idx) < n_k:  # chosen classes ran dry: top up from the fullest remaining classes
            for c in sorted(pools, key=lambda c: -len(pools[c])):
                extra = n_k - len(idx)
                if extra <= 0:
                    break
                idx.extend(pools[c][:extra])
                del pools[c][:extra]
        parts.append(np.sort(np.asarray(idx, dtype=np.int64)))
    perm = rng.permutation(num_clients)
    return check_sizes([parts[i] for i in perm], min_size, f"partition 'power-law' (exponent={exponent})")


def local_split(n: int, test_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A client's own train/held-out split (positions into its partition). ``test_fraction = 0``: nothing is
    held out (every sample trains); otherwise at least one sample on each side."""
    if test_fraction <= 0:
        return np.arange(n), np.arange(0)
    perm = rng.permutation(n)
    n_test = min(max(1, int(round(test_fraction * n))), n - 1) if n > 1 else 0
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])
