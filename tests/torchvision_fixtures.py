"""Tiny stand-ins for the torchvision datasets, written in torchvision's own on-disk formats (nothing downloaded).

``write_data_root(root)`` writes MNIST, Fashion-MNIST, EMNIST-letters (IDX files under ``<set>/raw/``) and
CIFAR-10/100 (the pickled batches under ``cifar-10-batches-py/`` and ``cifar-100-python/``) with
a few training and test images per class (:data:`SIZES`). Each class is a fixed random
template plus noise, so the images carry their labels. Paths and formats are the ones
``data_partitioning.datasets.TORCHVISION_FILES`` and torchvision's readers use.

torchvision checks the MD5 sums of the CIFAR files against the real archives; these stand-ins cannot match
them, so a test reading them must replace that check with an existence check (:func:`skip_cifar_md5`).
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np

IDX_SETS = {"mnist": ("MNIST", 10, ""), "fmnist": ("FashionMNIST", 10, ""),
            "emnist-letters": ("EMNIST", 26, "emnist-letters-")}
CIFAR_SETS = {"cifar10": 10, "cifar100": 100}


def _images(num_classes: int, per_class: int, shape: tuple[int, ...], rng: np.random.Generator
            ) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` uint8 images of each class (template + noise), labels 0..C-1, in a shuffled order."""
    templates = rng.integers(0, 256, (num_classes, *shape))
    labels = np.repeat(np.arange(num_classes), per_class)
    noise = rng.normal(0.0, 40.0, (len(labels), *shape))
    images = np.clip(templates[labels] + noise, 0, 255).astype(np.uint8)
    order = rng.permutation(len(labels))
    return images[order], labels[order]


def _write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file of unsigned bytes (type 0x08), as LeCun's MNIST files and torchvision's reader have them."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.tobytes())


def write_idx_set(root: Path, name: str, train_per_class: int, test_per_class: int, seed: int = 0) -> None:
    folder, num_classes, prefix = IDX_SETS[name]
    raw = root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, num_classes])
    first_label = 1 if name == "emnist-letters" else 0  # EMNIST letters are labelled 1..26
    for split, per_class in (("train", train_per_class), ("t10k" if not prefix else "test", test_per_class)):
        images, labels = _images(num_classes, per_class, (28, 28), rng)
        _write_idx(raw / f"{prefix}{split}-images-idx3-ubyte", images)
        _write_idx(raw / f"{prefix}{split}-labels-idx1-ubyte", labels + first_label)


def _pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh)


def write_cifar(root: Path, name: str, train_per_class: int, test_per_class: int, seed: int = 0) -> None:
    """CIFAR's python pickles: rows of 3072 bytes (R, G, B planes of 32x32), labels in a list."""
    num_classes = CIFAR_SETS[name]
    rng = np.random.default_rng([seed, num_classes])
    train = _images(num_classes, train_per_class, (3, 32, 32), rng)
    test = _images(num_classes, test_per_class, (3, 32, 32), rng)

    def batch(images: np.ndarray, labels: np.ndarray, key: str) -> dict:
        return {"data": images.reshape(len(images), -1), key: [int(v) for v in labels]}

    if name == "cifar10":
        folder = root / "cifar-10-batches-py"
        folder.mkdir(parents=True, exist_ok=True)
        for i, part in enumerate(np.array_split(np.arange(len(train[1])), 5), start=1):
            _pickle(folder / f"data_batch_{i}", batch(train[0][part], train[1][part], "labels"))
        _pickle(folder / "test_batch", batch(*test, "labels"))
        _pickle(folder / "batches.meta", {"label_names": [f"class{c}" for c in range(num_classes)]})
    else:
        folder = root / "cifar-100-python"
        folder.mkdir(parents=True, exist_ok=True)
        _pickle(folder / "train", batch(*train, "fine_labels"))
        _pickle(folder / "test", batch(*test, "fine_labels"))
        _pickle(folder / "meta", {"fine_label_names": [f"class{c}" for c in range(num_classes)]})


SIZES = {"mnist": (20, 2), "fmnist": (20, 2), "emnist-letters": (20, 2), "cifar10": (20, 2), "cifar100": (5, 1)}


def write_data_root(root: Path, sizes: dict[str, tuple[int, int]] | None = None) -> Path:
    """Every torchvision set the project reads, tiny, under ``root``; returns ``root``. ``sizes``: per set,
    (training, test) images per class (default :data:`SIZES`: 20 and 2; CIFAR-100, with its 100 classes and
    the heaviest models, 5 and 1)."""
    sizes = {**SIZES, **(sizes or {})}
    for name in IDX_SETS:
        write_idx_set(root, name, *sizes[name])
    for name in CIFAR_SETS:
        write_cifar(root, name, *sizes[name])
    return root


def skip_cifar_md5(monkeypatch) -> None:
    """Let torchvision's CIFAR readers accept these stand-ins: the MD5 check becomes an existence check."""
    import torchvision.datasets.cifar as cifar

    monkeypatch.setattr(cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))
