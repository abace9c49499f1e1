#!/usr/bin/env bash
# The guardrails (issue round-pipeline item 5): ruff, the import-linter layering contract and mypy over the
# library packages (clean: any error fails), from a venv of their own outside the project tree
# (requirements-lint.lock); mypy reads the packages of the interpreter in $PYTHON (the locked tier's). No cache is
# written into the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LINT_VENV:-${TMPDIR:-/tmp}/noniid-fl-lint-venv}"
[ -x "$venv/bin/ruff" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q --require-hashes -r requirements-lint.lock; }
"$venv/bin/ruff" check --no-cache .
"$venv/bin/lint-imports" --no-cache
"$venv/bin/python" -m mypy --python-executable "$(command -v "${PYTHON:-python}")" --cache-dir "$venv/mypy-cache"
