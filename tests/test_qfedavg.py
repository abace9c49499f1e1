"""q-FedAvg (issue 3): the aggregation formula by hand, the q = 0 reduction, the loss it uses."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict

from client_app.state import ClientState
from client_app.trainers.base import ClientData, TrainJob
from client_app.trainers.qfedavg import QFedAvgTrainer
from client_app.training import evaluate
from flcore.config import ConfigError
from flcore.records import params_to_record
from models import build_model
from strategies.base import ClientUpdate
from strategies.methods.qfedavg import QFedAvgStrategy, qfedavg_aggregate
from tests._baselines_util import bound_error, make_cfg, register_sizes

W = {"w": np.array([1.0, 1.0], np.float32)}
CLIENTS = [{"w": np.array([0.0, 1.0], np.float32)}, {"w": np.array([1.0, 3.0], np.float32)}]


def test_q_zero_is_the_uniform_average_of_client_models():
    new, h_sum = qfedavg_aggregate(W, CLIENTS, [0.3, 2.0], q=0.0, lipschitz=10.0)
    np.testing.assert_allclose(new["w"], [0.5, 2.0])  # mean of the two models, whatever the losses
    assert h_sum == pytest.approx(20.0)  # sum_k L F_k^0


def test_q_one_by_hand():
    # L = 2; Delta w_1 = 2 ([1,1] - [0,1]) = [2, 0], Delta w_2 = 2 ([1,1] - [1,3]) = [0, -4]
    # F = (1, 3): h_1 = 1 * 1^0 * 4 + 2 * 1 = 6; h_2 = 1 * 3^0 * 16 + 2 * 3 = 22; sum h = 28
    # sum F^q Delta w = 1 * [2, 0] + 3 * [0, -4] = [2, -12]; w = [1, 1] - [2, -12] / 28
    new, h_sum = qfedavg_aggregate(W, CLIENTS, [1.0, 3.0], q=1.0, lipschitz=2.0)
    assert h_sum == pytest.approx(28.0, rel=1e-8)
    np.testing.assert_allclose(new["w"], [1 - 2 / 28, 1 + 12 / 28], rtol=1e-7)


def test_larger_q_moves_towards_the_high_loss_client():
    low_q, _ = qfedavg_aggregate(W, CLIENTS, [0.5, 2.0], q=0.0, lipschitz=5.0)
    high_q, _ = qfedavg_aggregate(W, CLIENTS, [0.5, 2.0], q=5.0, lipschitz=5.0)
    # client 2 (loss 2.0) wants w[1] = 3; with larger q the step in its direction grows relative to client 1's
    ratio = lambda new: (new["w"][1] - 1.0) / max(1.0 - new["w"][0], 1e-12)  # noqa: E731
    assert ratio(high_q) > ratio(low_q)


def test_strategy_uses_the_global_models_train_split_loss_and_lr():
    cfg = make_cfg(method="qfedavg", q=1.0, lr=0.5)
    s = QFedAvgStrategy(cfg)
    # the local-test loss and the in-training loss are present but must not matter
    ups = [ClientUpdate(0, CLIENTS[0], 5, {"global-model-train-loss": 1.0, "global-model-local-loss": 50.0,
                                           "train_loss": 9.0}, {}),
           ClientUpdate(1, CLIENTS[1], 5, {"global-model-train-loss": 3.0, "global-model-local-loss": 0.1,
                                           "train_loss": 9.0}, {})]
    new = s.aggregate(1, W, ups)
    np.testing.assert_allclose(new["w"], [1 - 2 / 28, 1 + 12 / 28], rtol=1e-6)  # L = 1/lr = 2


def test_trainer_reports_the_received_models_loss_on_the_training_split():
    torch.manual_seed(0)
    model = build_model(make_cfg(method="qfedavg", model="logistic"), (1, 4, 4), 3)
    x_tr, y_tr = torch.randn(12, 1, 4, 4), torch.randint(0, 3, (12,))
    x_te, y_te = torch.randn(5, 1, 4, 4), torch.randint(0, 3, (5,))
    expected_train, _ = evaluate(model, x_tr, y_tr)
    expected_test, _ = evaluate(model, x_te, y_te)
    job = TrainJob(cfg=make_cfg(method="qfedavg", model="logistic", local_epochs=2, batch_size=4), cid=0,
                   server_round=1, model=model,
                   global_params={k: v.clone() for k, v in model.state_dict().items()},
                   data=ClientData(x_tr, y_tr, x_te, y_te, 3), config={}, records={}, state=ClientState(RecordDict(), 0),
                   device=torch.device("cpu"), generator=torch.Generator().manual_seed(0))
    metrics = QFedAvgTrainer(job).run().metrics
    assert metrics["global-model-train-loss"] == pytest.approx(expected_train, rel=1e-6)
    assert metrics["global-model-local-loss"] == pytest.approx(expected_test, rel=1e-6)
    assert metrics["global-model-train-loss"] != pytest.approx(expected_test)
    assert metrics["local-steps"] == 6  # it trained after measuring


def test_reply_without_a_usable_loss_is_rejected():
    s = QFedAvgStrategy(make_cfg(method="qfedavg"))
    register_sizes(s, {7: 3, 8: 3})
    bad = RecordDict({"arrays": params_to_record(W), "metrics": MetricRecord({"num-examples": 3})})
    nan = RecordDict({"arrays": params_to_record(W),
                      "metrics": MetricRecord({"num-examples": 3, "global-model-train-loss": float("nan"),
                                               "global-model-local-loss": 0.5})})
    updates, rejected = s.collect_updates(1, {7: SimpleNamespace(content=bad), 8: SimpleNamespace(content=nan)}, W)
    assert updates == [] and [f.cid for f in rejected] == [7, 8]
    assert "missing" in rejected[0].reason and "finite" in rejected[1].reason
    with pytest.raises(ConfigError, match=bound_error("qfedavg.q", -0.1, ">= 0, finite")):
        QFedAvgStrategy(make_cfg(method="qfedavg", q=-0.1))
