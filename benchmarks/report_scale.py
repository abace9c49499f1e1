"""Section 3 of docs/PERFORMANCE.md: 10-1000 simulated clients on Ray (bench_scale, before/after the
shared-record fix, sampled federated evaluation) and where the cost of N comes from (bench_engine).
Prose: docs/templates/performance/scale.md."""

from __future__ import annotations

from typing import Any

from benchmarks.report_text import blocks, f, machine_line

Doc = dict[str, Any]
T = blocks("scale")


def section_scale(doc: Doc | None, engine: Doc | None, before: Doc | None = None,
                  sample: Doc | None = None) -> list[str]:
    out = T.lines("intro")
    out += T.lines("not_measured") if doc is None else _ray_runs(doc, before, sample)
    return out + _engine_costs(engine)


def _ray_runs(doc: Doc, before: Doc | None, sample: Doc | None) -> list[str]:
    a = doc["args"]
    out = T.lines("setup", clients=" ".join(map(str, a["clients"])), sampled=a["sampled"], rounds=a["rounds"],
                  workers=a["workers"], train_rounds=a["rounds"] - 1, machine=machine_line(doc))
    out += T.table("times", [[str(r["clients"]), f(r["register_exchange_s"], 1), f(r.get("cpu_to_round1_s"), 1),
                              f(r["per_round_s"], 2), f(r.get("cpu_per_round_s"), 2), f(r["fed_eval_extra_s"], 1),
                              f(r.get("fed_eval_extra_cpu_s"), 1), f(r["fed_eval_bytes_sent"] / 2**20, 0)]
                             for r in doc["runs"]])
    phases = ("memory_registration", "memory_train_rounds", "memory_eval_round")
    out += T.table("memory", [[str(r["clients"])] + [f(r[phase][who], 0) for phase in phases
                                                      for who in ("driver_mib", "tree_mib")] for r in doc["runs"]])
    if g := doc.get("growth", {}):
        out += T.table("growth", [[k, f(v.get("mib_per_client", v.get("s_per_client")), 4), f(v["loglog_slope"], 3)]
                                  for k, v in g.items()])
    now = {r["clients"]: r for r in doc["runs"]}
    if before is not None:
        rows = []
        for r in before["runs"]:
            for label, run in ((T.text("before_label"), r), (T.text("current_label"), now.get(r["clients"]))):
                if run is not None:
                    rows.append([str(r["clients"]), label, f(run["memory_eval_round"]["driver_mib"], 0),
                                 f(run["memory_eval_round"]["tree_mib"], 0),
                                 f(run["memory_train_rounds"]["driver_mib"], 0), f(run["fed_eval_extra_s"], 1),
                                 f(run.get("fed_eval_extra_cpu_s"), 1)])
        out += T.table("before", rows, written=before.get("written"))
    if sample is not None:
        rows = []
        for r in sample["runs"]:
            for label, run in ((T.text("all_label", clients=r["clients"]), now.get(r["clients"])),
                               (T.text("sampled_label", sampled=r["federated_eval_clients"]), r)):
                if run is not None:
                    rows.append([str(r["clients"]), label, str(run.get("num_evaluated") or run["clients"]),
                                 f(run["fed_eval_extra_s"], 1), f(run.get("fed_eval_extra_cpu_s"), 1),
                                 f(run["memory_eval_round"]["driver_mib"], 0)])
        first = sample["runs"][0]
        out += T.table("sample", rows, clients=" ".join(str(r["clients"]) for r in sample["runs"]),
                       sampled=first["federated_eval_clients"], written=sample.get("written"),
                       load=f(first["loadavg_after"][0], 1))
    return out + T.lines("loads", loads=", ".join(f(r["loadavg_after"][0], 1) for r in doc["runs"]))


def _engine_costs(engine: Doc | None) -> list[str]:
    out = T.lines("engine_heading")
    if engine is None:
        return out + T.lines("engine_not_measured")
    out += T.table("exchange", [[str(r["clients"]), T.text("shared_label" if r["shared_records"] else "copy_label"),
                                 f(r["evaluate_all_peak_mib"], 1), f(r["evaluate_all_cpu_ms"], 0),
                                 f(r["train_sampled_peak_mib"], 1), f(r["train_sampled_cpu_ms"], 0)]
                                for r in engine["exchange"]], machine=machine_line(engine))
    if engine.get("registry"):
        out += T.lines("registry", items=", ".join(
            T.text("registry_item", clients=r["clients"], mib=f(r["registry_mib"], 3),
                   ms=f(r["refresh_known_cpu_ms"], 2)) for r in engine["registry"]))
    if engine.get("node_state"):
        out += T.lines("node_state", items=", ".join(
            T.text("node_state_item", nodes=r["nodes"],
                   kib=f(r["linkstate_kib_per_node"] + r["context_kib_per_node"], 1)) for r in engine["node_state"]))
    if ri := engine.get("ray_idle"):
        out += T.lines("ray_idle", cpu=f(ri["cpu_per_wall_s"], 3), seconds=f(ri["seconds"], 0))
    return out + T.table("poll", [[str(r["nodes"]), str(r["pending"]), f(r["first_cycle_cpu_ms"], 1),
                                   f(r["later_cycle_cpu_ms"], 1)] for r in engine["poll"]])
