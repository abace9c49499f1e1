"""A run's output directory: ``runs/latest`` and ``--overwrite``.

* The out-dir itself is resolved once, when the run config is parsed (``RunConfig.with_out_dir``,
  flcore/run_dir.py: ``""`` means ``runs/<method>-<YYYYmmdd-HHMMSS>``, or the resumed run's directory).
* ``runs/latest`` is a symbolic link to the newest run started in ``runs/`` (relative, so the tree can move).
* An existing non-empty out-dir is refused (server_app/preflight.py) unless ``overwrite = true``
  (``noniid-fl run --overwrite``) or the run resumes from it; overwriting removes only the files a run writes
  (:data:`RUN_FILES`), never anything else in the directory. ``run.log`` does not count: ``noniid-fl run``
  starts it in the out-dir just before the engine (whose ServerApp checks the out-dir again).

No torch or Flower import here: the command line uses this before any engine starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from flcore.run_dir import RUNS_DIR, default_out_dir, resume_dir

__all__ = ["RUNS_DIR", "LATEST", "RUN_FILES", "RUN_LOG", "default_out_dir", "resume_dir", "is_nonempty_dir",
           "clear_run_files", "link_latest", "prepare_out_dir"]

LATEST = "latest"
RUN_FILES = ("results.json", "results.tmp", "metrics.csv", "accuracy.png", "final_model.pt", "checkpoint.pt",
             "checkpoint.tmp")
RUN_LOG = "run.log"  # written by `noniid-fl run` (which truncates it at the start of each run)


def is_nonempty_dir(path: Path) -> bool:
    """Whether ``path`` is a directory holding anything besides the command line's own run.log."""
    return path.is_dir() and any(p.name != RUN_LOG for p in path.iterdir())


def clear_run_files(out_dir: Path) -> list[Path]:
    """Remove the files an earlier run wrote to ``out_dir`` (``--overwrite``); returns what was removed."""
    removed = []
    for name in RUN_FILES:
        f = out_dir / name
        if f.is_file() or f.is_symlink():
            f.unlink()
            removed.append(f)
    return removed


def link_latest(out_dir: Path) -> Path | None:
    """Point ``<parent>/latest`` at ``out_dir`` when the run lives in a ``runs/`` directory.

    Returns the link, or None when out-dir is elsewhere. A real file or directory named ``latest`` (the
    out-dir of older versions) is left alone, with a printed note saying so."""
    out_dir = Path(out_dir).absolute()
    if out_dir.parent.name != RUNS_DIR or out_dir.name == LATEST:
        return None
    link = out_dir.parent / LATEST
    if link.exists() and not link.is_symlink():
        print(f"note: {link} is a directory from an older version (out-dir's old default), not a link; "
              f"left as it is (rename it to get runs/latest -> {out_dir.name})", flush=True)
        return None
    tmp = out_dir.parent / f".{LATEST}.{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(out_dir.name)
    tmp.replace(link)  # atomic: a reader never sees a missing runs/latest
    return link


def prepare_out_dir(out_dir: str | Path, overwrite: bool, resume_from: str = "") -> Path:
    """Create ``out_dir`` (after the pre-flight checks), clear an earlier run's files when ``overwrite`` (not
    when the run resumes from this very directory), and point ``runs/latest`` at it."""
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    if overwrite and not (resume_from and resume_dir(resume_from).absolute() == path.absolute()):
        clear_run_files(path)
    link_latest(path)
    return path
