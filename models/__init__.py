"""Model factory: ``build_model(cfg, in_shape, num_classes)`` -> :class:`FLModel`."""

from __future__ import annotations

import torch

from flcore.config import RunConfig
from flcore.registry import get_method, resolve
from models.base import FLModel
from models.heads import ETFHead, LinearHead
from models.networks import BACKBONES

# What "model = auto" picks for each dataset.
AUTO_MODEL = {
    "synthetic": "logistic", "digits": "mlp", "mnist-5k": "convnet", "mnist": "convnet",
    "fmnist": "convnet", "emnist-letters": "convnet", "rotated-mnist": "convnet",
    "cifar10": "vgg11", "cifar100": "resnet18",
}

__all__ = ["FLModel", "build_model", "model_name"]


def model_name(cfg: RunConfig) -> str:
    if cfg.model == "auto" and cfg.dataset.startswith("hf:"):  # any Hugging Face image dataset (issue 33)
        return "convnet"
    return AUTO_MODEL[cfg.dataset] if cfg.model == "auto" else cfg.model


def head_name(cfg: RunConfig) -> str:
    return get_method(cfg.method).head or cfg.head


def build_model(cfg: RunConfig, in_shape: tuple[int, ...], num_classes: int) -> FLModel:
    """Seeded construction: the same config gives the same initial weights on server and clients."""
    torch.manual_seed(cfg.seed)
    name = model_name(cfg)
    backbone, dim = BACKBONES[name](tuple(in_shape))
    if head_name(cfg) == "etf":
        head: torch.nn.Module = ETFHead(dim, num_classes, seed=cfg.seed, scale=cfg.etf_scale)
    else:
        head = LinearHead(dim, num_classes)
    model = FLModel(backbone, head, dim, num_classes)
    # what the backbone was built from, for a model hook that rebuilds the extractor (FedRANE's flat-features)
    model.input_shape, model.backbone_name = tuple(in_shape), name
    hook = get_method(cfg.method).model_hook
    if hook:
        resolve(hook)(model, cfg)
    return model
