"""Reuse of the ClientApp's model objects between messages, with results bit-identical to building anew.

Every train/evaluate message needs the run's model loaded with the received weights. Building it
(``models.build_model``: seeded construction + initialisation, whose ``torch.manual_seed`` also queues
seeding for CUDA) costs about 2 ms on CPU (digits MLP, measured here): as much as a small client's whole
local round. A single-box engine that sends thousands of messages to one process pays that every time.
The pool keeps built models per (run config, input shape, classes, device) and hands one out again in its
freshly built condition apart from its weights, which the caller then overwrites with the received ones,
exactly as a new model's would be. It uses torch's public API only (issue round-pipeline):

- on build, the global torch RNG state right after ``build_model`` is recorded; on reuse it is restored
  (and CUDA re-seeded when CUDA exists), so what a trainer draws from the global RNG is unchanged;
- a model goes back to the pool only if its structure is the one built: the same module objects in
  ``modules()`` order, the same parameter and buffer objects with the same ``requires_grad``;
- on reuse it is put in training mode and its gradients are cleared (``train()``, ``zero_grad``), as built;
- :meth:`ModelPool.load` copies received weights into the tensors of ``state_dict(keep_vars=True)`` with the
  checks of ``load_state_dict(strict=True)`` (same names, same shapes; the same ``copy_``): what
  ``load_state_dict`` does for a model without its own loading hooks, which no model in ``models/`` has.

**The trainer's part of the contract** (docs/ADDING_A_METHOD.md): a trainer leaves the model as it found it
apart from tensor values and training mode: hooks it registers are removed, attributes it sets are restored,
and it keeps no reference to the model or its parts after its message. The pool does not look into torch's
private module state (hook dicts, version counters, reference counts) to prove that: the known-output jobs,
every method with the pool on, are bit-identical to their records, which a trainer breaking the contract
would change. ``POOL.enabled = False`` turns reuse off.

Keys are the whole run config (any key may shape the model), so every run of a sweep in one process brings
a new key: the pool keeps the ``max_keys`` most recently used ones and forgets the least recently used
(its free models go).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import nn


class _Instance:
    """A pooled model with what its structure was when built and its state-dict slots."""

    __slots__ = ("model", "modules", "params", "flags", "buffers", "slots")

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.modules = tuple(model.modules())
        self.params = tuple(model.parameters())
        self.flags = tuple(p.requires_grad for p in self.params)
        self.buffers = tuple(model.buffers())
        self.slots = list(model.state_dict(keep_vars=True).items())

    def unchanged(self) -> bool:
        """The same module, parameter and buffer objects as built, with the same ``requires_grad``."""
        return (_same(self.model.modules(), self.modules) and _same(self.model.parameters(), self.params)
                and _same(self.model.buffers(), self.buffers)
                and all(p.requires_grad == f for p, f in zip(self.params, self.flags)))

    def reset(self) -> None:
        self.model.train()
        self.model.zero_grad(set_to_none=True)


def _same(now: Any, built: tuple[Any, ...]) -> bool:
    """Whether the iterator ``now`` yields exactly the objects ``built`` (identity, same count)."""
    items = tuple(now)
    return len(items) == len(built) and all(a is b for a, b in zip(items, built))


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
        if inst is None or len(params) != len(inst.slots) or any(
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
        """Offer a model whose message is done; True if it will be reused. The caller must not use it
        afterwards (nor keep a reference to it: the trainer's contract in the module docstring)."""
        handed = self._out.pop(id(model), None)
        if handed is None or handed[1].model is not model:
            return False
        key, inst, owner = handed
        entry = self._entries.get(key)
        if entry is None or entry is not owner or len(entry.free) >= self.per_key or not inst.unchanged():
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
