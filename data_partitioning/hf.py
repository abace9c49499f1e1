"""``dataset = 'hf:<name>'``: a Hugging Face image-classification dataset through Flower Datasets' FederatedDataset
(issue 33 item 3).

``<name>`` is what ``datasets.load_dataset`` takes: a Hub id (``uoft-cs/cifar10``; needs network access the
first time, then the Hugging Face cache) or a local folder of data files (``train*.parquet``, ``test*.parquet``).
The image and label columns are found (the dataset's only ``Image`` column; its only ``ClassLabel`` column, else
a column named ``label``) or named in the value: ``hf:<name>?image=<column>&label=<column>`` (e.g.
``hf:uoft-cs/cifar100?label=fine_label``, whose two ClassLabel columns are two tasks).

The pool: FederatedDataset(<name>, shuffle=False) loads the splits; the ``train`` split is the training pool
(partitioned with the run seed, as every pool, data_partitioning/flower.py: a Flower user's
``FederatedDataset(<name>, partitioners={"train": P}, seed=seed)`` split), the ``test`` split the G-FL test set (a
dataset without one holds out global-test-fraction of ``train`` with the dataset's fixed seed, like mnist-5k).
Images become float32 (N, C, H, W) scaled to [0, 1] and standardised per channel with the training pool's mean
and std; every image must have the same size.
"""

from __future__ import annotations

import functools
from urllib.parse import parse_qsl

import numpy as np

from flcore.schema import ConfigError

PREFIX = "hf:"
OPTIONS = ("image", "label")


class HFDatasetError(ConfigError):
    """A hf: dataset that cannot be loaded or read: the message names the key, the dataset and what to do (a
    ConfigError, so the command line and the ServerApp refuse the run with it before round 1)."""


def parse_name(value: str) -> tuple[str, dict[str, str]]:
    """``hf:<name>?image=<col>&label=<col>`` -> (name, {option: column}); HFDatasetError for a bad value."""
    if not value.startswith(PREFIX) or len(value) == len(PREFIX):
        raise HFDatasetError(f"run-config key 'dataset' = {value!r}: expected 'hf:<name>' (a Hugging Face dataset id or folder)")
    name, _, query = value[len(PREFIX):].partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=False)) if query else {}
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown or any(not v for v in options.values()):
        raise HFDatasetError(f"run-config key 'dataset' = {value!r}: after '?' only image=<column> and label=<column> are allowed "
                             f"(got {query!r})")
    return name, options


def _find_column(features, option: str, named: str | None, value: str) -> str:
    import datasets

    columns = list(features)
    if named:
        if named not in features:
            raise HFDatasetError(f"run-config key 'dataset' = {value!r}: no column {named!r} (columns: {', '.join(columns)})")
        return named
    kind = datasets.Image if option == "image" else datasets.ClassLabel
    found = [c for c, f in features.items() if isinstance(f, kind)]
    if len(found) == 1:
        return found[0]
    if option == "label" and not found and "label" in features:
        return "label"
    what = "several" if found else "no"
    raise HFDatasetError(f"run-config key 'dataset' = {value!r}: {what} {kind.__name__} column(s) to use as the {option} "
                         f"({', '.join(found) or 'columns: ' + ', '.join(columns)}); name it: "
                         f"'hf:<name>?{option}=<column>'")


def _load_splits(name: str, value: str):
    """The dataset's splits through FederatedDataset (no shuffling: the pool is fixed; the run seed shuffles
    it when partitioning)."""
    import datasets
    from flwr_datasets import FederatedDataset

    datasets.disable_progress_bars()  # one bar per split and client process otherwise
    fds = FederatedDataset(dataset=name, partitioners={"train": 1}, shuffle=False)
    try:
        train = fds.load_split("train")
    except ValueError as exc:
        raise HFDatasetError(f"run-config key 'dataset' = {value!r}: {exc} (a 'train' split is the training pool)") from None
    except Exception as exc:  # network, Hub, file and format errors of datasets.load_dataset
        raise HFDatasetError(f"run-config key 'dataset' = {value!r}: FederatedDataset could not load {name!r} "
                             f"({type(exc).__name__}: {str(exc)[:300]}); a Hub dataset needs network access "
                             "(or the Hugging Face cache of an earlier download)") from None
    try:
        test = fds.load_split("test")
    except ValueError:
        test = None
    finally:
        _end_telemetry()
    return train, test


def _end_telemetry() -> None:
    """Let flwr-datasets' telemetry worker end. FederatedDataset's load_split submits a usage event
    (FLWR_TELEMETRY_ENABLED=0 turns off only the POST) to a thread pool whose worker is a non-daemon thread that
    waits for more: ``noniid-fl run`` joins such threads before it exits and would wait forever."""
    from flwr_datasets.common import telemetry

    executor = telemetry.state.get("executor")
    if executor is not None:
        executor.shutdown(wait=False)  # the worker finishes a pending event (POST timeout 60 s), then ends
        telemetry.state["executor"] = None


def _arrays(ds, image: str, label: str, value: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images N x C x H x W, int64 labels) of a split."""
    images = [np.asarray(im.convert("RGB") if im.mode not in ("L", "RGB") else im) for im in ds[image]]
    shapes = {im.shape for im in images}
    if len(shapes) != 1:
        raise HFDatasetError(f"run-config key 'dataset' = {value!r}: images of {len(shapes)} different shapes "
                             f"(e.g. {sorted(shapes)[:2]}); every image must have the same size")
    x = np.stack(images)
    x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
    return x, np.asarray(ds[label], dtype=np.int64)


def standardise(x_train: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images as float32 in [0, 1], standardised per channel with the training pool's mean and std."""
    scaled = x_train.astype(np.float64) / 255.0  # statistics in float64
    mean = scaled.mean(axis=(0, 2, 3)).reshape(1, -1, 1, 1)
    std = np.maximum(scaled.std(axis=(0, 2, 3)), 1e-6).reshape(1, -1, 1, 1)
    test = (x_test.astype(np.float64) / 255.0 - mean) / std
    return ((scaled - mean) / std).astype(np.float32), test.astype(np.float32)


@functools.lru_cache(maxsize=2)
def load_hf(value: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None, int]:
    """(x_train, y_train, x_test or None, y_test or None, num_classes) of ``hf:<name>[?...]``: uint8 images
    N x C x H x W (cached)."""
    name, options = parse_name(value)
    train, test = _load_splits(name, value)
    image = _find_column(train.features, "image", options.get("image"), value)
    label = _find_column(train.features, "label", options.get("label"), value)
    x_train, y_train = _arrays(train, image, label, value)
    x_test = y_test = None
    if test is not None:
        x_test, y_test = _arrays(test, image, label, value)
        if x_test.shape[1:] != x_train.shape[1:]:
            raise HFDatasetError(f"run-config key 'dataset' = {value!r}: test images {x_test.shape[1:]} vs train "
                                 f"images {x_train.shape[1:]}")
    feature = train.features[label]
    num_classes = int(feature.num_classes) if hasattr(feature, "num_classes") else int(y_train.max()) + 1
    if y_test is not None and len(y_test):
        num_classes = max(num_classes, int(y_test.max()) + 1)
    return x_train, y_train, x_test, y_test, num_classes
