"""The method registry: the list of method declarations (flcore/methods/*), plus any registered at runtime.

A declaration (:class:`MethodDecl`) is data: the method's name, paper, config section, the payload keys its
two sides exchange, its model hook and head, and the ``"module:attribute"`` paths of its server Strategy and
client trainer, resolved lazily so that neither side imports the other's code and importing the registry
is cheap (no torch). A new method is a declaration module listed in ``flcore.methods.MODULES``, or
``register(decl)`` from the user's own code (see docs/ADDING_A_METHOD.md).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from flcore.schema import Section


@dataclass(frozen=True)
class Payload:
    """What a method adds to the base protocol (docs/PROTOCOL.md), by name.

    config:        keys the server adds to a client's "config" ConfigRecord (per-client values).
    records:       extra records in server -> client messages (a name ending in "." is a prefix).
    metrics:       extra keys in the reply's "metrics" MetricRecord.
    reply_records: extra records in client -> server replies.
    actions:       message types the strategy sends besides "query" and "evaluate".
    state:         client-state entries the trainer keeps between rounds (context.state / state-dir).
    """

    config: tuple[str, ...] = ()
    records: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    reply_records: tuple[str, ...] = ()
    actions: tuple[str, ...] = ("train",)
    state: tuple[str, ...] = ()


@dataclass(frozen=True)
class MethodDecl:
    """How a method is assembled (see the module docstring).

    model_hook: ``"module:fn"`` with ``fn(model: FLModel, cfg: RunConfig) -> None`` adding the method's
                federated modules (LRA neck, projection head, discriminator); it lives in ``models/`` and runs
                identically on the server (initial model, central evaluation) and on every client.
    head:       head forced by the method ("etf" for fedetf), else the run config's ``head``.
    check_federation: ``fn(cfg, num_nodes) -> None`` raising ConfigError (naming the key) when the method cannot
                run with that many nodes (FedUFO: a discriminator output per client); called by the pre-flight
                checks wherever the number of nodes is known (server_app/preflight.py), before any engine starts.
                A plain function of the declaration module: it needs only the parsed config (no torch).
    """

    name: str
    paper: str
    strategy: str
    trainer: str
    config: type[Section] | None = None
    model_hook: str | None = None
    head: str | None = None
    payload: Payload = field(default_factory=Payload)
    description: str = ""
    check_federation: Callable[[Any, int], None] | None = None  # (RunConfig, nodes): config imports this module


BASE_TRAINER = "client_app.trainers.base:Trainer"
FEDAVG_STRATEGY = "strategies.methods.fedavg:FedAvgStrategy"

_RUNTIME: dict[str, MethodDecl] = {}


@functools.lru_cache(maxsize=1)
def _declared() -> dict[str, MethodDecl]:
    """The declarations of flcore.methods.MODULES, built once per process (the ClientApp looks a method up on
    every message)."""
    from flcore.methods import declarations

    return {d.name: d for d in declarations()}


def methods() -> dict[str, MethodDecl]:
    """Every method: the declared ones, then the ones registered at runtime."""
    return {**_declared(), **_RUNTIME}


def register(decl: MethodDecl) -> MethodDecl:
    """Add a method from outside the project (a name already taken is an error)."""
    if decl.name in methods():
        raise ValueError(f"method '{decl.name}' is already registered")
    _RUNTIME[decl.name] = decl
    return decl


def unregister(name: str) -> None:
    """Remove a method added with :func:`register` (tests)."""
    _RUNTIME.pop(name, None)


def sections() -> list[type[Section]]:
    """Every method config section, once each, in declaration order."""
    out: list[type[Section]] = []
    for decl in methods().values():
        if decl.config is not None and decl.config not in out:
            out.append(decl.config)
    return out


def resolve(path: str):
    """Import ``"module:attr"``."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def get_method(name: str) -> MethodDecl:
    table = methods()
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown method '{name}'; allowed: {', '.join(table)}") from None
