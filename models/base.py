"""The federated model: feature extractor -> neck -> head, plus method modules in ``extras``.

Every network here is an :class:`FLModel` so methods can read features (MOON, FedBR, GMV), put a module
between extractor and head (FedRANE's LRA neck), swap the head (fixed simplex ETF) or add federated
modules that are trained and averaged with the model (projection heads, FedUFO's discriminator).
The state dict of the whole thing is what travels between server and clients.
"""

from __future__ import annotations

import torch
from torch import nn


class FLModel(nn.Module):
    # set by models.build_model: what the backbone was built from (for a model hook that rebuilds the extractor)
    input_shape: tuple[int, ...]
    backbone_name: str

    def __init__(self, backbone: nn.Module, head: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.backbone: nn.Module = backbone
        self.neck: nn.Module = nn.Identity()
        self.head: nn.Module = head
        self.extras = nn.ModuleDict()
        self.feature_dim = feature_dim
        self.num_classes = num_classes

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Extractor output z = F(x), shape (B, feature_dim)."""
        return self.backbone(x)

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, z) with logits = head(neck(z))."""
        z = self.features(x)
        return self.head(self.neck(z)), z

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)[0]
