"""Method declarations, one module per method family: its config section (typed fields with default,
bounds and a doc citing the paper), the payload keys its two sides exchange, its model hook and head, and
the names of its Strategy and trainer. ``MODULES`` is the registry's list (flcore/registry.py): every module of
this package, discovered (a new family is a new file here, no list to edit), by name."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path


def _discover() -> tuple[str, ...]:
    return tuple(sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])
                        if not m.name.startswith("_")))


MODULES = _discover()


def declarations() -> list:
    """Every MethodDecl of every module in MODULES, in order; a module without ``METHODS`` is an error naming it."""
    out = []
    for name in MODULES:
        module = importlib.import_module(f"flcore.methods.{name}")
        if not hasattr(module, "METHODS"):
            raise ImportError(f"flcore/methods/{name}.py declares no METHODS list: every module of flcore.methods is "
                              "a method family (docs/ADDING_A_METHOD.md)")
        out.extend(module.METHODS)
    return out
