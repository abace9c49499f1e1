"""models/representation.py: the collapse measures of a model's representations, with values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from client_app.trainers.feddecorr import decorrelation_loss
from models.evaluation import evaluate
from models.representation import FeatureMoments, collapse_stats, correlation_strength, effective_rank


def test_effective_rank_counts_the_directions_the_variance_spreads_over() -> None:
    d = 8
    assert effective_rank(np.eye(d)) == pytest.approx(d)
    assert effective_rank(5.0 * np.eye(d)) == pytest.approx(d)                     # scale-free
    u = np.arange(1.0, d + 1)[:, None]
    assert effective_rank(u @ u.T) == pytest.approx(1.0)                          # one direction
    assert effective_rank(np.diag([1.0, 1.0, 1.0, 0, 0, 0, 0, 0])) == pytest.approx(3.0)
    assert effective_rank(np.zeros((d, d))) == 0.0                                # no variance at all
    # two directions with variances 3:1: exp(H(3/4, 1/4))
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert effective_rank(np.diag([3.0, 1.0, 0.0])) == pytest.approx(math.exp(h))
    rot, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
    assert effective_rank(rot @ np.diag([3.0, 1.0, 0.0]) @ rot.T) == pytest.approx(math.exp(h))  # basis-free


def test_correlation_strength_is_one_over_d_for_independent_dimensions_and_one_for_a_single_one() -> None:
    d = 6
    assert correlation_strength(np.diag(np.arange(1.0, d + 1))) == pytest.approx(1 / d)
    u = np.arange(1.0, d + 1)[:, None]
    assert correlation_strength(u @ u.T) == pytest.approx(1.0)
    # a dead dimension (no variance) adds a zero row and column, as FedDecorr's z-scoring does
    assert correlation_strength(np.diag([1.0, 1.0, 0.0])) == pytest.approx(2 / 9)


def test_on_one_batch_the_correlation_strength_is_feddecorrs_paper_loss() -> None:
    z = torch.randn(40, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    z[:, 3] = 2 * z[:, 0] + 0.1 * z[:, 3]
    m = FeatureMoments()
    m.add(z)
    assert correlation_strength(m.covariance()) == pytest.approx(float(decorrelation_loss(z, 1e-8, "paper")),
                                                                 rel=1e-10)


def test_moments_added_by_batches_give_the_sets_biased_covariance() -> None:
    z = torch.randn(103, 7, generator=torch.Generator().manual_seed(2)) * torch.arange(1, 8) + 3.0
    m = FeatureMoments()
    for start in range(0, 103, 10):
        m.add(z[start:start + 10])
    assert m.count == 103
    np.testing.assert_allclose(m.covariance(), np.cov(z.double().numpy(), rowvar=False, bias=True), atol=1e-9)
    stats = collapse_stats(m, "global_feature")
    assert stats["global_feature_dim"] == 7 and 1.0 < stats["global_feature_erank"] < 7.0
    with pytest.raises(ValueError, match="width 3 added to moments of width 7"):
        m.add(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="no feature rows"):
        FeatureMoments().covariance()


def test_evaluate_with_moments_scores_the_same_and_collects_every_rows_representation() -> None:
    from flcore.config import RunConfig
    from models import build_model

    torch.manual_seed(0)
    model = build_model(RunConfig.from_dict({"model": "mlp"}), (1, 8, 8), 10)
    x = torch.randn(37, 1, 8, 8)
    y = torch.randint(0, 10, (37,))
    m = FeatureMoments()
    assert evaluate(model, x, y, batch_size=8, moments=m) == evaluate(model, x, y, batch_size=8)
    with torch.no_grad():  # in evaluate's batches of 8: a float32 product's rounding depends on the batch on some
        z = torch.cat([model.features(x[i:i + 8]) for i in range(0, 37, 8)]).double().numpy()  # CPUs (AVX-512 MKL)
    assert m.count == 37
    np.testing.assert_allclose(m.covariance(), np.cov(z, rowvar=False, bias=True), atol=1e-9)
    with pytest.raises(ValueError, match="forward_features"):
        evaluate(model, x, y, forward=lambda mod, xb: mod(xb), moments=FeatureMoments())
