"""FedRANE's client (LRA, seed 000, Alg. 1 l. 10-20): local objective L = CE(predictor(Z_hat), y) + lambda_CD L_CD.

The LRA module itself is the model's neck (models/lra.py, installed by the ``add_lra_neck`` model hook),
so it is federated with the rest of the model. This trainer changes only how a training step computes
its outputs (Z, Z_hat both kept) and adds the contrastive-discrimination term (Eq. 7, Eq. 9) to the one
local loop. P-FL ("local-accuracy") is the base trainer's evaluation of the trained model.
"""

from __future__ import annotations

import torch
from torch import nn

from client_app.trainers.base import Trainer, TrainJob
from client_app.training import LossTerm, Step, TrainStats
from flcore.methods.fedrane import CD_LOSS
from models.lra import LRANeck, contrastive_discrimination


class ContrastiveTerm(LossTerm):
    """lambda_CD * L_CD(Z, Z_hat) for the minibatch the trainer's forward just produced."""

    def __init__(self, trainer: "LRATrainer") -> None:
        self.trainer = trainer
        self.sum = 0.0
        self.count = 0

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        neck = self.trainer.neck
        z_hat = self.trainer.last_z_hat
        if neck.cfg.lra_lambda_cd == 0 or z_hat is None or step.features.shape[0] < 2:
            return None  # a batch of one has no negatives
        cd = contrastive_discrimination(step.features, z_hat, neck.cfg.lra_tau, neck.cfg.lra_cd_symmetric)
        self.sum += float(cd.detach())
        self.count += 1
        return neck.cfg.lra_lambda_cd * cd


class LRATrainer(Trainer):
    """Local training through the LRA neck with the contrastive-discrimination term."""

    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        neck = getattr(job.model, "neck", None)
        if not isinstance(neck, LRANeck):
            raise ValueError(f"client {job.cid}: method '{job.cfg.method}' trains with LRA but the model has no "
                             "LRA neck (the method's model hook 'models.lra:add_lra_neck' was not applied)")
        self.neck = neck
        self.last_z_hat: torch.Tensor | None = None
        self.cd_term = ContrastiveTerm(self)

    def terms(self) -> list[LossTerm]:
        return [self.cd_term]

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor):
        """(logits, Z) with logits = predictor(mix(Z, Z_hat)); Z_hat kept for L_CD."""
        z = model.features(x)
        z_hat = self.neck.augment(z)
        self.last_z_hat = z_hat
        return model.head(self.neck.mix(z, z_hat)), z

    def extra_metrics(self, stats: TrainStats) -> dict[str, float | int]:
        t = self.cd_term
        return {CD_LOSS: t.sum / t.count if t.count else 0.0}
