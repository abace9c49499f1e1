"""Model hooks: the federated modules a method adds to the model (``model.extras``), built identically on
the server (initial model, central evaluation) and on every client. Each is named by its method's
declaration (flcore/methods/*) as ``model_hook``; FedRANE's LRA neck is in models/fedrane/neck.py."""

from __future__ import annotations

from torch import nn

from flcore.config import RunConfig
from flcore.methods.fedufo import FedUFOConfig
from flcore.methods.moon import MoonConfig
from models.base import FLModel


def add_moon_projection(model: FLModel, cfg: RunConfig) -> None:
    """MOON's projection head d -> d -> moon.proj-dim in ``model.extras["proj"]`` (Li et al. 2021, Sec. 3.2)."""
    d = model.feature_dim
    model.extras["proj"] = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, cfg.section(MoonConfig).proj_dim))


class ProjectionHead(nn.Sequential):
    """FedBR's P_theta: MLP d -> 2d -> 2d -> d with ReLU (authors' code: DomainBed MLP of width 2d, depth 3)."""

    def __init__(self, dim: int) -> None:
        super().__init__(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, 2 * dim), nn.ReLU(),
                         nn.Linear(2 * dim, dim))


def add_fedbr_projection(model: FLModel, cfg: RunConfig) -> None:
    """FedBR's P_theta in ``model.extras["proj"]``; it is trained (max step) and averaged."""
    model.extras["proj"] = ProjectionHead(model.feature_dim)


class Discriminator(nn.Sequential):
    """FedUFO's D (Sec. 3.2 / 4.1.1): Linear(d, d) -> ReLU -> Linear(d, K); logits over client ids."""

    def __init__(self, feature_dim: int, num_clients: int) -> None:
        super().__init__(nn.Linear(feature_dim, feature_dim), nn.ReLU(), nn.Linear(feature_dim, num_clients))


def add_discriminator(model: FLModel, cfg: RunConfig) -> None:
    """FedUFO: ``model.extras["disc"]`` = D with fedufo.num-clients outputs, only when UAD is on (without it D
    would never train yet travel in every message; the CGL-only mode costs exactly FedAvg's bandwidth)."""
    ufo = cfg.section(FedUFOConfig)
    if "uad" in ufo.losses:
        model.extras["disc"] = Discriminator(model.feature_dim, ufo.num_clients)
