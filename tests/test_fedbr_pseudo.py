"""FedBR's pseudo-data sources (issue 40): Mixture's x_p as the sample mean of a proxy DATASET ("the sample mean
of a proxy dataset", the authors' scripts/train_fed.py get_augmentation_proxy_data), the dataset each run's proxy
comes from, and RSM per client (the text) or one set shared by all clients (the authors' code). Values, by hand:
the chosen images' means; invariants: the shared sets equal on every client and in every process."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from client_app.state import ClientState
from client_app.trainers.base import ClientData, TrainJob
from client_app.trainers.fedbr import shared
from client_app.trainers.fedbr.pseudo_data import fit_shape, proxy_means, shared_rsm_pseudo_data
from client_app.trainers.fedbr.shared import ProxyDataError, proxy_seed, proxy_set, set_seed, shared_rsm
from client_app.trainers.fedbr.trainer import FedBRTrainer
from data_partitioning import datasets
from data_partitioning.datasets import load_pool
from data_partitioning.federated import client_arrays, data_seed
from flcore.config import ConfigError, RunConfig, resolve_run_config
from flcore.methods.fedbr import AUTO_PROXY, NUM_CLIENTS, br_config
from models import build_model
from tests.torchvision_fixtures import skip_cifar_md5, write_cifar, write_idx_set

PROJECT_ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def cfg_of(**over) -> RunConfig:
    return RunConfig.from_dict(resolve_run_config({"method": "fedbr", "batch-size": 8, "lr": 0.05, **over}))


def job_of(cfg: RunConfig, cid: int, x: torch.Tensor, y: torch.Tensor, server_round: int = 1,
           config: dict | None = None) -> TrainJob:
    model = build_model(cfg, tuple(x.shape[1:]), 10)
    return TrainJob(cfg, cid, server_round, model, {k: v.clone() for k, v in model.state_dict().items()},
                    ClientData(x, y, x[:2], y[:2], 10), config or {}, {}, ClientState(RecordDict(), cid),
                    torch.device("cpu"), torch.Generator().manual_seed(server_round))


@pytest.fixture(autouse=True)
def fresh_caches():
    shared._proxy_set.cache_clear()
    shared._shared_rsm.cache_clear()
    shared.client_inputs.cache_clear()
    yield
    shared._proxy_set.cache_clear()
    shared._shared_rsm.cache_clear()
    shared.client_inputs.cache_clear()


# ------------------------------------------------------------------------------------------------ pure parts
def test_proxy_means_are_the_means_of_the_drawn_images_by_hand():
    images = torch.arange(7 * 4, dtype=torch.float32).reshape(7, 1, 2, 2)
    got = proxy_means(images, 5, 3, torch.Generator().manual_seed(9))
    idx = torch.randint(7, (5, 3), generator=torch.Generator().manual_seed(9))  # the same draws: with replacement
    for j in range(5):
        by_hand = sum(images[int(i)] for i in idx[j]) / 3
        assert torch.allclose(got[j], by_hand)
    with pytest.raises(ValueError, match="no images"):
        proxy_means(images[:0], 5, 3, torch.Generator())


def test_fit_shape_keeps_equal_shapes_averages_when_shrinking_and_refuses_other_channels():
    images = torch.arange(2 * 16, dtype=torch.float32).reshape(2, 1, 4, 4)
    assert fit_shape(images, (1, 4, 4)) is images
    small = fit_shape(images, (1, 2, 2))
    assert small[0, 0, 0, 0] == images[0, 0, :2, :2].mean()  # area averaging of each 2x2 block
    with pytest.raises(ValueError, match="same number of channels"):
        fit_shape(images, (3, 4, 4))
    with pytest.raises(ValueError, match="same number of channels"):
        fit_shape(images, (16,))


def test_shared_rsm_draws_a_client_then_its_samples_by_hand():
    xs = [torch.full((3, 1, 2, 2), 1.0) * torch.arange(3.0).reshape(3, 1, 1, 1), torch.full((5, 1, 2, 2), 100.0)]
    x, q = shared_rsm_pseudo_data(xs, 6, 4, 10, torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(2)
    for j in range(6):
        c = int(torch.randint(2, (1,), generator=gen))
        idx = torch.randint(xs[c].shape[0], (4,), generator=gen)
        assert torch.allclose(x[j], xs[c][idx].mean(0))
    assert torch.allclose(q, torch.full((6, 10), 0.1))
    with pytest.raises(ValueError, match=r"client\(s\) \[1\] have no training samples"):
        shared_rsm_pseudo_data([xs[0], xs[1][:0]], 2, 2, 10, torch.Generator())


# ------------------------------------------------------------------------------------------------ the proxy set
def test_the_mixture_pseudo_data_is_the_mean_of_the_chosen_proxy_images_and_a_local_sample(tmp_path):
    """A run on 28x28 inputs with proxy-dataset mnist-5k (offline): x_p = mean of 10 drawn mnist-5k training
    images (seeded by the run seed only), x~ = (x_p + x_k) / 2 with x_k a drawn local sample (Eq. 4, K = 1)."""
    cfg = cfg_of(**{"dataset": "fmnist", "fedbr.proxy-dataset": "mnist-5k", "data-root": str(tmp_path)})
    fb = br_config(cfg)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(12, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (12,), generator=gen)
    trainer = FedBRTrainer(job_of(cfg, 2, x, y))
    make, per_step = trainer.pseudo_source()
    xt, qt = make(None, None)
    assert per_step and xt.shape == (8, 1, 28, 28)  # |D_p| = B = 8
    pool = load_pool("mnist-5k", data_seed("mnist-5k"), cfg.global_test_fraction)
    images = torch.from_numpy(pool.x_train)
    draws = torch.randint(len(images), (8, 10), generator=torch.Generator().manual_seed(proxy_seed(cfg, fb, 1)))
    x_p = torch.stack([sum(images[int(i)] for i in row) / 10 for row in draws])
    partner = torch.randint(12, (8, 1), generator=torch.Generator().manual_seed(set_seed(cfg.seed, 2, 1, 13)))
    assert torch.allclose(xt, (x_p + x[partner[:, 0]]) / 2, atol=1e-5)
    onehot = torch.nn.functional.one_hot(y[partner[:, 0]], 10).float()
    assert torch.allclose(qt, (torch.full((8, 10), 0.1) + onehot) / 2)


def test_the_authors_partners_come_from_the_steps_batch():
    cfg = RunConfig.from_dict(resolve_run_config({"method": "fedbr-code", "dataset": "digits", "batch-size": 4,
                                                  "fedbr-code.proxy": "smooth-noise"}))
    x = torch.randn(20, 1, 8, 8)
    y = torch.arange(20) % 10
    make, _ = FedBRTrainer(job_of(cfg, 0, x, y)).pseudo_source()
    xb, yb = torch.full((4, 1, 8, 8), 5.0), torch.full((4,), 3)
    proxy = proxy_set(cfg, br_config(cfg), (1, 8, 8), 1)
    xt, qt = make(xb, yb)
    assert torch.allclose(xt, (proxy + 5.0) / 2)  # every partner is a batch sample (all equal here)
    assert torch.allclose(qt[:, 3], torch.full((4,), 0.55)) and torch.allclose(qt.sum(1), torch.ones(4))


def test_the_proxy_set_is_one_set_on_every_client_and_in_every_process():
    cfg = cfg_of(dataset="digits")  # auto: no offline set of another distribution at 8x8 -> generated
    assert br_config(cfg).proxy_source("digits") == "smooth-noise"
    a = proxy_set(cfg, br_config(cfg), (1, 8, 8), 1)
    k0 = cfg_of(dataset="digits", **{"fedbr.mixture-k": 0})  # x~ = x_p: what each client's trainer holds
    for cid, n in ((0, 16), (3, 9)):
        x, y = torch.randn(n, 1, 8, 8), torch.arange(n) % 10
        shared._proxy_set.cache_clear()
        got, q = FedBRTrainer(job_of(k0, cid, x, y, server_round=1 + cid)).pseudo_source()[0](None, None)
        assert torch.equal(got, a) and torch.allclose(q, torch.full((8, 10), 0.1))
    shared._proxy_set.cache_clear()
    assert torch.equal(proxy_set(cfg, br_config(cfg), (1, 8, 8), 5), a)  # 'once': rebuilt, the same set
    other = proxy_set(cfg_of(dataset="digits", seed=1), br_config(cfg_of(seed=1)), (1, 8, 8), 1)
    assert not torch.equal(other, a)  # the run seed decides it


def test_auto_takes_fashion_mnist_for_28x28_sets_from_the_data_root(tmp_path):
    """The authors' proxy is another dataset; for MNIST-like inputs ours is Fashion-MNIST, read where the loader
    reads it (here a tiny torchvision-format fixture under data-root)."""
    write_idx_set(tmp_path, "fmnist", 3, 1)
    cfg = cfg_of(dataset="mnist-5k", **{"data-root": str(tmp_path)})
    assert AUTO_PROXY["mnist-5k"] == AUTO_PROXY["rotated-mnist"] == AUTO_PROXY["mnist"] == "fmnist"
    got = proxy_set(cfg, br_config(cfg), (1, 28, 28), 1)
    images = torch.from_numpy(load_pool.__wrapped__("fmnist", data_seed("fmnist"), 0.2, str(tmp_path)).x_train)
    assert len(images) == 30
    idx = torch.randint(30, (8, 10), generator=torch.Generator().manual_seed(proxy_seed(cfg, br_config(cfg), 1)))
    assert torch.allclose(got, images[idx].mean(1))


def test_auto_takes_cifar100_for_cifar10(tmp_path, monkeypatch):
    skip_cifar_md5(monkeypatch)
    write_cifar(tmp_path, "cifar100", 1, 1)
    cfg = cfg_of(dataset="cifar10", **{"data-root": str(tmp_path)})
    assert br_config(cfg).proxy_source("cifar10") == "cifar100" and AUTO_PROXY["cifar100"] == "cifar10"
    got = proxy_set(cfg, br_config(cfg), (3, 32, 32), 1)
    images = torch.from_numpy(load_pool.__wrapped__("cifar100", data_seed("cifar100"), 0.2, str(tmp_path)).x_train)
    idx = torch.randint(100, (8, 10), generator=torch.Generator().manual_seed(proxy_seed(cfg, br_config(cfg), 1)))
    assert got.shape == (8, 3, 32, 32) and torch.allclose(got, images[idx].mean(1))


def test_a_missing_proxy_dataset_is_an_error_naming_the_key_and_the_dataset(tmp_path, monkeypatch):
    monkeypatch.setitem(datasets.SYSTEM_COPIES, "fmnist", (tmp_path / "no-package", "dataset-fashion-mnist"))
    cfg = cfg_of(dataset="mnist-5k", **{"data-root": str(tmp_path / "empty")})
    with pytest.raises(ProxyDataError, match=r"run-config key 'fedbr.proxy-dataset': the proxy dataset 'fmnist' "
                                             r"is not available"):
        proxy_set(cfg, br_config(cfg), (1, 28, 28), 1)
    code = cfg_of(method="fedbr-code", dataset="mnist-5k", **{"data-root": str(tmp_path / "empty")})
    with pytest.raises(ProxyDataError, match="'fedbr-code.proxy-dataset'.*'fmnist'"):
        proxy_set(code, br_config(code), (1, 28, 28), 1)


def test_the_runs_own_dataset_is_refused_as_its_proxy():
    with pytest.raises(ConfigError, match="'fedbr.proxy-dataset' = 'digits' is the run's own dataset"):
        cfg_of(dataset="digits", **{"fedbr.proxy-dataset": "digits"})
    cfg_of(dataset="digits", **{"fedbr.proxy-dataset": "digits", "fedbr.pseudo": "rsm"})  # no proxy used
    with pytest.raises(ConfigError, match="run-config key 'fedbr.proxy-dataset' got 'synthetic'; allowed"):
        cfg_of(**{"fedbr.proxy-dataset": "synthetic"})  # generated per client: no pool of images
    assert br_config(cfg_of(**{"fedbr.proxy-dataset": "hf:foo"})).proxy_source("digits") == "hf:foo"


# ------------------------------------------------------------------------------------------------ RSM
def test_the_shared_rsm_set_is_identical_on_two_clients_and_per_client_sets_differ():
    over = {"dataset": "digits", "fedbr.pseudo": "rsm", "fedbr.rsm-scope": "shared"}
    cfg = cfg_of(**over)
    arrays = [client_arrays(cfg, cid, 3) for cid in range(3)]
    sets = []
    for cid in (0, 2):
        a = arrays[cid]
        job = job_of(cfg, cid, torch.from_numpy(a.x_train), torch.from_numpy(a.y_train), config={NUM_CLIENTS: 3})
        sets.append(FedBRTrainer(job).pseudo_source()[0](None, None)[0])
    assert torch.equal(sets[0], sets[1])
    gen = torch.Generator().manual_seed(set_seed(cfg.seed, 0, 19))
    xs = [torch.from_numpy(a.x_train) for a in arrays]
    for j in range(8):  # the authors' draw: a client uniformly, then 10 of its samples with replacement
        c = int(torch.randint(3, (1,), generator=gen))
        idx = torch.randint(len(xs[c]), (10,), generator=gen)
        assert torch.allclose(sets[0][j], xs[c][idx].mean(0))
    local = cfg_of(**{**over, "fedbr.rsm-scope": "client"})
    per_client = [FedBRTrainer(job_of(local, cid, torch.from_numpy(arrays[cid].x_train),
                                      torch.from_numpy(arrays[cid].y_train))).pseudo_source()[0](None, None)[0]
                  for cid in (0, 2)]
    assert not torch.equal(per_client[0], per_client[1])
    with pytest.raises(ValueError, match="'fedbr.rsm-scope' = 'shared' needs the number of clients"):
        FedBRTrainer(job_of(cfg, 0, xs[0], torch.from_numpy(arrays[0].y_train))).pseudo_source()
    foreign = job_of(cfg, 0, xs[0] + 1.0, torch.from_numpy(arrays[0].y_train), config={NUM_CLIENTS: 3})
    with pytest.raises(ValueError, match="client 0's training data is not its partition"):  # e.g. data-path
        FedBRTrainer(foreign).pseudo_source()


@pytest.mark.slow
def test_the_proxy_set_and_the_shared_rsm_set_are_the_same_in_another_process():
    """Both shared sets depend on the run config only, not on the process (hash seed, import order, RNG state):
    one fresh interpreter recomputes them (the RSM set for another client at round 4) bit for bit. Slow tier: it
    starts a Python process (4 s of imports); the in-process properties are the two tests above."""
    base = {"method": "fedbr", "batch-size": 8, "lr": 0.05, "dataset": "digits"}
    rsm = {**base, "fedbr.pseudo": "rsm", "fedbr.rsm-scope": "shared"}
    cfg, rsm_cfg = cfg_of(dataset="digits"), cfg_of(dataset="digits", **{"fedbr.pseudo": "rsm", "fedbr.rsm-scope": "shared"})
    own = torch.from_numpy(client_arrays(rsm_cfg, 0, 3).x_train)
    want = [hashlib.sha256(proxy_set(cfg, br_config(cfg), (1, 8, 8), 1).numpy().tobytes()).hexdigest(),
            hashlib.sha256(shared_rsm(rsm_cfg, br_config(rsm_cfg), 3, 1, 0, own)[0].numpy().tobytes()).hexdigest()]
    code = ("import hashlib, json, sys, torch; from flcore.config import RunConfig, resolve_run_config; "
            "from flcore.methods.fedbr import br_config; from data_partitioning.federated import client_arrays; "
            "from client_app.trainers.fedbr.shared import proxy_set, shared_rsm; "
            "c, r = (RunConfig.from_dict(resolve_run_config(json.loads(a))) for a in sys.argv[1:]); "
            "own = torch.from_numpy(client_arrays(r, 1, 3).x_train); "
            "print(hashlib.sha256(proxy_set(c, br_config(c), (1, 8, 8), 1).numpy().tobytes()).hexdigest()); "
            "print(hashlib.sha256(shared_rsm(r, br_config(r), 3, 4, 1, own)[0].numpy().tobytes()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(base), json.dumps(rsm)], capture_output=True,
                         text=True, check=True, cwd=PROJECT_ROOT)
    assert out.stdout.split() == want


def test_the_server_tells_each_client_the_federation_size_only_for_a_shared_rsm():
    from strategies.methods.fedbr import FedBRStrategy

    strategy = FedBRStrategy(cfg_of(**{"fedbr.pseudo": "rsm", "fedbr.rsm-scope": "shared"}))
    strategy.registry.clients.update({c: None for c in range(3)})  # three registered nodes (only counted)
    assert strategy.client_config(1, 0) == {NUM_CLIENTS: 3}
    strategy.registry.clients[3] = None  # a late node: the run's set stays the one over the first three
    assert strategy.client_config(2, 3) == {NUM_CLIENTS: 3}
    resumed = FedBRStrategy(strategy.cfg)
    resumed.load_state_dict(strategy.state_dict())
    assert resumed.client_config(3, 1) == {NUM_CLIENTS: 3}
    assert FedBRStrategy(cfg_of()).client_config(1, 0) == {}
    assert FedBRStrategy(cfg_of(method="fedbr-code")).client_config(1, 0) == {}  # Mixture: no RSM set


def test_the_paper_defaults_and_where_the_code_differs():
    paper, code = br_config(cfg_of()), br_config(cfg_of(method="fedbr-code"))
    assert (paper.pseudo, paper.proxy, paper.proxy_dataset, paper.proxy_mean_size) == ("mixture", "dataset", "auto", 10)
    assert (paper.rsm_scope, paper.mixture_partners, paper.global_features) == ("client", "local", "step")
    assert (code.rsm_scope, code.mixture_partners, code.global_features) == ("shared", "batch", "round")
    assert paper.pseudo_count(32) == 32 and paper.pseudo_count(64) == 64  # |D_p| = B (Alg. 1)
    assert np.isclose(paper.tau1, 0.5) and np.isclose(paper.mu, 0.5) and paper.lambda_ == 1.0
