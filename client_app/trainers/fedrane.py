"""FedRANE's client (LRA, seed 000, Alg. 1 l. 10-20): local objective L = CE(predictor(Z_hat), y) + lambda_CD L_CD.

The LRA module itself is the model's neck (models/lra.py, installed by the ``add_lra_neck`` model hook),
so it is federated with the rest of the model. This trainer changes only how a training step computes
its outputs (Z, Z_hat both kept) and adds the contrastive-discrimination term (Eq. 7, Eq. 9) to the one
local loop. P-FL ("local-accuracy") is the base trainer's evaluation of the trained model; under inductive
evaluation (the default) each local test sample is evaluated against a fixed support set of this client's
training data (a seeded choice of its rows, the same every round). It reports the mean graph density of
its training graphs and, when it has a local test split, of its P-FL evaluation graphs.
"""

from __future__ import annotations

import torch
from torch import nn

from client_app.trainers.base import Trainer, TrainJob, TrainReply
from client_app.training import LossTerm, Step, TrainStats
from flcore.methods.fedrane import CD_LOSS, EVAL_DENSITY, TRAIN_DENSITY
from models.evaluation import eval_support
from models.lra import LRANeck, contrastive_discrimination


class ContrastiveTerm(LossTerm):
    """lambda_CD * L_CD(Z, Z_hat) for the minibatch the trainer's forward just produced (``z_hat``).

    It holds the neck, not the trainer: no reference cycle, so a finished trainer frees the model at once and
    the ClientApp's model pool can reuse it (client_app/model_pool.py counts references).
    """

    def __init__(self, neck: LRANeck) -> None:
        self.neck = neck
        self.z_hat: torch.Tensor | None = None
        self.sum = 0.0
        self.count = 0

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        cfg = self.neck.cfg
        z_hat, self.z_hat = self.z_hat, None
        if cfg.lra_lambda_cd == 0 or z_hat is None or step.features.shape[0] < 2:
            return None  # a batch of one has no negatives
        cd = contrastive_discrimination(step.features, z_hat, cfg.lra_tau, cfg.lra_cd_symmetric)
        self.sum += float(cd.detach())
        self.count += 1
        return cfg.lra_lambda_cd * cd


class LRATrainer(Trainer):
    """Local training through the LRA neck with the contrastive-discrimination term."""

    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        neck = getattr(job.model, "neck", None)
        if not isinstance(neck, LRANeck):
            raise ValueError(f"client {job.cid}: method '{job.cfg.method}' trains with LRA but the model has no "
                             "LRA neck (the method's model hook 'models.lra:add_lra_neck' was not applied)")
        self.neck = neck
        self.cd_term = ContrastiveTerm(neck)

    def run(self) -> TrainReply:
        """The base sequence, with this client's training support attached for (inductive) evaluation."""
        self.neck.stats.reset()          # a pooled model may carry counts of an earlier message
        with eval_support(self.job.model, self.job.data.x_train, (self.cfg.seed, self.job.cid)):
            return super().run()

    def terms(self) -> list[LossTerm]:
        return [self.cd_term]

    def before_fit(self) -> dict[str, float | int]:
        self.neck.stats.pop("eval")      # the received model's evaluation: not the P-FL figure
        return {}

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor):
        """(logits, Z) with logits = predictor(mix(Z, Z_hat)); Z_hat kept for L_CD."""
        z = model.features(x)
        z_hat = self.neck.augment(z)
        self.cd_term.z_hat = z_hat
        return model.head(self.neck.mix(z, z_hat)), z

    def extra_metrics(self, stats: TrainStats) -> dict[str, float | int]:
        t = self.cd_term
        out: dict[str, float | int] = {CD_LOSS: t.sum / t.count if t.count else 0.0}
        train = self.neck.stats.pop("train")
        if train is not None:
            out[TRAIN_DENSITY] = train[0]
        evaluated = self.neck.stats.pop("eval")   # None without a local test split (or with lra-eval = identity)
        if evaluated is not None:
            out[EVAL_DENSITY] = evaluated[0]
        return out
