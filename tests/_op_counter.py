"""Counting the tensor operations and host synchronisations of a piece of code, for the tests that check a
local step reads nothing back to the host (tests/test_fedrane.py). On a GPU every such read stalls the host until
the device's queue drains, so the launches of the next step cannot overlap the kernels of this one; a CPU run
counts the same reads. From the one-off study benchmarks/bench_lra_ops.py (commit 2c59ac46,
benchmarks/results/STUDIES.md), which counted FedRANE's operations with it."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# operations whose result the host reads (a Python number, or a shape that depends on the data): on a GPU each
# one waits until every kernel queued before it has run
SYNC_OPS = frozenset({"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten._unique2",
                      "aten.unique_dim", "aten.unique_consecutive", "aten.equal", "aten.allclose"})
INDEX_OPS = frozenset({"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"})
# Tensor methods that copy to host memory: no-ops on a CPU tensor (nothing is dispatched), a device-to-host copy
# that waits for the queue on a GPU, so their calls are counted too
HOST_COPIES = ("cpu", "numpy", "tolist")


def is_sync(func, args: tuple) -> bool:  # noqa: ANN001 - an OpOverload
    """Whether dispatching ``func`` on ``args`` makes the host wait for the device: a scalar read, an output
    shape that depends on the values, or indexing with a boolean mask (a hidden nonzero)."""
    name = str(func.overloadpacket)
    if name in SYNC_OPS:
        return True
    if name in INDEX_OPS:
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
    return False


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations dispatched while active (views and in-place updates included), and among
    them the host synchronisations (:func:`is_sync`) plus the calls of :data:`HOST_COPIES`.

    What a CPU run cannot see: a blocking host-to-device copy (``.to('cuda')`` of a CPU tensor without
    ``non_blocking``), which is no operation at all when everything is on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.syncs = 0
        self._saved: dict[str, Any] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        self.count += 1
        self.syncs += is_sync(func, args)
        return func(*args, **(kwargs or {}))

    def _counting(self, name: str) -> Any:
        original = self._saved[name]

        def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.syncs += 1
            return original(tensor, *args, **kwargs)
        return method

    def __enter__(self) -> "OpCounter":
        for name in HOST_COPIES:
            self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counting(name))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for name, original in self._saved.items():
                setattr(torch.Tensor, name, original)
            self._saved.clear()
