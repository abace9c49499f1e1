"""TensorBoard event files of a run (issue 33 item 2): run-config key ``tensorboard = true``.

Every per-round number of results.json's round row is written as a scalar at step = round, under
``<out-dir>/tensorboard/`` (``tensorboard --logdir runs`` shows every run): the row's numeric keys and the
method's ``strategy`` statistics, grouped by :func:`tag_of` (``G-FL/global_accuracy``, ``P-FL/local_accuracy``,
``fairness/client_accuracy_worst``, ``cost/bytes_sent``, ``strategy/gne-weight-ratio``, ...). Values are written
in double precision (TensorBoard's new-style tensor scalars), so they read back equal to results.json; booleans
as 0/1; strings, lists and maps (per-client values, the failures) and missing values (None) are not scalars and
are left out. A resumed run's writer discards the events of the rounds it writes again (``purge_step``).

Optional: the ``tensorboard`` package is the extra ``pip install 'noniid-fl[tensorboard]'``;
:func:`check_available` refuses the key without it before the run starts (server_app/preflight.py).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flcore.config import ConfigError

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

SUBDIR = "tensorboard"
GROUPS = (("global_", "G-FL"), ("val_", "validation"), ("local_", "P-FL"), ("client_", "fairness"),
          ("min_data_client", "fairness"), ("max_data_client", "fairness"), ("wall_time", "cost"),
          ("bytes_", "cost"), ("num_", "counts"))


def check_available(enabled: bool) -> None:
    """ConfigError naming the key and the extra when ``tensorboard = true`` and the package is missing."""
    if enabled and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("run-config key 'tensorboard' = true writes TensorBoard event files, but the package "
                          "'tensorboard' is not installed: install the extra (pip install 'noniid-fl[tensorboard]') "
                          "or set tensorboard = false")


def tag_of(column: str) -> str:
    """The TensorBoard tag of a results.json round column: ``strategy.<key>`` -> ``strategy/<key>``, else
    ``<group>/<column>`` with the group of the column's prefix (GROUPS; ``other`` if none)."""
    if column.startswith("strategy."):
        return "strategy/" + column[len("strategy."):]
    group = next((g for prefix, g in GROUPS if column.startswith(prefix)), "other")
    return f"{group}/{column}"


def round_scalars(row: dict[str, Any]) -> dict[str, float]:
    """Tag -> value of every finite number (bool as 0/1) of a round row and its ``strategy`` dict, but the
    round itself (the step)."""
    items = [(k, v) for k, v in row.items() if k not in ("round", "strategy")]
    items += [(f"strategy.{k}", v) for k, v in (row.get("strategy") or {}).items()]
    out = {}
    for column, value in items:
        if isinstance(value, (bool, int, float)) and math.isfinite(float(value)):
            out[tag_of(column)] = float(value)
    return out


class TensorBoardLog:
    """Event files under ``out_dir/tensorboard``; opened at the first round written (a resumed run purges the
    events of that round and later ones left by the run it continues)."""

    def __init__(self, out_dir: Path) -> None:
        self.log_dir = Path(out_dir) / SUBDIR
        self._writer: SummaryWriter | None = None

    def add_round(self, row: dict[str, Any]) -> None:
        step = int(row["round"])
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.log_dir), purge_step=step)
        for tag, value in round_scalars(row).items():
            self._writer.add_scalar(tag, value, step, new_style=True, double_precision=True)
        self._writer.flush()  # a killed run leaves every round it finished

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def tensorboard_log(out_dir: Path, enabled: bool) -> TensorBoardLog | None:
    """The run's TensorBoard log when its run config asks for one (run-config key tensorboard; the package
    checked), else None."""
    check_available(enabled)
    return TensorBoardLog(out_dir) if enabled else None
