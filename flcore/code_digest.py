"""A content digest of the code a run ran: provenance that survives a copy without (matching) git history.

A run records ``stack["code"] = {"digest": ..., "files": n}`` (flcore/stack.py). The digest is computed from file
contents alone (no git, no mtimes), so a copy of the tree (the lent GPU machine's copy of a working tree, whose
.git may name another commit; a FAB unpacked by ``flwr run``, which has no .git) names the code that ran, and
:func:`find_commits` (``python -m flcore.stack --find-commit DIGEST``) finds the commits whose code has it.

What it covers: every ``*.py`` file under a top-level package of the project (a directory of the root holding an
``__init__.py``) except ``tests/`` and ``deploy/`` (the deployment tools; no app module imports them, and Flower's
FAB leaves them out), skipping ``__pycache__/``, ``results/`` and dot-directories at any depth; plus the
``[tool.flwr.app]`` table of pyproject.toml (the app's components and run-config defaults) without its FAB
packaging rules (``fab-include``/``fab-exclude``), as canonical JSON, since ``flwr build`` rewrites pyproject.toml.
Not covered: docs, data, results, experiment TOMLs (a run's config is in its results.json anyway), the lock
(``stack["lock"]``), file modes.

Definition: sha256 over the lines ``<posix path relative to the root> NUL <sha256 hex of the content> LF``
sorted by path (pyproject's line is named ``pyproject.toml[tool.flwr.app]``), shortened to 16 hex digits.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tomllib
from pathlib import Path

DIGEST_CHARS = 16
NOT_CODE_PACKAGES = frozenset({"tests", "deploy"})
SKIP_DIRS = frozenset({"__pycache__", "results"})
PYPROJECT = "pyproject.toml"
APP_TABLE = "pyproject.toml[tool.flwr.app]"
PACKAGING_KEYS = ("fab-include", "fab-exclude")


def is_code(rel: str, packages: frozenset[str] | set[str]) -> bool:
    """Whether the POSIX path ``rel`` (relative to the root) is a code file of one of ``packages``."""
    parts = rel.split("/")
    return (len(parts) >= 2 and parts[0] in packages and parts[-1].endswith(".py")
            and not any(p in SKIP_DIRS or p.startswith(".") for p in parts[:-1]))


def app_table_bytes(pyproject: bytes) -> bytes:
    """pyproject.toml's ``[tool.flwr.app]`` less its packaging rules, as canonical JSON (empty: no such table)."""
    table = dict(tomllib.loads(pyproject.decode()).get("tool", {}).get("flwr", {}).get("app", {}))
    for key in PACKAGING_KEYS:
        table.pop(key, None)
    return json.dumps(table, sort_keys=True, separators=(",", ":")).encode() if table else b""


def combine(file_hashes: dict[str, str]) -> str:
    """The digest of ``{path: sha256 hex of its content}``."""
    h = hashlib.sha256()
    for rel in sorted(file_hashes):
        h.update(f"{rel}\0{file_hashes[rel]}\n".encode())
    return h.hexdigest()[:DIGEST_CHARS]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_code(root: Path) -> tuple[dict[str, bytes], bytes | None]:
    """(the contents of the code files under the directory ``root`` by path, symbolic links skipped; the raw
    pyproject.toml or None)."""
    packages = {d.name for d in root.iterdir() if d.is_dir() and (d / "__init__.py").is_file()
                and not d.name.startswith(".")} - NOT_CODE_PACKAGES
    out: dict[str, bytes] = {}
    for pkg in sorted(packages):
        for dirpath, dirnames, filenames in os.walk(root / pkg):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
            base = Path(dirpath).relative_to(root).as_posix()
            for name in filenames:
                path = Path(dirpath, name)
                if name.endswith(".py") and not path.is_symlink():
                    out[f"{base}/{name}"] = path.read_bytes()
    pyproject = root / PYPROJECT
    return out, pyproject.read_bytes() if pyproject.is_file() else None


def content_hashes(files: dict[str, bytes], pyproject: bytes | None) -> dict[str, str]:
    """``{path: content sha256}``: the code files and pyproject's app table (when it has one)."""
    out = {rel: _sha(data) for rel, data in files.items()}
    if pyproject is not None and (table := app_table_bytes(pyproject)):
        out[APP_TABLE] = _sha(table)
    return out


def tree_hashes(root: Path) -> dict[str, str]:
    """``{path: content sha256}`` of the code under the directory ``root``."""
    return content_hashes(*read_code(root))


def tree_digest(root: Path) -> dict[str, object]:
    """``{"digest", "files"}`` of the code under ``root`` (files: the code files, pyproject's table included)."""
    hashes = tree_hashes(root)
    return {"digest": combine(hashes), "files": len(hashes)}


# ------------------------------------------------------------------------------ the same digest from git objects
def _git(root: Path, *args: str, data: bytes | None = None) -> bytes:
    proc = subprocess.run(["git", "-C", str(root), *args], input=data, capture_output=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


class CommitDigester:
    """The code digest of commits, read from their trees and blobs (``git ls-tree``, ``git cat-file --batch``;
    nothing is checked out). Blob hashes are cached, so walking many commits reads each blob once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[tuple[str, str], str | None] = {}  # (blob id, kind) -> sha256 of what it adds

    def _blobs(self, ids: list[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        raw = _git(self.root, "cat-file", "--batch", data="".join(f"{i}\n" for i in ids).encode())
        pos = 0
        for _ in ids:
            end = raw.index(b"\n", pos)
            oid, kind, size = raw[pos:end].decode().split(" ")
            if kind != "blob":
                raise RuntimeError(f"git object {oid} is a {kind}, not a blob")
            out[oid] = raw[end + 1:end + 1 + int(size)]
            pos = end + 2 + int(size)
        return out

    def code_blobs(self, rev: str) -> dict[str, tuple[str, str]]:
        """``{path: (kind, blob id)}`` of commit ``rev``'s code: kind "py" for a code file, "app" for the
        pyproject.toml whose app table counts (as :func:`read_code` selects them on disk)."""
        entries: dict[str, tuple[str, str]] = {}  # path -> (mode, blob id)
        for rec in _git(self.root, "ls-tree", "-r", "-z", rev).split(b"\0"):
            if rec:
                meta, path = rec.decode().split("\t", 1)
                mode, kind, oid = meta.split(" ")
                if kind == "blob":
                    entries[path] = (mode, oid)
        packages = {p.split("/")[0] for p in entries if p.count("/") == 1 and p.endswith("/__init__.py")
                    and not p.startswith(".")} - NOT_CODE_PACKAGES
        wanted = {p: ("py", oid) for p, (mode, oid) in entries.items() if mode != "120000" and is_code(p, packages)}
        if PYPROJECT in entries:
            wanted[APP_TABLE] = ("app", entries[PYPROJECT][1])
        return wanted

    def hashes(self, rev: str) -> dict[str, str]:
        """``{path: content sha256}`` of the code of commit ``rev`` (as :func:`tree_hashes` of its tree)."""
        wanted = self.code_blobs(rev)
        missing = {(oid, kind) for kind, oid in wanted.values() if (oid, kind) not in self._cache}
        blobs = self._blobs(sorted({oid for oid, _ in missing})) if missing else {}
        for oid, kind in missing:
            data = blobs[oid] if kind == "py" else app_table_bytes(blobs[oid])
            self._cache[(oid, kind)] = _sha(data) if data or kind == "py" else None
        out = {p: self._cache[(oid, kind)] for p, (kind, oid) in wanted.items()}
        return {p: h for p, h in out.items() if h is not None}  # a pyproject.toml without the table: as on disk

    def digest(self, rev: str) -> str:
        return combine(self.hashes(rev))

    def same_code(self, rev: str, files: dict[str, bytes], pyproject: bytes | None) -> bool:
        """Whether the code read from disk (:func:`read_code`) is commit ``rev``'s, i.e. has its digest. Cheap: the
        files' git blob ids are compared with the commit's (one ``git ls-tree``); only a pyproject.toml that
        differs from the commit's is read from git, to compare its app table."""
        wanted = self.code_blobs(rev)
        committed = {p: oid for p, (kind, oid) in wanted.items() if kind == "py"}
        if set(committed) != set(files):
            return False
        algo = "sha1" if len(next(iter(committed.values()), "0" * 40)) == 40 else "sha256"
        if any(git_blob_id(files[p], algo) != oid for p, oid in committed.items()):
            return False
        app = wanted.get(APP_TABLE)
        if pyproject is not None and app is not None and git_blob_id(pyproject, algo) == app[1]:
            return True
        on_disk = app_table_bytes(pyproject) if pyproject is not None else b""
        return on_disk == (app_table_bytes(self._blobs([app[1]])[app[1]]) if app is not None else b"")


def git_blob_id(data: bytes, algo: str = "sha1") -> str:
    """The id git gives a blob with this content (``git hash-object``)."""
    return hashlib.new(algo, b"blob %d\0" % len(data) + data).hexdigest()


def recent_commits(root: Path, since: str | None = None, limit: int = 300, everywhere: bool = False) -> list[str]:
    """HEAD's history, newest first: the commits after ``since`` and ``since`` itself, or the last ``limit``.
    ``everywhere``: every branch's and tag's history and the reflog's commits instead of HEAD's alone (a run made on
    a branch that was rebased before its merge has its code in commits that only the reflog still names)."""
    tips = ["--all", "--reflog"] if everywhere else ["HEAD"]
    if since is None:
        return _git(root, "rev-list", f"--max-count={limit}", *tips).decode().split()
    base = _git(root, "rev-parse", "--verify", f"{since}^{{commit}}").decode().strip()
    return _git(root, "rev-list", *tips, f"^{base}").decode().split() + [base]


def find_commits(root: Path, digest: str, since: str | None = None, limit: int = 300,
                 everywhere: bool = False) -> tuple[list[str], int]:
    """(the commits among :func:`recent_commits` whose code digest starts with ``digest``, how many were walked)."""
    digest = digest.strip().lower()
    if not 4 <= len(digest) <= DIGEST_CHARS or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"code digest {digest!r}: expected 4 to {DIGEST_CHARS} hex digits")
    digester = CommitDigester(root)
    walked = recent_commits(root, since, limit, everywhere)
    return [c for c in walked if digester.digest(c).startswith(digest)], len(walked)
