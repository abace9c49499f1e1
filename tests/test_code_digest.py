"""The code digest (flcore/code_digest.py): what it covers, that it is stable and sensitive to one byte, that the
digest read from a commit's blobs (``--find-commit``) equals the one read from disk, that a FAB keeps it, and
what the stack records (flcore/stack.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from flcore.code_digest import (APP_TABLE, CommitDigester, app_table_bytes, find_commits, git_blob_id, read_code,
                                recent_commits, tree_digest, tree_hashes)
from flcore.stack import ROOT, describe, git_state, main, stack_info

PYPROJECT = ('[project]\nname = "x"\n\n[tool.flwr.app]\npublisher = "p"\nfab-exclude = ["docs/**"]\n\n'
             '[tool.flwr.app.components]\nserverapp = "pkg.a:app"\n\n[tool.flwr.app.config]\nlr = 0.1\n\n'
             '[tool.uv]\nconstraint-dependencies = ["a==1"]\n')
CODE = {"pkg/__init__.py": b"", "pkg/a.py": b"X = 1\n", "pkg/sub/b.py": b"Y = 2\n", "other/__init__.py": b"# o\n"}
NOT_CODE = {"pkg/__pycache__/a.cpython-311.pyc": b"\0", "pkg/__pycache__/stale.py": b"Z = 0\n",
            "pkg/results/r.py": b"R = 1\n", "pkg/.hidden/h.py": b"H = 1\n", "pkg/notes.md": b"# n\n",
            "pkg/conf.toml": b"a = 1\n", "tests/__init__.py": b"", "tests/test_a.py": b"T = 1\n",
            "deploy/__init__.py": b"", "deploy/tool.py": b"D = 1\n", "docs/conf.py": b"C = 1\n",
            "data/x.py": b"1\n", "results/run/r.py": b"1\n", "scripts/s.py": b"1\n", "top.py": b"1\n"}


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    _write(root, {**CODE, **NOT_CODE, "pyproject.toml": PYPROJECT.encode()})
    return root


def _by_definition(files: dict[str, bytes], table: bytes) -> str:
    """The digest spelled out from the module docstring's definition, independently of the module."""
    lines = {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
    lines[APP_TABLE] = hashlib.sha256(table).hexdigest()
    return hashlib.sha256("".join(f"{p}\0{lines[p]}\n" for p in sorted(lines)).encode()).hexdigest()[:16]


def test_the_digest_covers_the_packages_code_and_the_app_table_only(project: Path) -> None:
    table = json.dumps({"components": {"serverapp": "pkg.a:app"}, "config": {"lr": 0.1}, "publisher": "p"},
                       sort_keys=True, separators=(",", ":")).encode()
    assert app_table_bytes(PYPROJECT.encode()) == table
    assert set(tree_hashes(project)) == {*CODE, APP_TABLE}
    assert tree_digest(project) == {"digest": _by_definition(CODE, table), "files": 5}
    assert tree_digest(project) == tree_digest(project)  # stable


def test_one_byte_changes_the_digest_and_ignored_files_do_not(project: Path) -> None:
    before = tree_digest(project)["digest"]
    (project / "pkg/sub/b.py").write_bytes(b"Y = 3\n")
    changed = tree_digest(project)["digest"]
    assert changed != before
    (project / "pkg/sub/b.py").write_bytes(CODE["pkg/sub/b.py"])
    assert tree_digest(project)["digest"] == before
    _write(project, {rel: data + b"# more\n" for rel, data in NOT_CODE.items()})  # every ignored file edited
    _write(project, {"pkg/__pycache__/new.py": b"N = 1\n", "pkg/results/x/y.py": b"1\n", "results/z.py": b"1\n"})
    os.utime(project / "pkg/a.py", (0, 0))  # mtimes do not count
    assert tree_digest(project)["digest"] == before


def test_pyproject_counts_by_its_app_table_only(project: Path) -> None:
    before = tree_digest(project)["digest"]
    reformatted = PYPROJECT.replace('fab-exclude = ["docs/**"]', 'fab-exclude = ["docs/**", "data/**"]')
    (project / "pyproject.toml").write_text(reformatted.replace('"a==1"', '"a==2"') + "\n# comment\n")
    assert tree_digest(project)["digest"] == before  # packaging rules, uv pins, comments: not run code
    (project / "pyproject.toml").write_text(PYPROJECT.replace("lr = 0.1", "lr = 0.2"))
    assert tree_digest(project)["digest"] != before  # a run-config default


def _git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(root), "-c", "commit.gpgsign=false", *args], check=True, env=env,
                          capture_output=True, text=True).stdout.strip()


def _commit(root: Path, message: str) -> str:
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", message)
    return _git(root, "rev-parse", "HEAD")


def test_a_commits_blobs_give_the_digest_of_its_checkout(project: Path) -> None:
    """The --find-commit path (git ls-tree / cat-file) computes, for HEAD in a clean state, the digest of the files
    on disk; the stack's git state says the code is the commit's until one byte of code changes."""
    (project / ".gitignore").write_text("__pycache__/\n")
    _git(project, "init", "-q")
    first = _commit(project, "first")
    on_disk = tree_digest(project)
    digester = CommitDigester(project)
    assert digester.hashes("HEAD") == tree_hashes(project)
    assert digester.digest("HEAD") == on_disk["digest"] == digester.digest(first)
    state = git_state(project, read_code(project))
    assert state == {"commit": first, "tree": _git(project, "rev-parse", "HEAD^{tree}"), "dirty": False,
                     "code_dirty": False}
    assert git_blob_id(CODE["pkg/a.py"]) == _git(project, "rev-parse", "HEAD:pkg/a.py")
    # a copy of another commit's tree next to this .git: code differs (one byte), and the walk finds its commit
    (project / "pkg/a.py").write_bytes(b"X = 2\n")
    assert git_state(project, read_code(project))["code_dirty"] is True
    assert digester.same_code("HEAD", *read_code(project)) is False
    (project / "pyproject.toml").write_text(PYPROJECT.replace("lr = 0.1", "lr = 0.3"))
    second_digest = tree_digest(project)["digest"]
    second = _commit(project, "second")
    _write(project, {"docs/more.md": b"x\n"})
    docs_only = _commit(project, "docs only")  # not code: the same digest as `second`
    assert find_commits(project, on_disk["digest"]) == ([first], 3)
    assert find_commits(project, second_digest[:8]) == ([docs_only, second], 3)  # newest first
    assert find_commits(project, on_disk["digest"], since=second) == ([], 2)  # after `second` and itself
    assert git_state(project, read_code(project))["code_dirty"] is False
    # a pyproject.toml rewritten (as flwr build does) but with the same app table is still the commit's code
    (project / "pyproject.toml").write_text(PYPROJECT.replace("lr = 0.1", "lr = 0.3") + "\n# rewritten\n")
    assert git_state(project, read_code(project)) | {"dirty": None} == {
        "commit": _git(project, "rev-parse", "HEAD"), "tree": _git(project, "rev-parse", "HEAD^{tree}"),
        "dirty": None, "code_dirty": False}
    with pytest.raises(ValueError, match="expected 4 to 16 hex digits"):
        find_commits(project, "xyz1")


def test_a_fab_of_the_project_has_the_digest_of_the_tree(tmp_path: Path) -> None:
    """`flwr run .` ships the code as a FAB (pyproject.toml rewritten, deploy/ and tests/ left out) and the run
    has no .git: the digest of the unpacked FAB is the tree's."""
    from flwr.cli.build import build_fab_from_disk

    fab = build_fab_from_disk(ROOT)
    with zipfile.ZipFile(io.BytesIO(fab)) as z:
        names = z.namelist()
        assert "pyproject.toml" in names and not any(n.startswith(("deploy/", "tests/")) for n in names)
        assert z.read("pyproject.toml") != (ROOT / "pyproject.toml").read_bytes()
        files = {n: z.read(n) for n in names}
    _write(tmp_path, files)
    assert tree_digest(tmp_path) == tree_digest(ROOT)


def test_the_stack_records_the_code_and_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    info = stack_info()
    assert info["code"] == tree_digest(ROOT) and info["code"]["files"] > 150
    git = info["git"]
    if git is not None:  # in a checkout: HEAD's tree, and whether the code that runs is HEAD's
        head = CommitDigester(ROOT).digest("HEAD")
        assert git["code_dirty"] == (head != info["code"]["digest"])
        assert git["tree"] == _git(ROOT, "rev-parse", "HEAD^{tree}")
        assert main(["--find-commit", head, "--since", "HEAD"]) == 0
        assert capsys.readouterr().out.split()[0] == git["commit"]
    assert main([]) == 0
    assert json.loads(capsys.readouterr().out)["code"] == info["code"]
    assert describe(info).split(", ")[-1] == (f"code {info['code']['digest']}"
                                              + (" (not the commit's code)" if git and git["code_dirty"] else ""))


def test_find_commit_everywhere_reaches_a_rebased_branchs_commits(project: Path) -> None:
    """A run made on a branch that was rebased before its merge: its code's commit is on no branch of HEAD's
    history any more (only the reflog names it); the default walk misses it, --everywhere finds it."""
    (project / ".gitignore").write_text("__pycache__/\n")
    _git(project, "init", "-q", "-b", "main")
    base = _commit(project, "base")
    _git(project, "checkout", "-q", "-b", "topic")
    (project / "pkg/a.py").write_bytes(b"X = 7\n")
    on_topic = _commit(project, "topic work")  # the run's code
    ran = tree_digest(project)["digest"]
    _git(project, "checkout", "-q", "main")
    _write(project, {"pkg/b.py": b"Y = 1\n"})
    _commit(project, "main moves on")
    _git(project, "checkout", "-q", "topic")
    _git(project, "rebase", "-q", "main")  # topic's commit is rewritten on top of main: new code, new digest
    _git(project, "checkout", "-q", "main")
    _git(project, "merge", "-q", "--ff-only", "topic")
    _git(project, "branch", "-q", "-D", "topic")
    assert find_commits(project, ran)[0] == []
    found, walked = find_commits(project, ran, everywhere=True)
    assert found == [on_topic] and walked == 4  # base, main's commit, the rebased commit, the original
    assert base in recent_commits(project, everywhere=True)


def test_everywhere_and_since_need_find_commit(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in (["--everywhere"], ["--since", "HEAD"]):
        with pytest.raises(SystemExit) as exc:
            main(flag)
        assert exc.value.code == 2 and f"{flag[0]} goes with --find-commit" in capsys.readouterr().err
