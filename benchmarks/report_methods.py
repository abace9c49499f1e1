"""Section 2 of docs/PERFORMANCE.md: method costs relative to FedAvg (bench_methods) and FedRANE's GNE
aggregation and LRA step (bench_gne), with their summary lines. Prose: docs/templates/performance/methods.md
(a method's ``why_<name>`` block says where its extra cost comes from)."""

from __future__ import annotations

from typing import Any

from benchmarks.report_text import blocks, f, machine_line, mib, rng

Doc = dict[str, Any]
T = blocks("methods")


def section_methods(doc: Doc | None) -> list[str]:
    out = T.lines("intro")
    if doc is None:
        return out + T.lines("not_measured")
    a = doc["args"]
    out += T.lines("setup", repeats=a["repeats"], rounds=a["rounds"], clients=a["clients"], dataset=a["dataset"],
                   machine=machine_line(doc))
    out += T.table("table", [[m, rng(t["cpu_ratio"]), rng(t["time_ratio"]), rng(t["bytes_sent_ratio"]),
                              rng(t["bytes_received_ratio"]), rng(t["cpu_per_round_s"]),
                              mib(t["bytes_sent_per_round"]["median"]), mib(t["bytes_received_per_round"]["median"])]
                             for m, t in doc["table"].items()])
    phase_rows = []
    for m, t in doc["table"].items():
        phases = t.get("phases", {})
        if len(phases) > 1 or any(p != "train" for p in phases):
            phase_rows += [[m, p, f(v["messages"], 1), mib(v["bytes_sent"]), mib(v["bytes_received"]),
                            f(v["seconds"], 2)] for p, v in phases.items()]
    if phase_rows:
        out += T.table("phases", phase_rows)
    notes = [T.text("method_note", method=m, note=T.text(_why(m))) for m in doc["table"] if _why(m) in T.blocks]
    if notes:
        out += T.lines("costs_intro") + notes + [""]
    out += T.lines("unmeasured_costs") + [""]
    if doc.get("missing"):
        out += T.lines("missing_intro") + [T.text("method_note", method=m, note=why)
                                           for m, why in doc["missing"].items()] + [""]
    return out


def _why(method: str) -> str:
    return "why_" + method.replace("-", "_")


def section_gne(doc: Doc | None) -> list[str]:
    """GNE aggregation per round vs model size and K, against the local training of a FedRANE round."""
    out = T.lines("gne_heading")
    if doc is None:
        return out + T.lines("gne_not_measured")
    a = doc["args"]
    out += T.lines("gne_setup", models=" ".join(a["models"]), clients=" ".join(map(str, a["clients"])),
                   machine=machine_line(doc), repeats=a["repeats"], local_epochs=a["local_epochs"],
                   local_samples=a["local_samples"], batch_size=a["batch_size"], steps=doc["steps_per_round"])
    out += T.table("gne_models", [[m, f(v["params"] / 1e6, 2) + "M", "x".join(map(str, v["input_shape"])),
                                   f(v["plain_step_cpu_s"], 3), f(v["lra_step_cpu_s"], 3), f(v["lra_step_ratio"]),
                                   f(v.get("lra_closed_form_step_ratio")), f(v["local_round_cpu_s"], 1)]
                                  for m, v in doc["models"].items()])
    out += T.table("gne_rows", [[r["model"], str(r["clients"]), r["solver"], f(r["gne_cpu_s"], 3),
                                 f(r["gram_wall_s"], 3), f(r["solve_wall_s"], 4), str(r["iterations"]),
                                 f"{r['residual']:.1e}", f(100 * r["vs_one_client_round"], 2) + "%",
                                 f(100 * r["vs_all_clients_sequential"], 3) + "%"] for r in doc["rows"]])
    return out + T.lines("gne_reading")


def gne_summary(doc: Doc | None) -> list[str]:
    if doc is None:
        return []
    big = max(doc["models"], key=lambda m: doc["models"][m]["params"])
    kmax = max(r["clients"] for r in doc["rows"])
    rows = [r for r in doc["rows"] if r["model"] == big and r["clients"] == kmax]
    out = []
    if rows:
        worst = max(r["vs_one_client_round"] for r in rows)
        out.append(T.text(
            "gne_summary", k=kmax, model=big, params=f(doc["models"][big]["params"] / 1e6, 1),
            cpu=", ".join(T.text("gne_cpu", cpu=f(r["gne_cpu_s"], 2), solver=r["solver"]) for r in rows),
            shares=", ".join(f(100 * r["vs_one_client_round"], 1) + "%" for r in rows),
            round_cpu=f(doc["models"][big]["local_round_cpu_s"], 0),
            shares_all=", ".join(f(100 * r["vs_all_clients_sequential"], 3) + "%" for r in rows),
            verdict=T.text("gne_met" if worst < 0.10 else "gne_not_met")))
    ratios = ", ".join(f"{m} {f(v['lra_step_ratio'])}" for m, v in doc["models"].items())
    out.append(T.text("lra_summary", ratios=ratios))
    return out
