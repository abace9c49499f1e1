"""SphereFed (flcore/methods/spherefed.py): the fixed orthogonal classifier on unit-norm features, its loss, and
the closed-form calibration after the last round, checked by values."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from client_app.app import load_client_data
from client_app.trainers.spherefed import calibration_stats, mse_to_onehot
from flcore.config import RunConfig, resolve_run_config
from models import build_model
from models.heads import OrthogonalHead, random_orthogonal
from strategies.methods.spherefed import calibrated_classifier, sum_reports
from flcore.records import params_to_record


def cfg_of(**over) -> RunConfig:
    return RunConfig.from_dict(resolve_run_config({"method": "spherefed", "dataset": "digits", **over}))


def test_the_fixed_classifier_has_orthonormal_columns_and_depends_only_on_the_seed():
    w = random_orthogonal(64, 10, seed=3).double()
    assert w.shape == (64, 10)
    assert torch.allclose(w.T @ w, torch.eye(10, dtype=torch.float64), atol=1e-6)
    assert torch.equal(random_orthogonal(64, 10, seed=3), random_orthogonal(64, 10, seed=3))
    assert not torch.allclose(random_orthogonal(64, 10, seed=4), random_orthogonal(64, 10, seed=3))
    with pytest.raises(ValueError, match="feature_dim >= 10"):
        random_orthogonal(8, 10, seed=0)


def test_the_model_puts_features_on_the_unit_sphere_and_cannot_train_the_classifier():
    cfg = cfg_of(model="mlp")
    model = build_model(cfg, (64,), 10)
    x = torch.randn(7, 64) * 5
    z = model.features(x)
    assert torch.allclose(z.norm(dim=1), torch.ones(7), atol=1e-6)
    assert isinstance(model.head, OrthogonalHead)
    assert "head.weight" not in dict(model.named_parameters())          # a buffer, not a parameter
    assert torch.allclose(model(x), z @ random_orthogonal(200, 10, cfg.seed), atol=1e-6)
    with pytest.raises(ValueError, match="'head' must be 'linear'"):
        build_model(cfg_of(model="mlp", head="etf"), (64,), 10)


def test_mse_loss_is_the_mean_squared_distance_to_the_one_hot_label():
    logits = torch.tensor([[0.5, -0.5, 0.0], [1.0, 0.0, 0.0]])
    y = torch.tensor([0, 2])
    # (0.25 + 0.25 + 0) + (1 + 0 + 1) = 2.5 over 6 entries
    assert float(mse_to_onehot(logits, y)) == pytest.approx(2.5 / 6)


def test_calibration_is_the_least_squares_classifier_of_the_pooled_data():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(50, 8))
    y = rng.integers(0, 3, size=50)
    onehot = np.eye(3)[y]
    # three clients' reports summed = the pooled statistics
    parts = [slice(0, 10), slice(10, 35), slice(35, 50)]
    reports = []
    for s in parts:
        v, u = calibration_stats(torch.as_tensor(h[s]), torch.as_tensor(y[s]), 3)
        reports.append(params_to_record({"v": v, "u": u}))
    v, u, problems = sum_reports(reports, (8, 8), (8, 3))
    assert problems == []
    w, rank = calibrated_classifier(v, u)
    assert rank == 8
    np.testing.assert_allclose(w, np.linalg.lstsq(h, onehot, rcond=None)[0], atol=1e-10)
    # ridge rho: the least-squares solve of [H; sqrt(rho) I] W = [Y; 0]
    w_r, _ = calibrated_classifier(v, u, ridge=2.0)
    aug_h = np.vstack([h, np.sqrt(2.0) * np.eye(8)])
    aug_y = np.vstack([onehot, np.zeros((8, 3))])
    np.testing.assert_allclose(w_r, np.linalg.lstsq(aug_h, aug_y, rcond=None)[0], atol=1e-10)


def test_calibration_with_fewer_samples_than_dimensions_is_the_minimum_norm_solution():
    rng = np.random.default_rng(1)
    h = rng.normal(size=(5, 12))
    onehot = np.eye(4)[rng.integers(0, 4, size=5)]
    w, rank = calibrated_classifier(h.T @ h, h.T @ onehot)
    assert rank == 5
    np.testing.assert_allclose(w, np.linalg.pinv(h) @ onehot, atol=1e-9)


def test_features_collapsed_onto_the_fixed_classifier_calibrate_to_it():
    """Reduction: when every feature is its class's column w_c (perfect collapse onto the fixed classifier),
    least squares has nothing to correct and returns W itself."""
    w = random_orthogonal(16, 5, seed=7).double().numpy()
    y = np.array([0, 0, 1, 2, 2, 2, 3, 4, 4])
    h = w[:, y].T
    w_cal, rank = calibrated_classifier(h.T @ h, h.T @ np.eye(5)[y])
    assert rank == 5
    np.testing.assert_allclose(w_cal, w, atol=1e-7)     # W is float32: orthonormal to ~1e-7


def test_a_malformed_report_is_named_and_left_out():
    good = params_to_record({"v": np.eye(2), "u": np.ones((2, 3))})
    bad = params_to_record({"v": np.eye(3), "u": np.ones((3, 3))})
    nan = params_to_record({"v": np.full((2, 2), np.nan), "u": np.ones((2, 3))})
    v, u, problems = sum_reports([good, bad, nan, None], (2, 2), (2, 3))
    np.testing.assert_array_equal(v, np.eye(2))
    assert len(problems) == 3 and "NaN" in problems[1]


def test_a_run_ends_with_the_calibrated_classifier_of_the_final_model(tmp_path):
    """Two rounds in-process: the final head is (sum_k V_k)^+ (sum_k U_k) computed here from every client's
    training data under the final model's feature extractor; round 1 is not calibrated."""
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    cfg = RunConfig.from_dict(resolve_run_config({
        "method": "spherefed", "dataset": "digits", "model": "mlp", "num-server-rounds": 2, "lr": 0.5,
        "max-local-steps": 3, "checkpoint": False, "out-dir": str(tmp_path / "run")}))
    run_federation(FakeGrid(3), cfg)
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [r["strategy"]["spherefed-calibrated"] for r in doc["rounds"]] == [0, 1]
    assert doc["rounds"][1]["strategy"]["spherefed-calibration-clients"] == 3
    state = torch.load(tmp_path / "run" / "final_model.pt")
    model = build_model(cfg, (64,), 10)
    model.load_state_dict(state)
    v, u = np.zeros((200, 200)), np.zeros((200, 10))
    for i in range(3):
        _, data = load_client_data(cfg, {"partition-id": i, "num-partitions": 3}, torch.device("cpu"))
        with torch.no_grad():
            vk, uk = calibration_stats(model.features(data.x_train), data.y_train, 10)
        v, u = v + vk, u + uk
    expected, _ = calibrated_classifier(v, u)
    np.testing.assert_allclose(state["head.weight"].double().numpy(), expected, rtol=1e-4, atol=1e-4)
    assert doc["rounds"][1]["global_accuracy"] > doc["rounds"][0]["global_accuracy"]
