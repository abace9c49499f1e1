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

from flcore.declaration import BASE_TRAINER, FEDAVG_STRATEGY, MethodDecl, Payload
from flcore.schema import Section

__all__ = ["BASE_TRAINER", "FEDAVG_STRATEGY", "MethodDecl", "Payload", "get_method", "methods", "register",
           "resolve", "sections", "unregister"]

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
