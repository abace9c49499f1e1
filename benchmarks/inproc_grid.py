"""The in-process Grid, kept under its old name for the benchmarks and tests that import it from here.

The engine itself lives in :mod:`engines` (``engines.grid.InProcessGrid``: sequential;
``engines.pool.PoolGrid``: worker processes; ``engines.run_local``: the real ServerApp on either).
"""

from engines.grid import InProcessGrid

__all__ = ["InProcessGrid"]
