"""Section 1 of docs/PERFORMANCE.md: framework overhead (bench_overhead: plain loop, in-process engine, Ray).
Prose: docs/templates/performance/overhead.md."""

from __future__ import annotations

from typing import Any

from benchmarks.report_text import blocks, f, machine_line, rng, same

Doc = dict[str, Any]
T = blocks("overhead")


def workloads(realistic: Doc | None, small: Doc | None) -> list[tuple[str, Doc | None]]:
    """The two bench_overhead workloads with their section labels."""
    return [(T.text("label_realistic"), realistic), (T.text("label_small"), small)]


def _source(doc: Doc, c: Doc) -> str:
    """The command line (and machine) one config of ``doc`` was measured with."""
    a = c.get("args", doc["args"])
    src = {"machine": c.get("machine", doc["machine"]), "written": c.get("written", doc.get("written"))}
    flags = T.text("flag_max_steps", value=a["max_steps"]) if a.get("max_steps") else ""
    flags += T.text("flag_name", value=a["name"]) if a.get("name") not in (None, "overhead") else ""
    return T.text("source", dataset=a["dataset"], clients=a["clients"], rounds=a["rounds"], repeats=a["repeats"],
                  workers=" ".join(map(str, a["workers"])), flags=flags, machine=machine_line(src))


def _workload(label: str, doc: Doc, engine: Doc | None) -> list[str]:
    out = T.lines("workload", label=label)
    sources: list[str] = []
    for c in doc["configs"]:
        if (line := _source(doc, c)) not in sources:
            sources.append(line)
    out += T.lines("sources", sources="; ".join(sources))
    out += T.table("times", [[str(c["workers"]), v, rng(c[f"{v}.per_round_s"]), rng(c[f"{v}.cpu_per_round_s"]),
                              rng(c[f"{v}.startup_s"], 1), rng(c[f"{v}.cpu_startup_s"], 1)]
                             for c in doc["configs"] for v in ("plain", "inprocess", "flower")])
    out += T.table("ratios", [[str(c["workers"]), key, rng(c[f"{key} cpu"], 3), rng(c[key], 3)] for c in doc["configs"]
                              for key in ("flower/plain", "inprocess/plain", "flower/inprocess")])
    # only the plain loop (W torch threads) differs; the engines (W single-threaded workers) agree exactly
    partial = [c for c in doc["configs"] if not c["identical_accuracy"]
               and all(same(r["inprocess"]["accuracy"], r["flower"]["accuracy"]) for r in c["repeats"])
               and all(same(r["flower"]["accuracy"], c["repeats"][0]["flower"]["accuracy"]) for r in c["repeats"])]
    c1 = next((c for c in doc["configs"] if c["workers"] == 1), None)
    if engine and engine.get("ray_idle") and c1 is not None:
        idle, wall = engine["ray_idle"]["cpu_per_wall_s"], c1["flower.per_round_s"]["median"]
        diff = c1["flower.cpu_per_round_s"]["median"] - c1["inprocess.cpu_per_round_s"]["median"]
        out += T.lines("ray_cpu", diff=f(diff, 2), idle=f(idle, 3), idle_round=f(idle * wall, 2), wall=f(wall, 2))
    unexplained = [c for c in doc["configs"] if not c["identical_accuracy"] and c not in partial]
    verdict = "identical_no" if unexplained else "identical_threads" if partial else "identical_yes"
    out += T.lines("identical", identical=T.text(verdict),
                   shutdown=", ".join(rng(c["flower.shutdown_s"], 1) for c in doc["configs"]),
                   loads=", ".join(rng(c["loadavg"], 1) for c in doc["configs"]), cpus=doc["machine"].get("cpus"))
    for c in partial:
        r = c["repeats"][0]
        repro = c1 is not None and same(r["flower"]["accuracy"], c1["repeats"][0]["flower"]["accuracy"])
        out += T.lines("partial", workers=c["workers"], reproduced=T.text("reproduced") if repro else "",
                       plain=r["plain"]["accuracy"], flower=r["flower"]["accuracy"])
    return out


def section_overhead(docs: list[tuple[str, Doc | None]], engine: Doc | None = None) -> list[str]:
    out = T.lines("intro")
    for label, doc in docs:
        out += T.lines("not_measured", label=label) if doc is None else _workload(label, doc, engine)
    return out + threads_paragraph(docs)


def threads_paragraph(docs: list[tuple[str, Doc | None]]) -> list[str]:
    """torch threads vs Ray actors: the same workload with 1 and 2 workers, where both were measured."""
    out = []
    for label, doc in docs:
        by_w = {c["workers"]: c for c in doc["configs"]} if doc is not None else {}
        if 1 not in by_w or 2 not in by_w:
            continue
        one, two = by_w[1], by_w[2]

        def med(c: Doc, k: str) -> float:
            return c[k]["median"]

        def pair(variant: str, one: list = one, two: list = two) -> dict[str, str]:
            """1 and 2 workers of one variant: wall, speed-up, CPU."""
            k, kc = f"{variant}.per_round_s", f"{variant}.cpu_per_round_s"
            return {f"{variant}1": f(med(one, k)), f"{variant}2": f(med(two, k)),
                    f"{variant}_speedup": f(med(one, k) / med(two, k)),
                    f"{variant}_cpu1": f(med(one, kc)), f"{variant}_cpu2": f(med(two, kc))}

        better = ("threads_better" if med(two, "plain.per_round_s") < med(two, "flower.per_round_s")
                  else "actors_better")
        engine = ""
        if "inprocess.per_round_s" in one and "inprocess.per_round_s" in two:
            engine = T.text("threads_engine", **{k.replace("inprocess", "engine"): v
                                                 for k, v in pair("inprocess").items()})
        out += T.lines("threads", label=label.split(":")[0].lower(), **pair("plain"), **pair("flower"),
                       engine=engine, better=T.text(better), load1=rng(one["loadavg"], 1),
                       load2=rng(two["loadavg"], 1))
    if out:
        out += T.lines("threads_reading")
    return out
