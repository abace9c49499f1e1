"""Reuse of the ClientApp's model objects between messages, with results bit-identical to building anew.

Every train/evaluate message needs the run's model loaded with the received weights. Building it
(``models.build_model``: seeded construction + initialisation, whose ``torch.manual_seed`` also queues
seeding for CUDA with a captured stack trace) costs 0.3-1.5 ms on CPU: as much as a small client's whole
local round (digits MLP). A single-box engine that sends thousands of messages to one process pays
that every time. The pool keeps built models per (run config, input shape, classes, device) and hands
one out again only when it is provably in its freshly built condition apart from its weights, which the
caller then overwrites with the received ones, exactly as a new model's would be:

- on build, the global torch RNG state right after ``build_model`` is recorded; on reuse it is restored
  (and CUDA re-seeded when CUDA exists), so what a trainer draws from the global RNG is unchanged;
- a model goes back to the pool only if nothing outside the ClientApp handler still references it, its
  submodules or its tensors (reference counts equal those recorded when it was new), and nothing in it
  changed but tensor values: the same submodule objects, attribute names and plain attribute values,
  the same parameter / buffer objects with the same ``requires_grad``, no hook added or removed, and
  tensors held as plain attributes not modified in place (identity and version counter);
- on reuse every gradient is cleared and every module is put in training mode (as built);
- :meth:`ModelPool.load` copies received weights in with the checks of ``load_state_dict(strict=True)``
  (same names, same shapes; same ``copy_``), through ``load_state_dict`` itself whenever a module defines
  its own loading hooks.

What the check cannot prove (a trainer that keeps the model, flips a flag, registers a hook) simply costs
a rebuild. ``POOL.enabled = False`` turns reuse off.

Keys are the whole run config (any key may shape the model), so every run of a sweep in one process brings
a new key: the pool keeps the ``max_keys`` most recently used ones and forgets the least recently used
(its free models go). It used to stop taking new keys once full, which after eight runs in one process
rebuilt the model for every message from then on (measured on the digits job: 23.3 -> 31.7 ms CPU per
round from the ninth run).
"""

from __future__ import annotations

import operator
import sys
from collections import OrderedDict
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import nn

_INTERNALS = frozenset({"training", "_parameters", "_buffers", "_non_persistent_buffers_set", "_modules",
                        "_backward_pre_hooks", "_backward_hooks", "_is_full_backward_hook", "_forward_hooks",
                        "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
                        "_forward_pre_hooks_with_kwargs", "_state_dict_hooks", "_state_dict_pre_hooks",
                        "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"})
_HOOKS = ("_backward_pre_hooks", "_backward_hooks", "_forward_hooks", "_forward_pre_hooks", "_state_dict_hooks",
          "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks")


_HOOK_DICTS = operator.itemgetter(*_HOOKS)
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


class _ModuleSnapshot:
    """One module as it was when new (instance-specific: compared by identity, C-level where possible)."""

    __slots__ = ("keys", "get_attrs", "attrs", "tensors", "params", "buffers", "children", "nonpersistent", "hooks")

    def __init__(self, module: nn.Module) -> None:
        d = module.__dict__
        self.keys = frozenset(d)
        names = sorted(k for k in d if k not in _INTERNALS and not isinstance(d[k], torch.Tensor))
        self.get_attrs = operator.itemgetter(*names, *names[:1]) if names else None  # always a tuple
        self.attrs = self.get_attrs(d) if names else None
        self.tensors = tuple((k, d[k], d[k]._version) for k in sorted(d) if isinstance(d[k], torch.Tensor))
        self.params = dict(d["_parameters"])
        self.buffers = dict(d["_buffers"])
        self.children = dict(d["_modules"])
        self.nonpersistent = frozenset(d["_non_persistent_buffers_set"])
        self.hooks = tuple(map(len, _HOOK_DICTS(d)))

    def same(self, module: nn.Module) -> bool:
        d = module.__dict__
        try:  # dict / tuple equality compares identical objects without calling their __eq__
            if not (d.keys() == self.keys and d["_parameters"] == self.params and d["_buffers"] == self.buffers
                    and d["_modules"] == self.children and tuple(map(len, _HOOK_DICTS(d))) == self.hooks
                    and d["_non_persistent_buffers_set"] == self.nonpersistent):
                return False
            if self.get_attrs is not None and self.get_attrs(d) != self.attrs:
                return False
        except Exception:  # noqa: BLE001 - a different tensor/array compared elementwise: it was replaced
            return False
        return all(d[k] is t and t._version == v for k, t, v in self.tensors)


class _Instance:
    """A pooled model with its snapshot, its reference counts when new and its state-dict slots."""

    __slots__ = ("model", "modules", "snapshots", "owned", "refs", "params", "flags", "slots", "custom_load")

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.modules = list(model.modules())
        self.snapshots = [_ModuleSnapshot(m) for m in self.modules]
        self.params = [p for m in self.modules for p in m.__dict__["_parameters"].values() if p is not None]
        self.flags = list(map(_REQUIRES_GRAD, self.params))
        self.slots = list(model.state_dict(keep_vars=True).items())
        self.custom_load = any(m.__dict__.get("_load_state_dict_pre_hooks") or m.__dict__.get("_load_state_dict_post_hooks")
                               or type(m)._load_from_state_dict is not nn.Module._load_from_state_dict
                               for m in self.modules)
        buffers = [b for m in self.modules for b in m.__dict__["_buffers"].values() if b is not None]
        self.owned = [*self.modules[1:], *self.params, *buffers]  # what nobody else may hold on to
        self.refs = self.refcounts()

    def refcounts(self) -> list[int]:
        return list(map(sys.getrefcount, self.owned))

    def unchanged(self) -> bool:
        """Nothing but tensor values changed. Every module of the tree as built still has the same children
        (``_modules`` compared by identity in its snapshot), so the tree is the one built: no walk needed."""
        return (list(map(_REQUIRES_GRAD, self.params)) == self.flags
                and all(map(_ModuleSnapshot.same, self.snapshots, self.modules)))

    def reset(self) -> None:
        for m in self.modules:
            m.__dict__["training"] = True
        for p in self.params:
            p.grad = None


class _Entry:
    __slots__ = ("rng", "free")

    def __init__(self, rng: torch.Tensor) -> None:
        self.rng = rng
        self.free: list[_Instance] = []


class ModelPool:
    """Models by key; see the module docstring. Not thread-safe (a ClientApp process handles one message
    at a time)."""

    def __init__(self, max_keys: int = 8, per_key: int = 2, max_out: int = 8) -> None:
        self.enabled = True
        self.max_keys, self.per_key, self.max_out = max_keys, per_key, max_out
        self._entries: OrderedDict[Any, _Entry] = OrderedDict()  # least recently used first
        # id(model) -> (key, handed-out instance, the key's entry then: a forgotten key's models stay out)
        self._out: OrderedDict[int, tuple[Any, _Instance, _Entry]] = OrderedDict()
        self.builds = 0
        self.reuses = 0

    def get(self, key: Any, build: Callable[[], nn.Module], seed: int) -> nn.Module:
        """A model in its freshly built condition (weights as built or as last used: load yours)."""
        entry = self._entries.get(key) if self.enabled else None
        if entry is not None:
            self._entries.move_to_end(key)  # most recently used last; the first is forgotten when full
        if entry is not None and entry.free:
            inst = entry.free.pop()
            torch.set_rng_state(entry.rng)
            if torch.cuda.is_available():
                torch.cuda.manual_seed_all(seed)
            self.reuses += 1
        else:
            model = build()
            self.builds += 1
            if not self.enabled or self.max_keys < 1:
                return model
            if entry is None:
                while len(self._entries) >= self.max_keys:  # forget the least recently used key
                    self._entries.popitem(last=False)
                entry = self._entries[key] = _Entry(torch.get_rng_state())
            inst = _Instance(model)
        self._out[id(inst.model)] = (key, inst, entry)
        while len(self._out) > self.max_out:  # never given back (its message raised): forget the oldest
            self._out.popitem(last=False)
        return inst.model

    def load(self, model: nn.Module, params: Mapping[str, np.ndarray]) -> None:
        """``model.load_state_dict(params, strict=True)`` for numpy ``params`` (the same copies and checks)."""
        handed = self._out.get(id(model))
        inst = handed[1] if handed is not None and handed[1].model is model else None
        if inst is None or inst.custom_load or len(params) != len(inst.slots) or any(
                name != slot[0] or tuple(np.shape(v)) != tuple(slot[1].shape)
                for (name, v), slot in zip(params.items(), inst.slots)):
            model.load_state_dict({k: torch_array(v) for k, v in params.items()}, strict=True)
            return
        with torch.no_grad():
            for (_, value), (_, tensor) in zip(params.items(), inst.slots):
                a = np.asarray(value)
                if a.flags.writeable or not _copy_on_cpu(tensor, a):
                    tensor.copy_(torch_array(a))

    def state_items(self, model: nn.Module) -> list[tuple[str, torch.Tensor]]:
        """``model.state_dict(keep_vars=True).items()`` (kept for a pooled model: no module walk)."""
        handed = self._out.get(id(model))
        if handed is not None and handed[1].model is model:
            return handed[1].slots
        return list(model.state_dict(keep_vars=True).items())

    def give_back(self, model: nn.Module) -> bool:
        """Offer a model whose message is done; True if it will be reused. The caller must hold no other
        reference to it (pass its last one) and must not use it afterwards."""
        handed = self._out.pop(id(model), None)
        if handed is None or handed[1].model is not model:
            return False
        key, inst, owner = handed
        del handed
        entry = self._entries.get(key)
        if entry is None or entry is not owner or len(entry.free) >= self.per_key:
            return False
        # the caller's variable, this argument, getrefcount's argument, inst.model and inst.modules[0]:
        # anything more is a reference kept outside the handler
        if sys.getrefcount(model) > 5 or inst.refcounts() != inst.refs or not inst.unchanged():
            return False
        inst.reset()
        entry.free.append(inst)
        return True


def torch_array(value: Any) -> torch.Tensor:
    """A CPU tensor with ``value``'s values, sharing its memory when it is writable (torch does not take
    read-only arrays, e.g. views of a message's bytes: those are copied)."""
    a = np.asarray(value)
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def _copy_on_cpu(tensor: torch.Tensor, a: np.ndarray) -> bool:
    """``tensor.copy_(a)`` done by numpy where that is the same copy (a CPU tensor of ``a``'s dtype and
    shape): a read-only ``a`` needs no intermediate copy then. False where it does not apply."""
    if tensor.device.type != "cpu" or tensor.shape != a.shape:
        return False
    try:
        dst = tensor.detach().numpy()
    except (TypeError, RuntimeError):  # a dtype numpy has not (bfloat16, ...)
        return False
    if dst.dtype != a.dtype:
        return False
    np.copyto(dst, a)
    return True


POOL = ModelPool()
