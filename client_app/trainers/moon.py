"""MOON: model-contrastive federated learning (Li, He & Song, CVPR 2021), client side.

Local objective (paper Eq. 3-4), per minibatch:
    l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )
    loss  = CE + mu * l_con
with z, z_glob, z_prev the projected representations of x under the model being trained, the received
global model and this client's previous local model; sim = cosine similarity. The server is FedAvg.

Projection head: a 2-layer MLP (d -> d -> moon-proj-dim, ReLU) stored in ``model.extras["proj"]`` by the
model hook :func:`models.extras.add_moon_projection`, so it is trained and averaged with the model. Deviation from the
paper: there the classifier sits on top of the projection; here the head keeps reading the backbone
features and the projection is a side branch used only by l_con (the model layout every method shares).
The previous local model lives in the client's persistent state (``moon-prev-model``). On a client's first
participation there is no previous model; the authors' code then uses the global model in its place, which
makes l_con the constant log 2 with zero gradient, so the term is skipped.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from client_app.trainers.base import Trainer, TrainJob, frozen_copy
from client_app.training import LossTerm, Step, TrainStats
from flcore.methods.moon import STATE_PREV, MoonConfig
from flcore.records import load_params, model_params
from models.base import FLModel


def moon_contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """Mean over the batch of l_con (MOON Eq. 3): a 2-way softmax cross-entropy with the global
    representation as the positive and the previous local one as the negative, cosine similarity / tau."""
    pos = F.cosine_similarity(z, z_glob, dim=1) / tau
    neg = F.cosine_similarity(z, z_prev, dim=1) / tau
    logits = torch.stack([pos, neg], dim=1)
    return F.cross_entropy(logits, torch.zeros(z.shape[0], dtype=torch.long, device=z.device))


def projection(model: nn.Module) -> nn.Module:
    extras = getattr(model, "extras", None)
    if extras is None or "proj" not in extras:
        raise KeyError("MOON needs the projection head model.extras['proj'] "
                       "(model hook models.extras:add_moon_projection)")
    return extras["proj"]


class MoonTerm(LossTerm):
    """mu * l_con on the projected backbone features of each minibatch."""

    def __init__(self, global_model: FLModel, prev_model: FLModel | None, mu: float, tau: float) -> None:
        self.global_model, self.prev_model = global_model, prev_model
        self.mu, self.tau = float(mu), float(tau)

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        if self.prev_model is None or self.mu == 0.0:
            return None
        z = projection(model)(step.features)
        with torch.no_grad():
            z_glob = projection(self.global_model)(self.global_model.features(step.x))
            z_prev = projection(self.prev_model)(self.prev_model.features(step.x))
        return self.mu * moon_contrastive_loss(z, z_glob, z_prev, self.tau)


class MoonTrainer(Trainer):
    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        self.mcfg = job.cfg.section(MoonConfig)
        projection(job.model)  # fail early, naming the missing hook

    def _previous_model(self) -> FLModel | None:
        stored = self.job.state.get_arrays(STATE_PREV)
        if stored is None:
            return None
        prev = frozen_copy(self.job.model)
        try:
            load_params(prev, stored)
        except (RuntimeError, KeyError) as exc:
            raise RuntimeError(f"client {self.job.cid}: stored MOON previous model does not fit the model: {exc}") from exc
        return prev

    def terms(self) -> list[LossTerm]:
        return [MoonTerm(frozen_copy(self.job.model), self._previous_model(), self.mcfg.mu, self.mcfg.tau)]

    def fit(self) -> TrainStats:
        stats = super().fit()
        self.job.state.put_arrays(STATE_PREV, model_params(self.job.model))
        return stats
