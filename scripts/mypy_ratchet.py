"""mypy over the library packages, held to a per-file ceiling of errors that only goes down (issue round-pipeline
item 5: the code is not yet mypy-clean; no file may get worse, and none that is clean may regress).

    python scripts/mypy_ratchet.py [--python-executable PY] [--cache-dir DIR] [--update]

The ceiling is .ci/mypy-baseline.json (file -> errors). Exit 1, naming the files, when a file has more errors
than its ceiling (a file not listed has ceiling 0); a file with fewer is reported, and ``--update`` writes the new
counts (the ceiling never rises: ``--update`` refuses while any file is over it; without a baseline file it
records the starting point). mypy's settings are pyproject's
``[tool.mypy]``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "mypy-baseline.json"
ERROR = re.compile(r"^(?P<file>[^:\s]+\.py):\d+: error: ")


def count_errors(output: str) -> Counter[str]:
    """Errors per file in mypy's output (notes and the summary line are not errors)."""
    return Counter(m["file"] for line in output.splitlines() if (m := ERROR.match(line)))


def compare(counts: Counter[str], ceiling: dict[str, int]) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """(files over their ceiling, files under it), each file -> (errors now, ceiling)."""
    over = {f: (n, ceiling.get(f, 0)) for f, n in counts.items() if n > ceiling.get(f, 0)}
    under = {f: (counts.get(f, 0), c) for f, c in ceiling.items() if counts.get(f, 0) < c}
    return over, under


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python-executable", default=sys.executable, help="the interpreter whose packages mypy reads")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--update", action="store_true", help="write the (lower) counts as the new ceiling")
    args = ap.parse_args(argv)
    cmd = [sys.executable, "-m", "mypy", "--python-executable", args.python_executable, "--no-error-summary"]
    if args.cache_dir:
        cmd += ["--cache-dir", args.cache_dir]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 1):  # 2: mypy itself failed (a config or syntax error)
        print(proc.stdout + proc.stderr, file=sys.stderr)
        return 2
    counts = count_errors(proc.stdout)
    ceiling = json.loads(BASELINE.read_text())["files"] if BASELINE.exists() else {}
    over, under = compare(counts, ceiling)
    total, limit = sum(counts.values()), sum(ceiling.values())
    print(f"mypy: {total} errors in {len(counts)} files (ceiling {limit} in {len(ceiling)})")
    for f, (n, c) in sorted(under.items()):
        print(f"  fewer than the ceiling: {f} {n} < {c} (run with --update to lower it)")
    if over and not (args.update and not BASELINE.exists()):  # the first --update records the starting point
        print("mypy: over the ceiling (fix them; the ceiling does not rise):")
        for f, (n, c) in sorted(over.items()):
            print(f"  {f}: {n} errors, ceiling {c}")
        print("\n".join(line for line in proc.stdout.splitlines()
                        if (m := ERROR.match(line)) and m["file"] in over))
        return 1
    if args.update:
        BASELINE.write_text(json.dumps({"about": "per-file ceiling of mypy errors (scripts/mypy_ratchet.py)",
                                        "files": dict(sorted(counts.items()))}, indent=1) + "\n")
        print(f"-> {BASELINE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
