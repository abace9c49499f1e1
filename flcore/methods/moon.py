"""MOON (Li, He and Song, CVPR 2021): model-contrastive loss with the previous local model (paper Eq. 3-4)."""

from dataclasses import dataclass

from flcore.declaration import FEDAVG_STRATEGY, MethodDecl, Payload
from flcore.schema import Section, param

STATE_PREV = "moon-prev-model"   # client state: the client's previous local model


@dataclass(frozen=True)
class MoonConfig(Section):
    NAME = "moon"
    mu: float = param(1.0, "weight of l_con (Eq. 4; the paper: 5 for CIFAR-10, 1 for CIFAR-100 and Tiny-ImageNet; "
                           "1: the authors' code default, QinbinLi/MOON main.py get_args --mu)", ge=0, old="moon-mu")
    tau: float = param(0.5, "temperature of l_con (Eq. 3; paper 0.5; authors' main.py get_args --temperature 0.5)",
                       gt=0, old="moon-tau")
    proj_dim: int = param(256, "output width of the projection head (paper 256; authors' main.py get_args "
                               "--out_dim 256)", ge=1, old="moon-proj-dim")


METHODS = [MethodDecl("moon", "Li, He and Song, CVPR 2021 (MOON)", FEDAVG_STRATEGY,
                      "client_app.trainers.moon:MoonTrainer", config=MoonConfig,
                      model_hook="models.extras:add_moon_projection", payload=Payload(state=(STATE_PREV,)))]
