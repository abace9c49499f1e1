"""Where a run's outputs go, worked out once: ``out-dir = ""`` (the default) means
``runs/<method>-<YYYYmmdd-HHMMSS>`` under the working directory (the SuperLink's for ``flwr run``), a fresh
directory per run; a resumed run (``resume-from``) with no out-dir continues in the directory it resumes; a given
out-dir is made absolute. :meth:`flcore.config.RunConfig.with_out_dir` is the one caller: every entry point asks it
and passes the resolved config on (server_app/outputs.py creates the directory, links ``runs/latest`` and clears an
overwritten run's files). Pure paths: nothing here creates anything.
"""

from __future__ import annotations

import time
from pathlib import Path

RUNS_DIR = "runs"


def default_out_dir(method: str, root: Path | None = None, now: float | None = None) -> Path:
    """``<root>/runs/<method>-<timestamp>``, with ``-2``, ``-3``, ... if that name is taken."""
    base = (root or Path.cwd()) / RUNS_DIR
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    path = base / f"{method}-{stamp}"
    n = 2
    while path.exists() or path.is_symlink():
        path = base / f"{method}-{stamp}-{n}"
        n += 1
    return path


def resume_dir(resume_from: str) -> Path:
    """The run directory of ``resume-from`` (a directory, or a checkpoint file inside one)."""
    path = Path(resume_from).expanduser()
    return path.parent if path.suffix == ".pt" else path


def resolve_out_dir(out_dir: str, resume_from: str, method: str) -> Path:
    """The absolute out-dir of a run (see the module docstring); a resolved one comes back unchanged."""
    if out_dir:
        path = Path(out_dir).expanduser()
    elif resume_from:
        path = resume_dir(resume_from)
    else:
        path = default_out_dir(method)
    return path.absolute()
