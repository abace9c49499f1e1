"""SphereFed's client (flcore/methods/spherefed.py): local training on unit-norm features against the fixed
orthogonal classifier (the model hook built both), with MSE to the one-hot label or cross-entropy; and, for the
calibration message after the last round (``train.calibrate``), this client's V = sum_i h_i h_i^T and
U = sum_i h_i onehot(y_i)^T over its training data under the received model, sent instead of an update (the
model goes back unchanged, with the base reply metrics of a round without training: no steps, train_loss NaN,
the received model's accuracy on the local test split as both the local and the global-model figure)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from client_app.trainers.base import Trainer, TrainReply
from client_app.training import TrainStats, evaluate, local_train
from flcore.methods.spherefed import CALIBRATE_ACTION, CALIBRATION_RECORD, SphereFedConfig
from flcore.records import params_to_record


def mse_to_onehot(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over the B x C entries of (logits - onehot(y))^2 (torch's MSELoss on one-hot targets)."""
    return F.mse_loss(logits, F.one_hot(y, logits.shape[1]).to(logits.dtype))


@torch.no_grad()
def calibration_stats(features: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(V, U) = (H^T H, H^T Y) in float64 for feature rows H (n x d) and one-hot labels Y (n x C)."""
    h = features.double()
    onehot = F.one_hot(y, num_classes).double()
    return (h.T @ h).cpu().numpy(), (h.T @ onehot).cpu().numpy()


class SphereTrainer(Trainer):
    """Local SGD with SphereFed's loss; the calibration statistics on a ``train.calibrate`` message."""

    def run(self) -> TrainReply:
        if self.job.phase == CALIBRATE_ACTION:
            return self.calibration_reply()
        return super().run()

    def fit(self) -> TrainStats:
        d = self.job.data
        criterion = mse_to_onehot if self.cfg.section(SphereFedConfig).loss == "mse" else F.cross_entropy
        return local_train(self.job.model, d.x_train, d.y_train, self.optim_config(), self.terms(),
                           generator=self.job.generator, forward=self.forward, criterion=criterion)

    def calibration_reply(self) -> TrainReply:
        model, d = self.job.model, self.job.data
        model.eval()
        with torch.no_grad():
            h = torch.cat([model.features(xb) for xb in d.x_train.split(512)]) if d.num_train else \
                torch.zeros(0, model.feature_dim, device=d.x_train.device)
        v, u = calibration_stats(h, d.y_train, d.num_classes)
        records: dict[str, ArrayRecord | ConfigRecord | MetricRecord] = {
            CALIBRATION_RECORD: params_to_record({"v": v, "u": u})}
        loss, acc = evaluate(model, d.x_test, d.y_test)   # the received model, which is also what goes back
        metrics: dict[str, float | int] = {
            "cid": self.job.cid, "num-examples": d.num_train, "train_loss": float("nan"), "local-steps": 0,
            "local-accuracy": acc, "local-loss": loss, "global-model-local-accuracy": acc,
            "global-model-local-loss": loss}
        return TrainReply(self.reply_params(), metrics, records)
