"""flwr-datasets (issue 33 item 3): iid / dirichlet / shards are the split a Flower user's FederatedDataset
gives at the same seed; the partitions we keep keep their properties; dataset='hf:<name>' reads a Hugging Face
image-classification dataset through FederatedDataset (here one the test saves to disk: offline), with its
columns found or named, and clear errors without the network or the columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data_partitioning.datasets import dataset_shape, load_pool
from data_partitioning.federated import data_seed, partition_indices
from data_partitioning.hf import HFDatasetError
from flcore.config import ConfigError, RunConfig

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch):
    """datasets' cache in the test's folder; no telemetry."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")


def flower_users_split(folder: Path, partitioner, seed: int, k: int, column: str) -> list[np.ndarray]:
    """What a Flower user gets: FederatedDataset over the folder, shuffled with ``seed``, partitioned."""
    from flwr_datasets import FederatedDataset

    fds = FederatedDataset(dataset=str(folder), partitioners={"train": partitioner}, shuffle=True, seed=seed)
    return [np.sort(np.asarray(fds.load_partition(i)[column])) for i in range(k)]


@pytest.mark.parametrize("partition", ["iid", "dirichlet", "shards"])
def test_our_split_is_a_flower_users_split_at_the_same_seed(tmp_path, partition):
    import datasets
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, ShardPartitioner

    seed, k = 7, 5
    cfg = RunConfig.from_dict({"dataset": "digits", "partition": partition, "seed": seed, "dirichlet-alpha": 0.3,
                               "shards-per-client": 3, "min-partition-size": 4})
    pool = load_pool("digits", data_seed("digits"), cfg.global_test_fraction)
    folder = tmp_path / "pool"
    folder.mkdir()
    datasets.Dataset.from_dict({"label": pool.y_train, "row": np.arange(len(pool.y_train))}).to_parquet(
        str(folder / "train.parquet"))
    partitioner = {"iid": lambda: IidPartitioner(num_partitions=k),
                   "dirichlet": lambda: DirichletPartitioner(num_partitions=k, partition_by="label", alpha=0.3,
                                                             min_partition_size=4, seed=seed),
                   "shards": lambda: ShardPartitioner(num_partitions=k, partition_by="label",
                                                      num_shards_per_partition=3, seed=seed)}[partition]()
    theirs = flower_users_split(folder, partitioner, seed, k, "row")
    ours = partition_indices(cfg, k)
    assert len(ours) == k and all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def test_the_partitions_we_keep_keep_their_properties():
    """classes: exactly classes-per-client classes of samples-per-class samples each, no sample shared;
    power-law: sizes follow (k+1)^-exponent, larger clients hold more classes."""
    cfg = RunConfig.from_dict({"dataset": "digits", "partition": "classes", "classes-per-client": 2,
                               "samples-per-class": 15, "seed": 1})
    y = load_pool("digits", data_seed("digits"), cfg.global_test_fraction).y_train
    parts = partition_indices(cfg, 10)
    for p in parts:
        counts = np.bincount(y[p], minlength=10)
        assert sorted(counts[counts > 0].tolist()) == [15, 15]
    allidx = np.concatenate(parts)
    assert len(set(allidx.tolist())) == len(allidx) == 10 * 2 * 15

    cfg = cfg.replace(partition="power-law", power_law_exponent=1.5)
    parts = partition_indices(cfg, 8)
    sizes = np.array(sorted((len(p) for p in parts), reverse=True))
    weights = np.arange(1, 9, dtype=float) ** -1.5
    np.testing.assert_allclose(sizes / sizes.sum(), weights / weights.sum(), atol=0.01)
    by_size = sorted(parts, key=len, reverse=True)
    assert len(np.unique(y[by_size[0]])) == 10 and len(np.unique(y[by_size[-1]])) <= 3


def save_image_dataset(folder: Path, *, rgb: bool = False, test: bool = True, two_labels: bool = False) -> dict:
    """scikit-learn's 8x8 digits as a Hugging Face image dataset on disk (train / test parquet files): an Image
    column 'picture', a ClassLabel 'digit' and an int 'row' (the sample's number)."""
    import datasets
    from PIL import Image
    from sklearn.datasets import load_digits

    d = load_digits()
    pix = (d.images * 16).clip(0, 255).astype(np.uint8)
    if rgb:
        pix = np.stack([pix, 255 - pix, pix // 2], axis=-1)
    cols = {"picture": [Image.fromarray(p) for p in pix], "digit": d.target.tolist(), "row": list(range(len(pix)))}
    feats = {"picture": datasets.Image(), "digit": datasets.ClassLabel(num_classes=10), "row": datasets.Value("int64")}
    if two_labels:
        cols["parity"] = (d.target % 2).tolist()
        feats["parity"] = datasets.ClassLabel(names=["even", "odd"])
    ds = datasets.Dataset.from_dict(cols, features=datasets.Features(feats))
    folder.mkdir(parents=True)
    n_train = 1400
    ds.select(range(n_train)).to_parquet(str(folder / "train.parquet"))
    if test:
        ds.select(range(n_train, len(ds))).to_parquet(str(folder / "test.parquet"))
    return {"pix": pix, "y": d.target, "n_train": n_train}


def test_hf_dataset_from_disk_columns_found(tmp_path):
    saved = save_image_dataset(tmp_path / "digits")
    name = f"hf:{tmp_path / 'digits'}"
    pool = load_pool(name, data_seed(name), 0.2)
    n = saved["n_train"]
    assert pool.x_train.shape == (n, 1, 8, 8) and pool.x_test.shape == (1797 - n, 1, 8, 8)
    assert pool.num_classes == 10 and dataset_shape(name) == ((1, 8, 8), 10)
    np.testing.assert_array_equal(pool.y_train, saved["y"][:n])   # the train split, in its order
    np.testing.assert_array_equal(pool.y_test, saved["y"][n:])    # the test split is the G-FL test set
    raw = saved["pix"][:n].astype(np.float32) / 255
    mean, std = raw.mean(), raw.std()
    np.testing.assert_allclose(pool.x_train[:, 0], (raw - mean) / std, rtol=1e-5, atol=1e-5)
    assert abs(pool.x_train.astype(np.float64).mean()) < 1e-6 and abs(pool.x_train.astype(np.float64).std() - 1) < 1e-6


def test_hf_columns_named_rgb_and_no_test_split(tmp_path):
    save_image_dataset(tmp_path / "rgb", rgb=True, test=False, two_labels=True)
    base = f"hf:{tmp_path / 'rgb'}"
    with pytest.raises(ConfigError, match=r"several ClassLabel column\(s\) to use as the label \(digit, parity\); "
                                          r"name it: 'hf:<name>\?label=<column>'"):
        load_pool(base, data_seed(base), 0.2)
    name = base + "?label=parity&image=picture"
    pool = load_pool(name, data_seed(name), 0.25)
    assert pool.x_train.shape[1:] == (3, 8, 8) and pool.num_classes == 2
    assert len(pool.y_test) == round(0.25 * 1400) and len(pool.y_train) == 1400 - 350  # held out: no test split
    np.testing.assert_allclose(pool.x_train.astype(np.float64).mean(axis=(0, 2, 3)), 0, atol=1e-6)  # per channel
    np.testing.assert_allclose(pool.x_train.astype(np.float64).std(axis=(0, 2, 3)), 1, atol=1e-6)
    with pytest.raises(HFDatasetError, match=r"no column 'img' \(columns: picture, digit, row, parity\)"):
        load_pool(base + "?image=img", 0, 0.2)
    with pytest.raises(ConfigError, match="only image=<column> and label=<column> are allowed"):
        load_pool(base + "?labels=digit", 0, 0.2)


@pytest.mark.slow
def test_hf_without_network_is_a_clear_error(tmp_path):
    """A Hub id with no network (offline mode: what a machine without access sees): one line, exit 2, the key. Slow
    tier: it starts the command line (4 s of imports)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "FLWR_TELEMETRY_ENABLED": "0"}
    proc = subprocess.run([sys.executable, "-m", "cli", "run", "--nodes", "3", "-c", "dataset='hf:ylecun/mnist'"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "run-config key 'dataset' = 'hf:ylecun/mnist'" in lines[0]
    assert "needs network access" in lines[0] and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_run_on_a_saved_hf_dataset_splits_it_as_flower_does(tmp_path):
    """noniid-fl run on the saved dataset: it learns, and each client's data is the Flower user's partition."""
    from flwr_datasets.partitioner import DirichletPartitioner

    save_image_dataset(tmp_path / "digits")
    name = f"hf:{tmp_path / 'digits'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "FLWR_TELEMETRY_ENABLED": "0"}
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "cli", "run", "--nodes", "3", "-c",
                           f"dataset='{name}' num-server-rounds=3 batch-size=16 seed=5 out-dir='{out}'"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["run_config"]["dataset"] == name and doc["run_config"]["model"] == "auto"
    assert doc["final"]["global_accuracy"] > 0.6  # 10 classes: chance is 0.1
    cfg = RunConfig.from_dict(doc["run_config"])
    theirs = flower_users_split(tmp_path / "digits", DirichletPartitioner(
        num_partitions=3, partition_by="digit", alpha=0.5, min_partition_size=4, seed=5), 5, 3, "row")
    assert all(np.array_equal(a, b) for a, b in zip(partition_indices(cfg, 3), theirs))
