"""q-FedAvg (Li et al., ICLR 2020, Alg. 2), client side: plain local SGD, plus F_k(w^t).

The server step needs F_k = the loss of the *received* global model w^t on client k's training data,
measured before local training (Alg. 2, line "each selected device k computes F_k(w^t)"). It is reported
as ``global-model-train-loss``; the local test split is never used for aggregation.
"""

from __future__ import annotations

from client_app.trainers.base import Trainer
from client_app.training import evaluate
from flcore.methods.qfedavg import LOSS_KEY


class QFedAvgTrainer(Trainer):
    def before_fit(self) -> dict[str, float | int]:
        d = self.job.data
        loss, _ = evaluate(self.job.model, d.x_train, d.y_train)
        return {LOSS_KEY: loss}
