from collections import OrderedDict

import numpy as np
import pytest

from strategies.aggregation import apply_update, deltas, flat_norm, weighted_average
from strategies.update_screen import update_problem


def P(**arrays):
    return OrderedDict((k, np.asarray(v)) for k, v in arrays.items())


def test_weighted_average_equals_weighted_mean():
    a = P(w=np.array([1.0, 2.0], np.float32), n=np.array(4, np.int64))
    b = P(w=np.array([3.0, 6.0], np.float32), n=np.array(8, np.int64))
    out = weighted_average([a, b], [1, 3])
    assert np.allclose(out["w"], [2.5, 5.0]) and out["w"].dtype == np.float32
    assert out["n"] == 7 and out["n"].dtype == np.int64
    with pytest.raises(ValueError):
        weighted_average([a, b], [0, 0])


def test_deltas_apply_and_norm():
    g = P(w=np.array([1.0, 1.0], np.float32))
    x = P(w=np.array([4.0, 5.0], np.float32))
    d = deltas(g, x)
    assert flat_norm(d) == pytest.approx(5.0)
    assert np.allclose(apply_update(g, d, 0.5)["w"], [2.5, 3.0])


def test_update_problem_catches_bad_updates():
    ref = P(w=np.zeros((2, 2), np.float32))
    assert update_problem(P(w=np.ones((2, 2), np.float32)), ref, 10.0) is None
    assert "shape" in update_problem(P(w=np.ones(4, np.float32)), ref, 10.0)
    assert "dtype" in update_problem(P(w=np.ones((2, 2), np.float64)), ref, 10.0)
    assert "NaN" in update_problem(P(w=np.full((2, 2), np.nan, np.float32)), ref, 10.0)
    assert "missing" in update_problem(P(v=np.ones((2, 2), np.float32)), ref, 10.0)
    assert "exceeds max-update-norm" in update_problem(P(w=np.full((2, 2), 100, np.float32)), ref, 10.0)
