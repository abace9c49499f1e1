"""The software stack a number came from, and the project's lock (issue 30).

``requirements.lock`` (repository root) pins every distribution of ``pip install -e ".[test]"`` with its
sha256, resolved on Linux x86_64 / CPython 3.11 by ``python scripts/update_lock.py``. This module reads it,
compares it with what is installed, and describes the running stack for results.json and the benchmarks:

    python -m flcore.stack            # the running stack as JSON
    python -m flcore.stack --check    # exit 1 and list the differences when the installed stack is not the lock
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LOCK_FILE = ROOT / "requirements.lock"
# the versions every result names (the list; scipy and clarabel solve FedRANE's GNE step)
STACK_PACKAGES = ("flwr", "torch", "torchvision", "numpy", "scipy", "cvxpy", "clarabel", "ray", "scikit-learn")
# installed but never locked: the installer itself and this project (installed from the checkout)
NOT_LOCKED = frozenset({"pip", "noniid-fl"})


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Locked:
    name: str
    version: str
    hashes: tuple[str, ...]


def parse_lock(text: str) -> dict[str, Locked]:
    """``name==version --hash=sha256:...`` entries (backslash continuations, ``#`` comments) by normalized name."""
    out: dict[str, Locked] = {}
    joined = re.sub(r"\\\n", " ", text)
    for lineno, raw in enumerate(joined.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        if m is None:
            raise ValueError(f"requirements.lock: entry {lineno} is not 'name==version --hash=sha256:...': {line[:80]!r}")
        name = normalize(m.group(1))
        if name in out:
            raise ValueError(f"requirements.lock: {name} is pinned twice")
        out[name] = Locked(name, m.group(2), tuple(re.findall(r"sha256:([0-9a-f]{64})", m.group(3))))
    return out


def read_lock(path: Path | None = None) -> dict[str, Locked]:
    path = path or LOCK_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no lock file (run `python scripts/update_lock.py` to create it)")
    return parse_lock(path.read_text())


def lock_digest(locked: dict[str, Locked]) -> str:
    """SHA-256 of the pins alone (names and versions), independent of comments and hashes' order."""
    pins = "\n".join(f"{k}=={v.version}" for k, v in sorted(locked.items()))
    return hashlib.sha256(pins.encode()).hexdigest()[:16]


def installed_versions() -> dict[str, str]:
    """Every distribution importable here, by normalized name."""
    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(normalize(name), dist.version)
    return out


def lock_differences(locked: dict[str, Locked], installed: dict[str, str]) -> list[str]:
    """What keeps ``installed`` from being the lock, one line per package (empty: it is the lock)."""
    diffs = []
    for name, pin in sorted(locked.items()):
        have = installed.get(name)
        if have is None:
            diffs.append(f"{name}: locked {pin.version}, not installed")
        elif have != pin.version:
            diffs.append(f"{name}: locked {pin.version}, installed {have}")
    for name in sorted(set(installed) - set(locked) - NOT_LOCKED):
        diffs.append(f"{name}: installed {installed[name]}, not in the lock")
    return diffs


def git_state(root: Path = ROOT) -> dict[str, Any] | None:
    """The checkout's commit and whether tracked or unignored files differ from it (None outside a checkout,
    e.g. under `flwr run`, whose app is unpacked from a FAB)."""
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True,
                                timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())}


def _torch_facts() -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    cudnn = torch.backends.cudnn
    return {
        "torch_cuda": torch.version.cuda,
        "cudnn": cudnn.version() if cudnn.is_available() else None,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "cuda_available": cuda,
        "deterministic": {
            "torch_deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": bool(cudnn.deterministic),
            "cudnn_benchmark": bool(cudnn.benchmark),
            "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        },
    }


def pyproject_pins(path: Path | None = None) -> dict[str, Locked]:
    """The lock's pins as pyproject.toml carries them for uv (``[tool.uv] constraint-dependencies``, written by
    scripts/update_lock.py): what a FAB has, since Flower ships no .lock file in it. No hashes."""
    import tomllib

    path = path or ROOT / "pyproject.toml"
    pins = tomllib.loads(path.read_text()).get("tool", {}).get("uv", {}).get("constraint-dependencies", [])
    out = {}
    for pin in pins:
        name, _, version = pin.partition("==")
        out[normalize(name)] = Locked(normalize(name), version, ())
    if not out:
        raise ValueError(f"{path}: no [tool.uv] constraint-dependencies")
    return out


def _lock_state(installed: dict[str, str]) -> dict[str, Any]:
    """The installed stack against requirements.lock, or (in an unpacked FAB, which has no .lock file) against
    the same pins in pyproject.toml's [tool.uv] table; says which it read."""
    try:
        locked, source = read_lock(), LOCK_FILE.name
    except (FileNotFoundError, ValueError) as exc:
        try:
            locked, source = pyproject_pins(), "pyproject.toml [tool.uv]"
        except (OSError, ValueError) as exc2:
            return {"file": None, "matches": None, "why": f"{exc}; {exc2}"}
    diffs = lock_differences(locked, installed)
    return {"file": source, "digest": lock_digest(locked), "matches": not diffs, "differences": diffs[:20]}


@functools.lru_cache(maxsize=1)
def _static_stack() -> dict[str, Any]:
    installed = installed_versions()
    lock = _lock_state(installed)
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "packages": {name: installed.get(name) for name in STACK_PACKAGES},
        "lock": lock,
        "git": git_state(),
    }


def stack_info() -> dict[str, Any]:
    """The running stack: python, the STACK_PACKAGES versions, CUDA/cuDNN and device, the deterministic
    settings, the lock (matches or the differences) and the git commit (and whether the tree was dirty).
    Versions and commit are read once per process; torch's thread and determinism settings at each call."""
    return {**_static_stack(), **_torch_facts()}


def describe(stack: dict[str, Any] | None) -> str:
    """One line for a report: 'python 3.11.7, flwr 1.42.0, torch 2.14.1 (cpu), ..., lock, commit abc1234'."""
    if not stack:
        return "stack not recorded (result written before results named their stack)"
    pk = stack.get("packages") or {}
    parts = [f"python {stack.get('python')}"] + [f"{n} {pk[n]}" for n in STACK_PACKAGES if pk.get(n)]
    device = stack.get("device")
    if device:
        parts.append(f"device {device}" + (f" (CUDA {stack['torch_cuda']})" if stack.get("cuda_available") else ""))
    lock = stack.get("lock") or {}
    if lock.get("matches") is True:
        parts.append(f"the lock ({lock.get('digest')})")
    elif lock.get("matches") is False:
        parts.append(f"NOT the lock ({len(lock.get('differences') or [])}+ differences)")
    git = stack.get("git")
    if git:
        parts.append(f"commit {git['commit'][:10]}" + (" (dirty tree)" if git.get("dirty") else ""))
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--check"]:
        diffs = lock_differences(read_lock(), installed_versions())
        for line in diffs:
            print(line)
        print("installed stack == requirements.lock" if not diffs else f"{len(diffs)} difference(s) from requirements.lock")
        return 1 if diffs else 0
    if args:
        print("usage: python -m flcore.stack [--check]", file=sys.stderr)
        return 2
    print(json.dumps(stack_info(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
