"""No tracked file cites a document the repository lacks: every ``docs/<name>.md`` path and every bare
``<NAME>.md`` (METHODS.md, FEDRANE.md, ...) named in the code, the docs and the configs is a tracked file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC_PATH = re.compile(r"(?<![\w/.-])docs/[\w/.-]+?\.md(?!\.?\w)")
BARE_DOC = re.compile(r"(?<![\w/.-])([A-Z][A-Z0-9_]+\.md)(?!\.?\w)")
FIXTURES = {"tests/test_code_digest.py", "tests/test_doc_references.py"}  # build fake trees with made-up paths
TEXT = (".py", ".md", ".toml", ".sh", ".tmpl", ".yaml", ".yml", ".txt", ".cfg")


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if p.endswith(TEXT) and not p.startswith(".helper/") and p not in FIXTURES]


def dangling(files: list[str]) -> list[str]:
    names = set(files)
    basenames = {Path(p).name for p in files}
    bad = []
    for rel in files:
        path = ROOT / rel
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for ref in DOC_PATH.findall(line):
                if ref not in names:
                    bad.append(f"{rel}:{n}: {ref}")
            for ref in BARE_DOC.findall(line):
                if ref not in basenames:
                    bad.append(f"{rel}:{n}: {ref}")
    return bad


def test_no_file_cites_a_document_the_repository_lacks():
    assert dangling(tracked()) == []


def test_the_check_names_a_dangling_reference(tmp_path, monkeypatch):
    import tests.test_doc_references as mod

    (tmp_path / "a.py").write_text('"""see docs/NOPE.md and MISSING.md, and README.md"""\n')
    (tmp_path / "README.md").write_text("x\n")
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    assert mod.dangling(["a.py", "README.md"]) == ["a.py:1: docs/NOPE.md", "a.py:1: MISSING.md"]
