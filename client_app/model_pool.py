"""Reuse of the ClientApp's model objects between messages, with results bit-identical to building anew.

Every train/evaluate message needs the run's model loaded with the received weights. Building it
(``models.build_model``: seeded construction + initialisation, whose ``torch.manual_seed`` also queues
seeding for CUDA with a captured stack trace) costs 0.3-1.5 ms on CPU: as much as a small client's whole
local round (digits MLP). A single-box engine that sends thousands of messages to one process pays
that every time. The pool keeps built models per (run config, input shape, classes, device) and hands
one out again when it is provably in its freshly built condition apart from its weights, which are then
overwritten by the received ones, exactly as a new model's would be:

- on build, the global torch RNG state right after ``build_model`` is recorded; on reuse it is restored
  (and CUDA re-seeded when CUDA exists), so what a trainer draws from the global RNG is unchanged;
- a model goes back to the pool only if nothing outside the ClientApp handler still references it or any
  of its submodules and parameters (reference counts equal those of a new model), and its structure is
  unchanged: module types, parameter and buffer names / shapes / dtypes / devices / requires_grad, hooks,
  plain attributes (tensors by identity and version counter). Otherwise it is dropped and the next
  message builds a new one;
- on reuse: gradients cleared (a new model has none), training mode on, weights loaded strictly.

Anything the check cannot prove (a trainer that keeps the model, changes a flag, registers a hook)
simply costs a rebuild. ``POOL.enabled = False`` turns reuse off.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

import torch
from torch import nn

_MODULE_INTERNALS = {"training", "_parameters", "_buffers", "_non_persistent_buffers_set", "_modules",
                     "_backward_pre_hooks", "_backward_hooks", "_is_full_backward_hook", "_forward_hooks",
                     "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
                     "_forward_pre_hooks_with_kwargs", "_state_dict_hooks", "_state_dict_pre_hooks",
                     "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"}
_HOOK_DICTS = ("_backward_pre_hooks", "_backward_hooks", "_forward_hooks", "_forward_pre_hooks",
               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks")
_ATOMS = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device)


def _attr_signature(value: Any) -> Any:
    if isinstance(value, _ATOMS):
        return value
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), value._version)
    if isinstance(value, tuple) and all(isinstance(v, _ATOMS) for v in value):
        return value
    return ("object", id(value), type(value).__name__)


def structure(model: nn.Module) -> tuple:
    """What must be unchanged for a used model to count as new once its weights are reloaded."""
    out = []
    for name, mod in model.named_modules():
        d = mod.__dict__
        params = tuple((n, tuple(p.shape), p.dtype, p.device, p.requires_grad, type(p))
                       for n, p in d["_parameters"].items() if p is not None)
        buffers = tuple((n, tuple(b.shape), b.dtype, b.device, n in d["_non_persistent_buffers_set"])
                        for n, b in d["_buffers"].items() if b is not None)
        hooks = tuple(len(d.get(h, ())) for h in _HOOK_DICTS)
        attrs = tuple(sorted((k, _attr_signature(v)) for k, v in d.items() if k not in _MODULE_INTERNALS))
        out.append((name, type(mod), params, buffers, hooks, attrs))
    return tuple(out)


def refcounts(model: nn.Module) -> tuple[int, ...]:
    """Reference counts of the model's submodules (not the model itself), parameters and buffers
    (compared with those of the freshly built model, never interpreted)."""
    objs = [*list(model.modules())[1:], *model.parameters(), *model.buffers()]
    return tuple(sys.getrefcount(o) for o in objs)


class _Entry:
    __slots__ = ("rng", "structure", "refs", "free")

    def __init__(self, rng: torch.Tensor, struct: tuple, refs: tuple[int, ...]) -> None:
        self.rng, self.structure, self.refs = rng, struct, refs
        self.free: list[nn.Module] = []


class ModelPool:
    """Models by key; see the module docstring. Not thread-safe (a ClientApp process handles one message
    at a time)."""

    def __init__(self, max_keys: int = 8, per_key: int = 2) -> None:
        self.enabled = True
        self.max_keys, self.per_key = max_keys, per_key
        self._entries: dict[Any, _Entry] = {}
        self._key_of: "weakref.WeakKeyDictionary[nn.Module, Any]" = weakref.WeakKeyDictionary()  # handed out
        self.builds = 0
        self.reuses = 0

    def get(self, key: Any, build: Callable[[], nn.Module], seed: int) -> nn.Module:
        """A model in its freshly built condition (weights as built or as last used: load yours)."""
        entry = self._entries.get(key) if self.enabled else None
        if entry is not None and entry.free:
            model = entry.free.pop()
            torch.set_rng_state(entry.rng)
            if torch.cuda.is_available():
                torch.cuda.manual_seed_all(seed)
            for p in model.parameters():
                p.grad = None
            model.train()
            self.reuses += 1
        else:
            model = build()
            self.builds += 1
            if self.enabled and (entry is not None or len(self._entries) < self.max_keys):
                if entry is None:
                    entry = self._entries[key] = _Entry(torch.get_rng_state(), structure(model), refcounts(model))
        if self.enabled and entry is not None:
            self._key_of[model] = key
        return model

    def give_back(self, model: nn.Module) -> bool:
        """Offer a model whose message is done; True if it will be reused. The caller must hold no other
        reference to it (pass its last one) and must not use it afterwards."""
        key = self._key_of.pop(model, None)
        entry = self._entries.get(key) if key is not None else None
        if entry is None or len(entry.free) >= self.per_key:
            return False
        # the caller's variable + this argument + getrefcount's argument
        if sys.getrefcount(model) > 3 or refcounts(model) != entry.refs:
            return False
        if structure(model) != entry.structure:
            return False
        entry.free.append(model)
        return True


POOL = ModelPool()
