"""scripts/mypy_ratchet.py: the per-file ceiling of mypy errors (issue round-pipeline item 5)."""

from __future__ import annotations

import json
from collections import Counter

from scripts.mypy_ratchet import BASELINE, compare, count_errors

OUTPUT = """\
a/x.py:3: error: Incompatible types in assignment  [assignment]
a/x.py:9: note: See https://mypy.readthedocs.io
a/x.py:12: error: Item "None" has no attribute "y"  [union-attr]
b/y.py:1: error: Name "z" is not defined  [name-defined]
Found 3 errors in 2 files (checked 5 source files)
"""


def test_errors_are_counted_per_file_and_notes_are_not_errors():
    assert count_errors(OUTPUT) == Counter({"a/x.py": 2, "b/y.py": 1})


def test_a_file_over_its_ceiling_or_a_new_file_with_errors_fails_and_fewer_is_reported():
    over, under = compare(Counter({"a/x.py": 2, "b/y.py": 1}), {"a/x.py": 2, "c/z.py": 4})
    assert over == {"b/y.py": (1, 0)}            # not listed: ceiling 0
    assert under == {"c/z.py": (0, 4)}           # fixed since: the ceiling may come down
    over, _ = compare(Counter({"a/x.py": 3}), {"a/x.py": 2})
    assert over == {"a/x.py": (3, 2)}


def test_the_committed_ceiling_names_existing_files_only():
    files = json.loads(BASELINE.read_text())["files"]
    root = BASELINE.parents[1]
    assert files and all((root / f).is_file() and n > 0 for f, n in files.items())
