"""FedBR's globally shared pseudo-data sets, built once per run on every node from the run config alone.

Alg. 1 line 3 sends "D_p (optional) to all clients"; the authors' simulation builds one set in the driver
(scripts/train_fed.py lines 348-355) that every client uses. Here every node builds the identical set
deterministically instead of receiving it: the seed is derived from the run seed (and the round when the set is
rebuilt every round), never from the client id, and the sources are:

- :func:`proxy_set`   Mixture's x_p: means of images of a proxy dataset (read from ``data-root`` like any of our
                      datasets; a node of a real deployment needs that public dataset's files, nothing else), or a
                      generated noise set;
- :func:`shared_rsm`  the authors' one RSM set over every client's training data, which only a node that can
                      derive every client's partition (``partition-id`` + ``num-partitions``: a simulation, or a
                      deployment over one of our datasets) can build.

Both are cached per process (a node builds each once per run config and round seed).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from client_app.trainers.fedbr.pseudo_data import (fit_shape, proxy_means, proxy_samples,
                                                   shared_rsm_pseudo_data)
from flcore.config import RunConfig
from flcore.methods.fedbr import GENERATED_PROXIES, FedBRConfig


def set_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across processes, unlike hash())."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> np.uint64(1))


def proxy_seed(cfg: RunConfig, fb: FedBRConfig, server_round: int) -> int:
    """The proxy set's seed: the run seed, and the round only when the set is rebuilt every round."""
    return set_seed(cfg.seed, 0 if fb.pseudo_refresh == "once" else server_round, 11)


class ProxyDataError(ValueError):
    """The proxy dataset cannot be read or cannot stand in for the run's inputs (names the key and dataset)."""


def _proxy_images(name: str, test_fraction: float, data_root: str, download: bool) -> torch.Tensor:
    """The proxy dataset's training images, read past load_pool's per-process cache: only the small proxy set
    built from them stays in memory."""
    from data_partitioning.datasets import load_pool
    from data_partitioning.federated import data_seed

    pool = load_pool.__wrapped__(name, data_seed(name), test_fraction, data_root, download)  # the training part only
    return torch.from_numpy(np.ascontiguousarray(pool.x_train))


@functools.lru_cache(maxsize=16)
def _proxy_set(source: str, shape: tuple[int, ...], size: int, mean_size: int, seed: int, test_fraction: float,
               data_root: str, download: bool, key: str) -> torch.Tensor:
    if source in GENERATED_PROXIES:
        return proxy_samples(shape, size, seed, source)
    try:
        images = _proxy_images(source, test_fraction, data_root, download)
    except Exception as exc:  # DatasetError, or torchvision's own
        raise ProxyDataError(f"run-config key '{key}': the proxy dataset '{source}' is not available "
                             f"(data-root '{data_root}'): {exc}") from exc
    try:
        images = fit_shape(images, shape)
    except ValueError as exc:
        raise ProxyDataError(f"run-config key '{key}': the proxy dataset '{source}' does not fit: {exc}") from exc
    return proxy_means(images, size, mean_size, torch.Generator().manual_seed(seed))


def proxy_set(cfg: RunConfig, fb: FedBRConfig, shape: tuple[int, ...], server_round: int) -> torch.Tensor:
    """Mixture's shared x_p on the CPU: |D_p| samples of input ``shape``, the same on every node of the run."""
    key = f"{fb.NAME}.proxy-dataset" if fb.proxy == "dataset" else f"{fb.NAME}.proxy"
    return _proxy_set(fb.proxy_source(cfg.dataset), tuple(int(s) for s in shape), fb.pseudo_count(cfg.batch_size),
                      fb.proxy_mean_size, proxy_seed(cfg, fb, server_round), cfg.global_test_fraction,
                      cfg.data_root, cfg.download, key)


@functools.lru_cache(maxsize=2)
def client_inputs(cfg: RunConfig, num_clients: int) -> tuple[tuple[torch.Tensor, ...], int]:
    """Every client's training inputs as the run config partitions them (and the number of classes)."""
    from data_partitioning.federated import client_arrays

    arrays = [client_arrays(cfg, cid, num_clients) for cid in range(num_clients)]
    return tuple(torch.from_numpy(np.ascontiguousarray(a.x_train)) for a in arrays), arrays[0].num_classes


@functools.lru_cache(maxsize=4)
def _shared_rsm(cfg: RunConfig, num_clients: int, size: int, subset: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    xs, num_classes = client_inputs(cfg, num_clients)
    return shared_rsm_pseudo_data(list(xs), size, subset, num_classes, torch.Generator().manual_seed(seed))


def shared_rsm(cfg: RunConfig, fb: FedBRConfig, num_clients: int, server_round: int, cid: int,
               own: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' one RSM set (x~, 1/C) over the training data of clients 0 .. num_clients - 1, on the CPU.

    ``own``: this client's training inputs, which must be its partition of the run config's dataset (a node with
    data of its own, node-config data-path, cannot derive the other clients' data: ValueError)."""
    key = f"{fb.NAME}.rsm-scope"
    if num_clients <= 0:
        raise ValueError(f"run-config key '{key}' = 'shared' needs the number of clients from the server, "
                         f"got {num_clients}")
    if not 0 <= cid < num_clients:
        raise ValueError(f"run-config key '{key}' = 'shared': client {cid} is outside the {num_clients} clients "
                         "the server counts")
    xs, _ = client_inputs(cfg, int(num_clients))
    mine = xs[cid]
    if tuple(mine.shape) != tuple(own.shape) or not torch.equal(mine, own.detach().cpu()):
        raise ValueError(f"run-config key '{key}' = 'shared' builds one RSM set over every client's partition of "
                         f"dataset '{cfg.dataset}', but client {cid}'s training data is not its partition (a node "
                         "with data of its own, node-config data-path?): use rsm-scope = 'client'")
    seed = set_seed(cfg.seed, 0 if fb.pseudo_refresh == "once" else server_round, 19)
    return _shared_rsm(cfg, int(num_clients), fb.pseudo_count(cfg.batch_size), fb.rsm_size, seed)
