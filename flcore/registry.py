"""One registry: method name -> (server strategy, client trainer, model customisation).

Entries are ``"module:attribute"`` strings resolved lazily, so the client never imports server code and
importing the registry is cheap. A new method is one strategy module + one trainer module + an entry here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MethodSpec:
    """How a method is assembled.

    strategy:   server-side ``FLStrategy`` subclass.
    trainer:    client-side ``Trainer`` subclass (carries the local-training tricks).
    model_hook: optional ``fn(model: FLModel, cfg: RunConfig) -> None`` that adds the method's federated
                modules (LRA neck, projection head, discriminator) to the model, run identically on the
                server (initial model, central evaluation) and on every client.
    head:       head forced by the method (``"etf"`` for fedetf), else the run config's ``head``.
    """

    strategy: str
    trainer: str
    model_hook: str | None = None
    head: str | None = None
    description: str = ""


_BASE_TRAINER = "client_app.trainers.base:Trainer"
_FEDAVG = "strategies.fedavg:FedAvgStrategy"

METHODS: dict[str, MethodSpec] = {
    "fedavg": MethodSpec(_FEDAVG, _BASE_TRAINER, description="McMahan et al. 2017"),
    "fedprox": MethodSpec("strategies.fedprox:FedProxStrategy", "client_app.trainers.fedprox:FedProxTrainer"),
    "scaffold": MethodSpec("strategies.scaffold:ScaffoldStrategy", "client_app.trainers.scaffold:ScaffoldTrainer"),
    "moon": MethodSpec(_FEDAVG, "client_app.trainers.moon:MoonTrainer", model_hook="client_app.trainers.moon:add_projection_head"),
    "feddyn": MethodSpec("strategies.feddyn:FedDynStrategy", "client_app.trainers.feddyn:FedDynTrainer"),
    "qfedavg": MethodSpec("strategies.qfedavg:QFedAvgStrategy", "client_app.trainers.qfedavg:QFedAvgTrainer"),
    "fednova": MethodSpec("strategies.fednova:FedNovaStrategy", _BASE_TRAINER),
    "fedadam": MethodSpec("strategies.fedopt:FedAdamStrategy", _BASE_TRAINER),
    "fedyogi": MethodSpec("strategies.fedopt:FedYogiStrategy", _BASE_TRAINER),
    "fedrane": MethodSpec("strategies.fedrane:GNEStrategy", "client_app.trainers.fedrane:LRATrainer", model_hook="models.lra:add_lra_neck"),
    "fedrane-no-lra": MethodSpec("strategies.fedrane:GNEStrategy", _BASE_TRAINER),
    "fedrane-no-gne": MethodSpec(_FEDAVG, "client_app.trainers.fedrane:LRATrainer", model_hook="models.lra:add_lra_neck"),
    "fedbc": MethodSpec("strategies.fedbc:FedBCStrategy", "client_app.trainers.fedbc:FedBCTrainer"),
    "fedbc-finetune": MethodSpec("strategies.fedbc:FedBCStrategy", "client_app.trainers.fedbc:FedBCFineTuneTrainer"),
    "per-fedbc": MethodSpec("strategies.fedbc:FedBCStrategy", "client_app.trainers.fedbc:PerFedBCTrainer"),
    "fedufo": MethodSpec("strategies.fedufo:FedUFOStrategy", "client_app.trainers.fedufo:FedUFOTrainer", model_hook="client_app.trainers.fedufo:add_discriminator"),
    "fedbr": MethodSpec("strategies.fedbr:FedBRStrategy", "client_app.trainers.fedbr:FedBRTrainer", model_hook="client_app.trainers.fedbr:add_projection_head"),
    "fedetf": MethodSpec("strategies.fedetf:FedETFStrategy", "client_app.trainers.fedetf:ETFTrainer", head="etf"),
    "fedgmv": MethodSpec("strategies.fedetf:FedETFStrategy", "client_app.trainers.fedetf:ETFTrainer",
                         description="seed 004 ablation '+GMV': memory vectors with the run config's head"),
}


def resolve(path: str) -> Any:
    """Import ``"module:attr"``."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def get_method(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method '{name}'; allowed: {', '.join(METHODS)}") from None
