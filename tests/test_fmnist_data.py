"""Issue 31 item 1: Fashion-MNIST offline from Debian's ``dataset-fashion-mnist`` package (installed by
.ci/deps.sh), read in place from its four IDX .gz files; data-root's torchvision copy wins when present; a
clear error names both places when neither has the files."""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import pytest

from cli.main import main
from data_partitioning import datasets
from data_partitioning.datasets import (DatasetError, TORCHVISION_FILES, _packaged_idx, load_pool, read_idx_gz,
                                        system_copy)
from flcore.config import ConfigError, RunConfig, resolve_run_config
from server_app import preflight as pf

DEBIAN = datasets.SYSTEM_COPIES["fmnist"][0]
# The canonical first labels of Fashion-MNIST's splits (Xiao et al. 2017's files: 9 = ankle boot, 0 = T-shirt).
FIRST_TRAIN = [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
FIRST_TEST = [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]


def test_the_debian_package_is_where_the_loader_looks():
    assert system_copy("fmnist") == DEBIAN
    assert system_copy("mnist") is None and system_copy("cifar10") is None  # no packaged copy known


def test_idx_headers_labels_and_counts_of_the_real_files():
    ytr = read_idx_gz(DEBIAN / "train-labels-idx1-ubyte.gz", 1)
    yte = read_idx_gz(DEBIAN / "t10k-labels-idx1-ubyte.gz", 1)
    assert ytr.shape == (60000,) and yte.shape == (10000,) and ytr.dtype == np.uint8
    assert ytr[:10].tolist() == FIRST_TRAIN and yte[:10].tolist() == FIRST_TEST
    assert np.bincount(ytr).tolist() == [6000] * 10 and np.bincount(yte).tolist() == [1000] * 10
    images = read_idx_gz(DEBIAN / "train-images-idx3-ubyte.gz", 3, limit=3000)  # a slice: only it is decompressed
    assert images.shape == (3000, 28, 28) and images.dtype == np.uint8
    scaled = images / 255.0  # the per-pixel statistics the normalisation uses (0.2860, 0.3530 on all 60,000)
    assert abs(scaled.mean() - 0.2860) < 0.01 and abs(scaled.std() - 0.3530) < 0.01


def _write_idx(path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, np.uint8).tobytes())


def test_the_packaged_copy_is_what_torchvision_reads_from_a_data_root(tmp_path):
    """The first 2,000 / 500 records written uncompressed where torchvision looks: data-root wins over the
    packaged copy, and both give the same normalised arrays and labels."""
    n_train, n_test = 2000, 500
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in datasets._IDX:
        ndim = 3 if "images" in name else 1
        _write_idx(raw / name, read_idx_gz(DEBIAN / f"{name}.gz", ndim, n_train if "train" in name else n_test))
    assert all((tmp_path / f).is_file() for f in TORCHVISION_FILES["fmnist"])
    via_torchvision = load_pool("fmnist", 0, 0.2, str(tmp_path), False)
    packaged = _packaged_idx("fmnist", DEBIAN, limit=n_train)
    assert len(via_torchvision.y_train) == n_train and len(via_torchvision.y_test) == n_test  # data-root's files
    np.testing.assert_array_equal(via_torchvision.x_train, packaged.x_train)
    np.testing.assert_array_equal(via_torchvision.y_train, packaged.y_train)
    np.testing.assert_array_equal(via_torchvision.x_test, packaged.x_test[:n_test])
    assert via_torchvision.in_shape == packaged.in_shape == (1, 28, 28) and packaged.num_classes == 10


def test_without_a_data_root_copy_the_full_set_is_read_from_the_package(tmp_path):
    pool = load_pool("fmnist", 3, 0.2, str(tmp_path / "nothing-here"), False)
    assert pool.x_train.shape == (60000, 1, 28, 28) and pool.x_test.shape == (10000, 1, 28, 28)
    assert pool.x_train.dtype == np.float32 and pool.y_train.dtype == np.int64
    assert pool.y_train[:10].tolist() == FIRST_TRAIN and pool.y_test[:10].tolist() == FIRST_TEST
    assert abs(float(pool.x_train.mean())) < 1e-3 and abs(float(pool.x_train.std()) - 1.0) < 1e-3
    # the official test split: the same whatever the run seed or global-test-fraction
    other = load_pool("fmnist", 4, 0.5, str(tmp_path / "nothing-here"), False)
    np.testing.assert_array_equal(other.y_test, pool.y_test)


def test_neither_place_is_a_clear_error_naming_both(tmp_path, monkeypatch):
    gone = tmp_path / "no-package"
    monkeypatch.setitem(datasets.SYSTEM_COPIES, "fmnist", (gone, "dataset-fashion-mnist"))
    root = tmp_path / "empty-root"
    with pytest.raises(DatasetError) as err:
        load_pool("fmnist", 0, 0.2, str(root), False)
    msg = str(err.value)
    assert f"data-root '{root}'" in msg and str(gone) in msg and "apt-get install dataset-fashion-mnist" in msg
    cfg = RunConfig.from_dict(resolve_run_config({"dataset": "fmnist", "data-root": str(root),
                                                  "out-dir": str(tmp_path / "r")}))
    with pytest.raises(ConfigError) as err:
        pf.check_dataset_files(cfg)
    msg = str(err.value)
    assert str(root / "FashionMNIST" / "raw") in msg and str(gone) in msg and "dataset-fashion-mnist" in msg
    monkeypatch.undo()
    pf.check_dataset_files(cfg)  # with the package there, the same config passes


def test_corrupt_idx_files_are_refused_by_name(tmp_path):
    bad = tmp_path / "bad.gz"
    bad.write_bytes(gzip.compress(struct.pack(">IIII", 0x801, 2, 28, 28)))
    with pytest.raises(DatasetError, match="magic number 0x801, expected 0x803"):
        read_idx_gz(bad, 3)
    short = tmp_path / "short.gz"
    short.write_bytes(gzip.compress(struct.pack(">IIII", 0x803, 2, 28, 28) + bytes(100)))
    with pytest.raises(DatasetError, match="100 bytes of data where its header promises 1568"):
        read_idx_gz(short, 3)
    with pytest.raises(DatasetError, match="too short for an IDX header"):
        (tmp_path / "empty.gz").write_bytes(gzip.compress(b""))
        read_idx_gz(tmp_path / "empty.gz", 1)


@pytest.mark.slow  # the in-process engine's worker process loads the 60,000 images too: ~20 s on 2 loaded cores
def test_noniid_fl_runs_fmnist_with_no_data_root(tmp_path, monkeypatch, capsys):
    """`noniid-fl run -c "dataset='fmnist'"` from a directory without data: one round (each client capped at
    3 local steps to keep the test short) on the full Fashion-MNIST, 3 clients."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    code = main(["run", "--nodes", "3", "-c",
                 f"dataset='fmnist' num-server-rounds=1 max-local-steps=3 out-dir='{out}'"])
    assert code == 0, capsys.readouterr().err
    doc = json.loads((out / "results.json").read_text())
    assert doc["run_config"]["dataset"] == "fmnist" and doc["run_config"]["data-root"] == "data"
    (row,) = doc["rounds"]
    assert row["num_updates"] == 3 and row["failures"] == []
    assert 0.0 <= row["global_accuracy"] <= 1.0 and np.isfinite(row["global_loss"])
