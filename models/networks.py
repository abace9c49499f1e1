"""Backbones: logistic (identity), MLP, the FedRANE/FedUFO ConvNet, VGG11, ResNet-18 (CIFAR style) and DomainBed's
MNIST CNN (FedBR's authors' featurizer).

Each returns features of shape (B, feature_dim); the head is added by :func:`models.build_model`.
No BatchNorm in the small nets (client batch statistics are a known non-IID confounder); ResNet-18 uses
GroupNorm for the same reason.
"""

from __future__ import annotations

import torch
from torch import nn


class Flatten(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


def logistic(in_shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    dim = int(torch.tensor(in_shape).prod())
    return Flatten(), dim


def mlp(in_shape: tuple[int, ...], hidden: int = 200) -> tuple[nn.Module, int]:
    dim = int(torch.tensor(in_shape).prod())
    return nn.Sequential(Flatten(), nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()), hidden


def convnet(in_shape: tuple[int, ...], embed: int = 64) -> tuple[nn.Module, int]:
    """Two 5x5 conv layers with max-pooling and a 64-d embedding (FedRANE's (E/F)MNIST ConvNet)."""
    c, h, w = in_shape
    body = nn.Sequential(
        nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        Flatten(),
    )
    with torch.no_grad():
        flat = body(torch.zeros(1, c, h, w)).shape[1]
    return nn.Sequential(body, nn.Linear(flat, embed), nn.ReLU()), embed


def domainbed_cnn(in_shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    """DomainBed's MNIST CNN, FedBR's RotatedMNIST featurizer (authors' code LINs-lab/FedBR, fedbr/networks.py
    MNIST_CNN): four 3x3 convolutions of 64, 128 (stride 2), 128, 128 channels, each followed by ReLU then
    GroupNorm(8), global average pooling: 128-d features."""
    c = in_shape[0]
    layers: list[nn.Module] = []
    for cin, cout, stride in ((c, 64, 1), (64, 128, 2), (128, 128, 1), (128, 128, 1)):
        layers += [nn.Conv2d(cin, cout, 3, stride, padding=1), nn.ReLU(), nn.GroupNorm(8, cout)]
    layers += [nn.AdaptiveAvgPool2d(1), Flatten()]
    return nn.Sequential(*layers), 128


_VGG11: list[int | str] = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]


def vgg11(in_shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    c, h, w = in_shape
    layers: list[nn.Module] = []
    ch = c
    size = min(h, w)
    for v in _VGG11:
        if v == "M":
            if size >= 2:
                layers.append(nn.MaxPool2d(2))
                size //= 2
        else:
            layers += [nn.Conv2d(ch, int(v), 3, padding=1), nn.ReLU(inplace=True)]
            ch = int(v)
    layers += [nn.AdaptiveAvgPool2d(1), Flatten(), nn.Linear(512, 512), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers), 512


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = nn.GroupNorm(2, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = nn.GroupNorm(2, cout)
        self.short: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(2, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.n1(self.c1(x)))
        return torch.relu(self.n2(self.c2(out)) + self.short(x))


def resnet18(in_shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    c = in_shape[0]
    layers: list[nn.Module] = [nn.Conv2d(c, 64, 3, 1, 1, bias=False), nn.GroupNorm(2, 64), nn.ReLU()]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), Flatten()]
    return nn.Sequential(*layers), 512


BACKBONES = {"logistic": logistic, "mlp": mlp, "convnet": convnet, "vgg11": vgg11, "resnet18": resnet18,
             "domainbed-cnn": domainbed_cnn}
