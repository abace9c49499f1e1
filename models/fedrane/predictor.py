"""FedRANE's predictor and the authors' ConvNet (seed 000; docs/METHODS.md, FedRANE).

- :class:`MLPPredictor`: the paper's predictor, "a multi-perception layer module" (Sec. 3.2) on the augmented
  representation Z_hat: Linear(d, h), ReLU, Linear(h, C). The paper states neither depth nor width; we take the
  smallest multi-layer perceptron, one hidden layer, of width h = d (``fedrane.lra-predictor-hidden`` = 0), the
  paper's "embedding dimension similar to the output of the representation model" (Sec. 4.1).
- :func:`cnn_model`: the feature extractor of the authors' code (XeniaLLL/HyperFed_and_FedRANE-master,
  system/flcore/trainmodel/models.py CNNModel with ``fc`` replaced by nn.Identity in main.py run): two 5x5
  convolutions of 16 and 32 channels (padding 2), each followed by ReLU and 2x2 max-pooling, flattened
  (32 x 7 x 7 = 1568 values on a 28x28 image), no embedding layer (``fedrane-code.flat-features``).
"""

from __future__ import annotations

import torch
from torch import nn

from models.networks import Flatten


class MLPPredictor(nn.Module):
    """logits = W_2 ReLU(W_1 h + b_1) + b_2 (W_1: h x d, W_2: C x h), PyTorch's default initialisation."""

    def __init__(self, dim: int, num_classes: int, hidden: int = 0) -> None:
        super().__init__()
        width = hidden if hidden > 0 else dim
        self.hidden = nn.Linear(dim, width)
        self.out = nn.Linear(width, num_classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(h)))


def cnn_model(in_shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    """(the authors' CNNModel body, its flattened feature dimension) for images of shape (c, h, w)."""
    c, h, w = in_shape
    body = nn.Sequential(
        nn.Conv2d(c, 16, 5, stride=1, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, stride=1, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        Flatten(),
    )
    with torch.no_grad():
        dim = int(body(torch.zeros(1, c, h, w)).shape[1])
    return body, dim
