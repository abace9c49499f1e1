"""Method declarations, one module per method family: its config section (typed fields with default,
bounds and a doc citing the paper), the payload keys its two sides exchange, its model hook and head, and
the names of its Strategy and trainer. ``MODULES`` is the registry's list (flcore/registry.py)."""

from __future__ import annotations

import importlib

MODULES = ("fedavg", "fedprox", "scaffold", "moon", "feddyn", "qfedavg", "fednova", "fedopt",
           "fedrane", "fedbc", "fedufo", "fedbr", "fedetf", "spherefed", "feddecorr")


def declarations() -> list:
    """Every MethodDecl of every module in MODULES, in order."""
    out = []
    for name in MODULES:
        out.extend(importlib.import_module(f"flcore.methods.{name}").METHODS)
    return out
