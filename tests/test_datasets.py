import numpy as np
import pytest

from data_partitioning.datasets import DatasetError, load_pool
from data_partitioning.federated import client_arrays, global_test_set, node_arrays, validation_set
from data_partitioning.synthetic import synthetic_client
from flcore.config import RunConfig, resolve_run_config


def cfg(**over):
    return RunConfig.from_dict(resolve_run_config(over))


def test_mnist_5k_pool_is_offline_normalised_and_held_out():
    pool = load_pool("mnist-5k", 0, 0.2)
    assert pool.x_train.shape == (4000, 1, 28, 28) and pool.x_test.shape == (1000, 1, 28, 28)
    assert abs(float(pool.x_train.mean())) < 0.2 and 0.8 < float(pool.x_train.std()) < 1.2
    assert set(np.unique(pool.y_test)) == set(range(10))


def test_digits_pool():
    pool = load_pool("digits", 0, 0.2)
    assert pool.x_train.shape[1:] == (1, 8, 8) and pool.num_classes == 10
    assert len(pool.y_train) + len(pool.y_test) == 1797


def test_client_arrays_are_deterministic_and_split_75_25():
    c = cfg(dataset="mnist-5k", partition="dirichlet", **{"dirichlet-alpha": 0.5, "local-test-fraction": 0.25})
    a, b = client_arrays(c, 3, 10), client_arrays(c, 3, 10)
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    n = len(a.y_train) + len(a.y_test)
    assert abs(len(a.y_test) - 0.25 * n) <= 1
    with pytest.raises(DatasetError, match="partition-id 10"):
        client_arrays(c, 10, 10)


def test_by_default_every_sample_trains_and_validation_is_carved_from_training_only():
    plain = client_arrays(cfg(dataset="mnist-5k"), 3, 10)
    assert len(plain.y_test) == 0 and len(plain.y_val) == 0  # no silent local-test carve-out
    split = client_arrays(cfg(dataset="mnist-5k", **{"local-test-fraction": 0.25}), 3, 10)
    both = client_arrays(cfg(dataset="mnist-5k", **{"local-test-fraction": 0.25, "validation-fraction": 0.2}), 3, 10)
    assert len(plain.y_train) == len(split.y_train) + len(split.y_test)
    assert np.array_equal(both.x_test, split.x_test)  # the local test split does not move with validation
    assert len(both.y_train) + len(both.y_val) == len(split.y_train)
    assert abs(len(both.y_val) - 0.2 * len(split.y_train)) <= 1
    rows = {r.tobytes() for r in both.x_train.reshape(len(both.x_train), -1)}  # disjoint splits
    assert not any(r.tobytes() in rows for r in both.x_val.reshape(len(both.x_val), -1))
    x_val, y_val = validation_set(cfg(dataset="mnist-5k", **{"validation-fraction": 0.2}), 10)
    assert len(y_val) == sum(len(client_arrays(cfg(dataset="mnist-5k", **{"validation-fraction": 0.2}), k, 10).y_val)
                             for k in range(10)) > 700


def test_rotated_mnist_rotates_clients_differently():
    c = cfg(dataset="rotated-mnist", partition="iid", **{"rotation-step-deg": 90.0})
    a0 = client_arrays(c, 0, 4)
    base = client_arrays(cfg(dataset="mnist-5k", partition="iid"), 1, 4)
    a1 = client_arrays(c, 1, 4)
    assert np.array_equal(a1.y_train, base.y_train)
    # a 90-degree rotation of the same images: equal to numpy's rot90 on the (H, W) axes
    assert np.allclose(a1.x_train, np.rot90(base.x_train, 1, axes=(2, 3)), atol=1e-5)
    assert a0.x_train.shape[1:] == (1, 28, 28)


def test_torchvision_dataset_missing_gives_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="cifar10.*data-root"):
        load_pool("cifar10", 0, 0.2, str(tmp_path), False)


def test_torchvision_loader_reads_local_files(tmp_path):
    """A tiny MNIST in torchvision's processed layout is read, normalised and split train/test."""
    import torch

    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    import gzip
    import struct

    def write_idx(path, arr):
        arr = np.asarray(arr, dtype=np.uint8)
        header = struct.pack(">HBB", 0, 8, arr.ndim) + b"".join(struct.pack(">I", d) for d in arr.shape)
        with gzip.open(path, "wb") as fh:
            fh.write(header + arr.tobytes())

    rng = np.random.default_rng(0)
    for prefix, n in (("train", 20), ("t10k", 8)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 255, (n, 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    for f in list(raw.iterdir()):  # torchvision also accepts the unpacked files
        with gzip.open(f) as src:
            (raw / f.name[:-3]).write_bytes(src.read())
    pool = load_pool("mnist", 0, 0.2, str(tmp_path), False)
    assert pool.x_train.shape == (20, 1, 28, 28) and pool.x_test.shape == (8, 1, 28, 28)
    assert pool.x_train.dtype == np.float32 and list(pool.y_train[:3]) == [0, 1, 2]
    assert torch.is_tensor(torch.as_tensor(pool.x_train))


def test_synthetic_statistics():
    """Synthetic(alpha, beta): 60 features with variance j^-1.2 around v_k; larger beta spreads client means."""
    x, y = synthetic_client(1.0, 1.0, 0, 0)
    assert x.shape[1] == 60 and x.shape[0] >= 50 and set(np.unique(y)) <= set(range(10))
    xs = [synthetic_client(0.0, 0.0, 0, k, max_samples=5000)[0] for k in range(8)]
    for xk in xs:
        var = xk.var(0)
        assert var[0] > var[-1]  # Sigma_jj = j^-1.2 decreases
        assert abs(var[0] - 1.0) < 0.5 if len(xk) > 200 else True
    spread0 = np.std([xk.mean() for xk in xs])
    xs_b = [synthetic_client(0.0, 10.0, 0, k, max_samples=5000)[0] for k in range(8)]
    assert np.std([xk.mean() for xk in xs_b]) > spread0
    a, b = synthetic_client(1.0, 1.0, 3, 5), synthetic_client(1.0, 1.0, 3, 5)
    assert np.array_equal(a[0], b[0])


def test_synthetic_global_test_is_union_of_client_test_splits():
    c = cfg(dataset="synthetic", partition="natural")
    x, y = global_test_set(c, 3)
    n = sum(len(client_arrays(c, k, 3).y_test) for k in range(3))
    assert len(y) == n and x.shape[1] == 60


def test_node_arrays_formats(tmp_path):
    p = tmp_path / "node.npz"
    np.savez(p, x=np.zeros((40, 3), np.float32), y=np.arange(40) % 4)
    arr = node_arrays(str(p), 0.25, 0)
    assert len(arr.y_train) == 30 and len(arr.y_test) == 10 and arr.num_classes == 4
    bad = tmp_path / "bad.npz"
    np.savez(bad, images=np.zeros(3))
    with pytest.raises(DatasetError, match="must hold arrays"):
        node_arrays(str(bad), 0.25, 0)
    with pytest.raises(DatasetError, match="does not exist"):
        node_arrays(str(tmp_path / "none.npz"), 0.25, 0)
