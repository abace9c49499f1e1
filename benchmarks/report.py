"""Generate docs/PERFORMANCE.md from the benchmarks' output files in benchmarks/results/.

    python -m benchmarks.report            # reads benchmarks/results/*.json (and *.txt), writes docs/PERFORMANCE.md

Inputs (each optional; a missing one is reported as not measured):
    overhead.json, overhead_small.json   benchmarks.bench_overhead (realistic and overhead-dominated workloads)
    methods.json                         benchmarks.bench_methods
    scale.json                           benchmarks.bench_scale
    engine.json                          benchmarks.bench_engine
    gne.json                             benchmarks.bench_gne (FedRANE: GNE vs model size and K, LRA step)
    deployment.txt                       captured stdout of benchmarks.bench_deployment
    sweep.json, sweep_before_fix.json    benchmarks.bench_sweep (now, and at commit 5d51707)

This module only loads the files and puts the sections in order: each section is built by its module
(benchmarks/report_overhead.py, _methods, _scale, _deployment, _engine, _summary) from the prose in
docs/templates/performance/ (benchmarks/report_text.py explains the template format).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS_DIR
from benchmarks.report_deployment import section_deployment
from benchmarks.report_engine import engine_targets, section_engine, summary_lines
from benchmarks.report_methods import section_gne, section_methods
from benchmarks.report_overhead import section_overhead, workloads
from benchmarks.report_precision import section_precision, summary_line as precision_summary
from benchmarks.report_scale import section_scale
from benchmarks.report_summary import section_summary
from benchmarks.report_text import blocks

__all__ = ["render", "main", "engine_targets"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "PERFORMANCE.md"


class Results:
    """The benchmarks' output files in one directory (a missing file reads as None)."""

    def __init__(self, directory: Path = RESULTS_DIR) -> None:
        self.directory = directory

    def json(self, name: str) -> dict[str, Any] | None:
        path = self.directory / f"{name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def merged(self, *names: str) -> dict[str, Any] | None:
        """Several runs of one benchmark (e.g. --workers 1, then --workers 2) as one document: configs
        concatenated, each config keeping the command line it came from."""
        docs = [d for d in (self.json(n) for n in names) if d is not None]
        if not docs:
            return None
        merged = dict(docs[0])
        merged["configs"] = [{**c, "args": d["args"], "machine": d["machine"], "written": d.get("written")}
                             for d in docs for c in d["configs"]]
        return merged

    def text(self, name: str) -> str | None:
        for ext in (".txt", ".log"):
            path = self.directory / f"{name}{ext}"
            if path.exists():
                return path.read_text().strip()
        return None


def render(results: Results | None = None, doc_dir: Path = DOC.parent) -> str:
    """docs/PERFORMANCE.md's text from the files in ``results`` (default benchmarks/results/)."""
    r = results or Results()
    ov, ovs = r.merged("overhead", "overhead_w2"), r.merged("overhead_small")
    methods, scale, engine, gne = r.json("methods"), r.json("scale"), r.json("engine"), r.json("gne")
    before, sample, startup = r.json("scale_before_fix"), r.json("scale_eval_sample"), r.json("startup")
    pfl = {"mnist-5k": r.json("pfl_mnist-5k"), "digits": r.json("pfl_digits")}
    _, engine_lines = engine_targets(ov, ovs, pfl, startup, r.json("scale_engine"))
    engine_lines += summary_lines(r.json("client_floor"), r.json("sweep"), r.json("sweep_before_fix"))
    lines = blocks("header").lines("header")
    lines += section_summary(ov, ovs, scale, engine, methods, before, gne, sample, engine_lines,
                             extra=precision_summary(r.json("precision")))
    lines += section_overhead(workloads(ov, ovs), engine)
    lines += section_methods(methods) + section_gne(gne)
    lines += section_scale(scale, engine, before, sample)
    lines += section_deployment(r.text("deployment"), r.text("deployment_profile"), r.text("deployment_polls"), doc_dir,
                                 r.text("deployment_state"))
    lines += blocks("gpu").lines("gpu") + blocks("fixes").lines("fixes")
    lines += section_engine(ov, ovs, pfl, startup, r.json("scale_engine"), r.json("engine_profile"),
                            r.json("instructions"), r.json("client_floor"), (r.json("sweep_before_fix"), r.json("sweep")))
    lines += section_precision(r.json("precision"), r.json("precision_gpu"))
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(render())
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
