"""A server-side support set: a fixed, seeded sample of the clients' training pool.

The server holds no client's training data, but a model that evaluates each test sample against a support
set of training data (FedRANE's inductive LRA evaluation, models/evaluation.py) needs one for the G-FL
evaluation. In simulation (and in any run whose server can read the run's dataset) the server re-derives
the clients' training splits from the run config, as the clients do (``client_arrays``: partition, local test
and validation hold-outs, rotations), and draws ``size`` rows uniformly without replacement from their
union, seeded by the run's seed: the same rows in every round and on every engine. In a deployment whose
nodes read their own files (``data-path``) this is a sample of the named dataset's training split
partitioned as configured: a proxy set held by the server, not the nodes' data.
"""

from __future__ import annotations

import numpy as np

from data_partitioning.federated import client_arrays
from flcore.config import RunConfig

SUPPORT_STREAM = 0x5E4  # seed-stream tag of the support sample (independent of partitions and splits)


def training_pool_sample(cfg: RunConfig, num_clients: int, size: int) -> np.ndarray:
    """``size`` training rows (all of them if fewer) drawn uniformly from the union of the ``num_clients``
    clients' training splits, in client order then row order."""
    if num_clients < 1 or size < 1:
        raise ValueError(f"a support sample needs clients and a size >= 1 (got {num_clients} clients, size {size})")
    sizes = np.array([client_arrays(cfg, cid, num_clients).y_train.shape[0] for cid in range(num_clients)])
    total = int(sizes.sum())
    if total == 0:
        raise ValueError("the clients' training splits are empty: no support set can be drawn")
    rng = np.random.default_rng([int(cfg.seed), SUPPORT_STREAM])
    picks = np.sort(rng.choice(total, min(size, total), replace=False))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    owners = np.searchsorted(starts, picks, side="right") - 1
    rows = []
    for cid in np.unique(owners):
        x = client_arrays(cfg, int(cid), num_clients).x_train
        rows.append(x[picks[owners == cid] - starts[cid]])
    return np.concatenate(rows)
