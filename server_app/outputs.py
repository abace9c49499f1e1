"""Where a run's outputs go: the default out-dir, ``runs/latest`` and ``--overwrite``.

* ``out-dir = ""`` (the default) means ``runs/<method>-<YYYYmmdd-HHMMSS>`` under the working directory (the
  SuperLink's for ``flwr run``), a fresh directory per run; a resumed run (``resume-from``) with no out-dir
  continues in the directory it resumes.
* ``runs/latest`` is a symbolic link to the newest run started in ``runs/`` (relative, so the tree can move).
* An existing non-empty out-dir is refused (server_app/preflight.py) unless ``overwrite = true``
  (``noniid-fl run --overwrite``) or the run resumes from it; overwriting removes only the files a run writes
  (:data:`RUN_FILES`), never anything else in the directory. ``run.log`` does not count: ``noniid-fl run``
  starts it in the out-dir just before the engine (whose ServerApp checks the out-dir again).

No torch or Flower import here: the command line uses this before any engine starts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

RUNS_DIR = "runs"
LATEST = "latest"
RUN_FILES = ("results.json", "results.tmp", "metrics.csv", "accuracy.png", "final_model.pt", "checkpoint.pt",
             "checkpoint.tmp")
RUN_LOG = "run.log"  # written by `noniid-fl run` (which truncates it at the start of each run)


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


def resolve_out_dir(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with ``out-dir`` filled in when it is "" (see the module docstring), made absolute."""
    out = dict(values)
    given, resume = out.get("out-dir", ""), out.get("resume-from", "")
    if not isinstance(given, str) or not isinstance(resume, str):
        return out  # the declared type check refuses it, naming the key
    if given:
        path = Path(given).expanduser()
    elif resume:
        path = resume_dir(resume)
    else:
        path = default_out_dir(str(out.get("method", "run")))
    out["out-dir"] = str(path.absolute())
    return out


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
