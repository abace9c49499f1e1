"""What the tests of ``scripts/run_local.sh`` check after it returned (tests/test_cli_runs.py, tests/test_reliability_ray.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path


def superlink_gone(text: str) -> bool:
    """The SuperLink run_local.sh reported in ``text`` (``SuperLink pid N``) and its process group no longer
    exist."""
    m = re.search(r"run_local.sh: SuperLink pid (\d+)", text)
    assert m, text[-2000:]
    try:
        os.killpg(int(m.group(1)), 0)
    except ProcessLookupError:
        return not Path(f"/proc/{m.group(1)}").exists()
    return False
