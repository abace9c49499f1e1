"""The summary that opens docs/PERFORMANCE.md: one line per finding, each pointing at its section.
Prose: docs/templates/performance/summary.md."""

from __future__ import annotations

from typing import Any

from benchmarks.report_methods import gne_summary
from benchmarks.report_text import blocks, f, rng

Doc = dict[str, Any]
T = blocks("summary")
OVERHEAD_GOAL = 1.15  # steady-state Flower/plain per-round ratio (issue 10)
SAME_BYTES = 0.05     # a method's bytes sent are named when they differ from FedAvg's by more than this


def goal(c: Doc, target: float = OVERHEAD_GOAL) -> str:
    """Whether the steady-state overhead goal (Flower/plain <= 1.15) holds in the worst repeat."""
    cpu, wall = c["flower/plain cpu"], c["flower/plain"]
    if cpu.get("max") is None or wall.get("max") is None:
        return ""
    worst = max(cpu["max"], wall["max"])
    verdict = ("goal_every_repeat" if worst <= target else
               "goal_median" if max(cpu["median"], wall["median"]) <= target else "goal_not_met")
    return T.text("goal", target=target, verdict=T.text(verdict), worst=f(worst, 3))


def _exchange_fix_line(engine: Doc) -> list[str]:
    """Summary line: memory of one all-client exchange before and after the shared-record fix."""
    ex = {(r["clients"], r["shared_records"]): r for r in engine["exchange"]}
    nmax = max(r["clients"] for r in engine["exchange"])
    a, b = ex.get((nmax, False)), ex.get((nmax, True))
    if not (a and b):
        return []
    return [T.text("exchange", clients=nmax, before=f(a["evaluate_all_peak_mib"], 0),
                   after=f(b["evaluate_all_peak_mib"], 1), train=f(b["train_sampled_peak_mib"], 1))]


def _overhead(label: str, doc: Doc | None) -> list[str]:
    if doc is None:
        return [T.text("overhead_not_measured", label=label)]
    c = next((c for c in doc["configs"] if c["workers"] == 1), doc["configs"][0])
    out = [T.text("overhead", label=label, workers=c["workers"], flower_cpu=rng(c["flower/plain cpu"], 3),
                  flower_wall=rng(c["flower/plain"], 3), n=c["flower/plain"]["n"],
                  inprocess_cpu=rng(c["inprocess/plain cpu"], 3),
                  flower_inprocess_cpu=rng(c["flower/inprocess cpu"], 3),
                  startup=rng(c["flower.startup_s"], 1), startup_cpu=rng(c["flower.cpu_startup_s"], 1),
                  shutdown=rng(c["flower.shutdown_s"], 1), goal=goal(c))]
    by_w = {c["workers"]: c for c in doc["configs"]}
    if 1 in by_w and 2 in by_w:
        w1, w2 = by_w[1], by_w[2]
        out.append(T.text("threads", label=label.split(" (")[0],
                          plain1=f(w1["plain.per_round_s"]["median"]), plain2=f(w2["plain.per_round_s"]["median"]),
                          flower1=f(w1["flower.per_round_s"]["median"]), flower2=f(w2["flower.per_round_s"]["median"])))
    return out


def _scale(scale: Doc, engine: Doc | None, before: Doc | None) -> list[str]:
    runs = {r["clients"]: r for r in scale["runs"]}
    g, ns = scale.get("growth", {}), sorted(runs)
    clients = ", ".join(map(str, ns))
    out = []
    tr, ev = g.get("memory_train_rounds.tree_mib"), g.get("memory_eval_round.driver_mib")
    if tr and ev:
        out.append(T.text("memory", clients=clients,
                          tree=", ".join(f(runs[n]["memory_train_rounds"]["tree_mib"], 0) for n in ns),
                          driver=", ".join(f(runs[n]["memory_eval_round"]["driver_mib"], 0) for n in ns),
                          slope_tree=f(tr["loglog_slope"], 2), slope_driver=f(ev["loglog_slope"], 2),
                          mib_per_client=f(tr["mib_per_client"], 2)))
    if before is not None:
        b = {r["clients"]: r for r in before["runs"]}
        out += [T.text("before", clients=n, before=f(b[n]["memory_eval_round"]["driver_mib"], 0),
                       now=f(runs[n]["memory_eval_round"]["driver_mib"], 0)) for n in sorted(b) if n in runs]
    if engine is not None:
        out += _exchange_fix_line(engine)
    if all(runs[n].get("cpu_per_round_s") is not None for n in ns):
        out.append(T.text("time", train=", ".join(f(runs[n]["cpu_per_round_s"], 2) for n in ns), clients=clients,
                          eval=", ".join(f(runs[n]["fed_eval_extra_cpu_s"], 1) for n in ns)))
    return out


def _methods(methods: Doc) -> str:
    t = methods["table"]
    ranked = sorted((m for m in t if m != "fedavg"), key=lambda m: -t[m]["cpu_ratio"]["median"])

    def one(m: str) -> str:
        sent = t[m]["bytes_sent_ratio"]["median"]
        bytes_ = T.text("method_bytes", bytes=f(sent)) if abs(sent - 1) > SAME_BYTES else ""
        return T.text("method", method=m, cpu=f(t[m]["cpu_ratio"]["median"]), bytes=bytes_)
    return T.text("methods", methods=", ".join(one(m) for m in ranked))


def section_summary(ov: Doc | None, ovs: Doc | None, scale: Doc | None, engine: Doc | None,
                    methods: Doc | None = None, before: Doc | None = None, gne: Doc | None = None,
                    sample: Doc | None = None, engine_lines: list[str] | None = None,
                    extra: list[str] | None = None) -> list[str]:
    """The summary; ``engine_lines`` (section 7's target lines) come right after the heading, ``extra`` (lines of
    later sections, each naming its section) before the GNE and GPU lines."""
    out = T.lines("heading") + [T.text("engine_line", line=line) for line in engine_lines or []]
    for label, doc in ((T.text("label_realistic"), ov), (T.text("label_small"), ovs)):
        out += _overhead(label, doc)
    if scale is not None:
        out += _scale(scale, engine, before)
    elif engine is not None:
        out += _exchange_fix_line(engine)
    if methods is not None:
        out.append(_methods(methods))
    if sample is not None and scale is not None:
        allrun = {r["clients"]: r for r in scale["runs"]}
        for r in sample["runs"]:
            a = allrun.get(r["clients"])
            if a and a.get("fed_eval_extra_cpu_s") and r.get("fed_eval_extra_cpu_s"):
                out.append(T.text("sample", sampled=r["federated_eval_clients"], clients=r["clients"],
                                  cpu=f(r["fed_eval_extra_cpu_s"], 1), all_cpu=f(a["fed_eval_extra_cpu_s"], 1)))
    return out + (extra or []) + gne_summary(gne) + [T.text("gpu")] + T.lines("closing")
