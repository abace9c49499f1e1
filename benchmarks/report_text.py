"""What every part of docs/PERFORMANCE.md is written with: its prose (templates) and number formatting.

The prose lives in docs/templates/performance/<part>.md: markdown cut into named blocks by marker lines
``<!-- block: NAME -->``. A block is the text between its marker and the next one, without the newline
that ends it (a blank line before the next marker is a blank line of the block), with ``$name`` /
``${name}`` placeholders (:class:`string.Template`; ``$$`` is a dollar sign). The report modules
(benchmarks/report_*.py) compute the values, pick blocks and hold no sentences of their own.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from string import Template
from typing import Any

from flcore.stack import describe

TEMPLATES = Path(__file__).resolve().parents[1] / "docs" / "templates" / "performance"
MARKER = re.compile(r"^<!-- block: ([a-z0-9_]+) -->$", re.MULTILINE)


class Blocks:
    """The named blocks of one template file."""

    def __init__(self, part: str, directory: Path = TEMPLATES) -> None:
        self.path = directory / f"{part}.md"
        source = self.path.read_text()
        cuts = list(MARKER.finditer(source))
        if not cuts or source[:cuts[0].start()].strip():
            raise ValueError(f"{self.path}: must start with a '<!-- block: NAME -->' line")
        self.blocks: dict[str, str] = {}
        for i, cut in enumerate(cuts):
            end = cuts[i + 1].start() - 1 if i + 1 < len(cuts) else len(source) - source.endswith("\n")
            if cut.group(1) in self.blocks:
                raise ValueError(f"{self.path}: block '{cut.group(1)}' defined twice")
            self.blocks[cut.group(1)] = source[cut.end() + 1:max(end, cut.end() + 1)]

    def text(self, name: str, **values: Any) -> str:
        """Block ``name`` with its placeholders filled (a missing value or block raises, naming both)."""
        return self._fill(name, self._source(name), values)

    def lines(self, name: str, **values: Any) -> list[str]:
        """The filled block as the report's list of lines."""
        return self.text(name, **values).split("\n")

    def table(self, name: str, rows: list[list[str]], **values: Any) -> list[str]:
        """A block holding a markdown table's header, a ``$rows`` line and any lines after it, with one
        table row per entry of ``rows`` (none: the ``$rows`` line goes)."""
        lines = self._source(name).split("\n")
        if "$rows" not in lines:
            raise ValueError(f"{self.path}: table block '{name}' has no '$rows' line")
        if not rows:
            lines.remove("$rows")
        table_rows = "\n".join("| " + " | ".join(r) + " |" for r in rows)
        return self._fill(name, "\n".join(lines), {**values, "rows": table_rows}).split("\n")

    def _source(self, name: str) -> str:
        if name not in self.blocks:
            raise KeyError(f"{self.path}: no block '{name}' (blocks: {', '.join(self.blocks)})")
        return self.blocks[name]

    def _fill(self, name: str, source: str, values: dict[str, Any]) -> str:
        try:
            return Template(source).substitute(values)
        except KeyError as exc:
            raise KeyError(f"{self.path}: block '{name}' needs a value for {exc}") from None


@lru_cache(maxsize=None)
def blocks(part: str) -> Blocks:
    """The template docs/templates/performance/``part``.md, read once per process."""
    return Blocks(part)


def f(x: Any, nd: int = 2) -> str:
    """A number with ``nd`` decimals (an int as is); ``n/a`` for None."""
    if x is None:
        return "n/a"
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return str(x)
    return f"{float(x):.{nd}f}"


def rng(s: dict[str, Any] | None, nd: int = 2) -> str:
    """median [min, max] of a stats.summary dict."""
    if not s or s.get("median") is None:
        return "n/a"
    if s.get("n", 0) <= 1:
        return f(s["median"], nd)
    return f"{f(s['median'], nd)} [{f(s['min'], nd)}, {f(s['max'], nd)}]"


def mib(b: float) -> str:
    return f"{b / 2**20:.2f}"


def same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-9 for x, y in zip(a, b))


def machine_line(doc: dict[str, Any]) -> str:
    """The machine a results file was measured on, and its load (template block ``machine``)."""
    m = doc.get("machine", {})
    load = m.get("loadavg_at_start") or [None]
    stack = describe(doc["stack"]) if doc.get("stack") else f"torch {m.get('torch')} (other versions not recorded)"
    return blocks("common").text("machine", cpus=m.get("cpus"), stack=stack, threads=m.get("torch_threads"),
                                 cuda=blocks("common").text("yes" if m.get("cuda") else "no"),
                                 load=f(load[0], 1), written=doc.get("written"))
