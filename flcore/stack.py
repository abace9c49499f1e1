"""The software stack a number came from, and the project's lock (issue 30).

``requirements.lock`` (repository root) pins every distribution of ``pip install -e ".[test]"`` with its
sha256, resolved on Linux x86_64 / CPython 3.11 by ``python scripts/update_lock.py``. This module reads it,
compares it with what is installed, and describes the running stack for results.json and the benchmarks:

    python -m flcore.stack            # the running stack as JSON
    python -m flcore.stack --check    # exit 1 and list the differences when the installed stack is not the lock
    python -m flcore.stack --find-commit DIGEST [--since REV] [--everywhere]   # the commits whose code has a run's code digest

The stack also names the code that ran (``code``: flcore/code_digest.py's content digest, which a copy of the tree
without its git history keeps) and, in a checkout, the commit, its tree and whether the code is the commit's.
"""

from __future__ import annotations

import argparse
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

from flcore.code_digest import CommitDigester, combine, content_hashes, find_commits, read_code

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


VENDORED = ("thirdparty_files",)  # Ray prepends ray/thirdparty_files (its own psutil, colorama) to sys.path on import


def installed_versions() -> dict[str, str]:
    """Every distribution installed here, by normalized name: those on sys.path, except the copies a package
    vendors in a directory it puts on sys.path itself (Ray's ``ray/thirdparty_files``, once ray is imported: they
    are part of ray's wheel, which the lock pins, not installed distributions)."""
    out: dict[str, str] = {}
    for dist in metadata.distributions():
        if any(v in Path(str(dist.locate_file(""))).parts for v in VENDORED):
            continue
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


def git_state(root: Path = ROOT, code: tuple[dict[str, bytes], bytes | None] | None = None) -> dict[str, Any] | None:
    """The checkout's commit, its tree and whether tracked or unignored files differ from it (None outside a
    checkout, e.g. under `flwr run`, whose app is unpacked from a FAB); given the code read from disk
    (flcore.code_digest.read_code), also whether that code differs from the commit's (``code_dirty``: e.g. a copy
    of one commit's tree next to another commit's .git)."""
    if not (root / ".git").exists():
        return None
    try:
        commit, tree = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD", "HEAD^{tree}"], capture_output=True,
                                      text=True, timeout=10, check=True).stdout.split()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True,
                                timeout=10, check=True).stdout
        out: dict[str, Any] = {"commit": commit, "tree": tree, "dirty": bool(status.strip())}
        if code is not None:
            out["code_dirty"] = not CommitDigester(root).same_code(commit, *code)
    except (OSError, subprocess.SubprocessError, RuntimeError, ValueError):
        return None
    return out


def code_state(code: tuple[dict[str, bytes], bytes | None]) -> dict[str, Any]:
    """``{"digest", "files"}`` of the code read from disk (flcore/code_digest.py defines both)."""
    hashes = content_hashes(*code)
    return {"digest": combine(hashes), "files": len(hashes)}


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


CPU_FIELDS = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
              "model name": "name"}
ISA_FLAG = re.compile(r"(avx|amx|fma|f16c)")


def cpu_facts(cpuinfo: str | None = None) -> dict[str, Any]:
    """The processor a number came from, beyond torch's kernel level: vendor, family / model / stepping, the
    name the machine reports, its vector and matrix instruction-set flags (avx*, amx*, fma, f16c) and a digest of
    all its flags. torch's ``cpu_capability`` alone does not tell machines apart whose results differ: FedRS's
    MLP on mnist-5k, recorded on one AVX512 VM, re-runs on another AVX512 VM with per-round accuracies up to 5.1
    points apart, at the recorded commit (docs/EXPERIMENTS.md). ``cpuinfo``: the text of /proc/cpuinfo (read on
    Linux when None); elsewhere only what :mod:`platform` says."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {"name": platform.processor() or None}
    first = cpuinfo.split("\n\n", 1)[0]   # the first processor's block (the others repeat it on these machines)
    fields = {}
    for line in first.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    flags = sorted(set(fields.get("flags", "").split()))
    out: dict[str, Any] = {name: fields.get(key) for key, name in CPU_FIELDS.items()}
    out["isa"] = [f for f in flags if ISA_FLAG.match(f)]
    out["flags_digest"] = hashlib.sha256(" ".join(flags).encode()).hexdigest()[:12] if flags else None
    return out


@functools.lru_cache(maxsize=1)
def _static_stack() -> dict[str, Any]:
    installed = installed_versions()
    lock = _lock_state(installed)
    # the code that runs, when it runs from a source tree (a checkout, a copy of one, an unpacked FAB); an installed
    # copy in site-packages has no pyproject.toml beside it, and every other top-level package there is not ours
    code = read_code(ROOT) if (ROOT / "pyproject.toml").is_file() else None
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_facts(),
        "packages": {name: installed.get(name) for name in STACK_PACKAGES},
        "lock": lock,
        "code": code_state(code) if code is not None else None,
        "git": git_state(ROOT, code),
    }


def stack_info() -> dict[str, Any]:
    """The running stack: python, the STACK_PACKAGES versions, CUDA/cuDNN and device, the deterministic
    settings, the lock (matches or the differences), the code's digest and the git commit (its tree, whether
    the tree was dirty and whether the code is the commit's). Versions, code and commit are read once per
    process; torch's thread and determinism settings at each call."""
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
    code = stack.get("code")
    if code:  # results written before the stack named its code have none
        parts.append(f"code {code['digest']}" + (" (not the commit's code)" if git and git.get("code_dirty") else ""))
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flcore.stack", description="The running stack as JSON.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 and list how the installed stack differs from "
                      "requirements.lock")
    mode.add_argument("--find-commit", metavar="DIGEST", help="print the commits of HEAD's history whose code has "
                      "this code digest (a results.json's stack.code.digest; a prefix of 4+ hex digits will do)")
    parser.add_argument("--since", metavar="REV", help="with --find-commit: walk the commits after REV and REV "
                        "itself (default: the last 300)")
    parser.add_argument("--everywhere", action="store_true", help="with --find-commit: walk every branch, tag and "
                        "the reflog, not only HEAD's history (a run made on a branch rebased before its merge)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    for flag in ("since", "everywhere"):
        if getattr(args, flag) and not args.find_commit:
            parser.error(f"--{flag} goes with --find-commit")
    if args.check:
        diffs = lock_differences(read_lock(), installed_versions())
        for line in diffs:
            print(line)
        print("installed stack == requirements.lock" if not diffs else f"{len(diffs)} difference(s) from requirements.lock")
        return 1 if diffs else 0
    if args.find_commit:
        try:
            found, walked = find_commits(ROOT, args.find_commit, args.since, everywhere=args.everywhere)
        except (ValueError, RuntimeError) as exc:
            parser.exit(2, f"{parser.prog}: {exc}\n")
        for commit in found:
            print(subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%H %cs %s", commit],
                                 capture_output=True, text=True, check=True).stdout.strip())
        if not found:
            print(f"no commit among the {walked} walked has code digest {args.find_commit}", file=sys.stderr)
        return 0 if found else 1
    print(json.dumps(stack_info(), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
