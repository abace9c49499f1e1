"""FedAdam / FedYogi (issue 3): first and second server steps by hand, bias-correction option, resume."""

import math

import numpy as np
import pytest

from flcore.config import ConfigError
from strategies.base import ClientUpdate
from strategies.methods.fedopt import FedAdamStrategy, FedYogiStrategy, second_moment
from tests._baselines_util import bound_error, make_cfg

X = {"w": np.array([1.0, -2.0], np.float32)}


def updates(*models):
    return [ClientUpdate(i, {"w": np.asarray(m, np.float32)}, n, {}, {}) for i, (m, n) in enumerate(models)]


def cfg(method, **kw):
    base = dict(eta=0.1, tau=0.01, beta1=0.9, beta2=0.99)
    base.update(kw)
    return make_cfg(method=method, **base)


def test_fedadam_first_step_matches_formula():
    s = FedAdamStrategy(cfg("fedadam"))
    # weighted pseudo-gradient: (1 * [3, -4] + 3 * [2, -3]) / 4 - [1, -2] = [1.25, -1.25]
    ups = updates(([3.0, -4.0], 1), ([2.0, -3.0], 3))
    new = s.aggregate(1, X, ups)
    delta = np.array([1.25, -1.25])
    m = 0.1 * delta
    v = 0.99 * 0.01 ** 2 + 0.01 * delta ** 2  # v_0 = tau^2
    expected = X["w"] + 0.1 * m / (np.sqrt(v) + 0.01)
    np.testing.assert_allclose(new["w"], expected, rtol=1e-6)
    # coordinate 0 by hand: m = 0.125, v = 9.9e-5 + 0.015625 = 0.015724
    assert new["w"][0] == pytest.approx(1.0 + 0.1 * 0.125 / (math.sqrt(0.015724) + 0.01), rel=1e-6)


def test_fedyogi_first_and_second_step():
    s = FedYogiStrategy(cfg("fedyogi"))
    new = s.aggregate(1, X, updates(([2.0, -2.0], 1)))  # delta = [1, 0]
    v1 = np.array([1e-4 + 0.01 * 1.0, 1e-4])  # v - (1-b2) d^2 sign(v - d^2): sign(1e-4 - 1) = -1; d=0 -> v
    m1 = np.array([0.1, 0.0])
    np.testing.assert_allclose(s.v["w"], v1)
    np.testing.assert_allclose(new["w"], X["w"] + 0.1 * m1 / (np.sqrt(v1) + 0.01), rtol=1e-6)
    x1 = {"w": new["w"]}
    new2 = s.aggregate(2, x1, updates((x1["w"] + np.array([0.5, 0.5], np.float32), 1)))
    d2 = np.array([0.5, 0.5])
    m2 = 0.9 * m1 + 0.1 * d2
    v2 = v1 - 0.01 * d2 ** 2 * np.sign(v1 - d2 ** 2)
    np.testing.assert_allclose(new2["w"], x1["w"] + 0.1 * m2 / (np.sqrt(v2) + 0.01), rtol=1e-5)


def test_second_moment_rules():
    v, d = np.array([1.0, 0.0]), np.array([0.5, 2.0])
    np.testing.assert_allclose(second_moment(v, d, 0.9, "adam"), [0.9 + 0.025, 0.4])
    np.testing.assert_allclose(second_moment(v, d, 0.9, "yogi"), [1.0 - 0.025, 0.4])
    with pytest.raises(ValueError):
        second_moment(v, d, 0.9, "sgd")


def test_bias_correction_option():
    s = FedAdamStrategy(cfg("fedadam", bias_correction=True))
    new = s.aggregate(1, X, updates(([3.0, -2.0], 1)))  # delta = [2, 0]
    m_hat = 0.1 * np.array([2.0, 0.0]) / 0.1
    v_hat = (0.99 * 1e-4 + 0.01 * np.array([4.0, 0.0])) / 0.01
    np.testing.assert_allclose(new["w"], X["w"] + 0.1 * m_hat / (np.sqrt(v_hat) + 0.01), rtol=1e-6)


def test_resume_gives_the_same_next_step():
    a = FedAdamStrategy(cfg("fedadam"))
    x1 = a.aggregate(1, X, updates(([3.0, -4.0], 1)))
    b = FedAdamStrategy(cfg("fedadam"))
    b.load_state_dict(a.state_dict())
    ups = updates((x1["w"] + 1.0, 1))
    np.testing.assert_array_equal(a.aggregate(2, x1, ups)["w"], b.aggregate(2, x1, ups)["w"])
    assert b.t == 2


def test_bad_values_name_the_key():
    with pytest.raises(ConfigError, match=bound_error("fedopt.beta1", 1.0, ">= 0, < 1, finite")):
        FedAdamStrategy(cfg("fedadam", beta1=1.0))
    with pytest.raises(ConfigError, match=bound_error("fedopt.tau", 0.0, "> 0, finite")):
        FedYogiStrategy(cfg("fedyogi", tau=0.0))
