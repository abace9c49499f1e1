"""A running sum that stays on the device of the values it adds, read once: no host synchronisation per step.

Each value is added to a float64 scalar tensor, which is the same IEEE double addition as summing
``float(value)`` in Python (a float32 value converts to double exactly), so the sums read at the end are the
same bits as the per-step reads they replace (the local loop's loss, FedRANE's L_CD / mixup means and graph
densities).
"""

from __future__ import annotations

import torch


class DeviceSum:
    """sum and count of the scalar tensors added since creation; :meth:`value` / :meth:`mean` read it once."""

    __slots__ = ("total", "count")

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.count = 0

    @torch.no_grad()
    def add(self, value: torch.Tensor) -> None:
        if self.total is None:
            self.total = torch.zeros((), dtype=torch.float64, device=value.device)
        self.total.add_(value)
        self.count += 1

    def value(self) -> float:
        """The sum (0.0 before any value): one host read."""
        return float(self.total) if self.total is not None else 0.0

    def mean(self) -> float:
        """sum / count (0.0 before any value)."""
        return self.value() / self.count if self.count else 0.0
