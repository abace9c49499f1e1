"""docs/PERFORMANCE.md section 8 (mixed precision and channels-last) and its summary line, from
benchmarks/results/precision.json (benchmarks/bench_precision.py) and precision_gpu.json (bench_precision_gpu.py).
Prose: docs/templates/performance/precision.md."""

from __future__ import annotations

from typing import Any

from benchmarks.report_text import blocks, f

Doc = dict[str, Any]
T = blocks("precision")
ROUND_TARGET = 2.0   # issue 44: a FMNIST ConvNet round at bf16-mixed + channels-last >= 2x fp32 on this CPU
FMNIST_IMAGES = 60_000  # one local epoch of every client: the training pool once


def _pairs(doc: Doc) -> list[tuple[Doc, Doc]]:
    """(fp32 row, bf16 row) per (job, threads), in run order."""
    rows = {(r["job"], r["threads"], r["precision"]): r for r in doc["rows"]}
    keys = list(dict.fromkeys((r["job"], r["threads"]) for r in doc["rows"]))
    return [(rows[(j, t, "fp32")], rows[(j, t, "bf16-mixed")]) for j, t in keys
            if (j, t, "fp32") in rows and (j, t, "bf16-mixed") in rows]


def _part(doc: Doc, threads: int, precision: str, last: bool) -> Doc | None:
    return next((p for p in doc["loop_parts"] if p["threads"] == threads and p["precision"] == precision
                 and p["channels_last"] == last), None)


def round_gain(doc: Doc, job: str = "fmnist-fedavg", threads: int = 1) -> tuple[Doc, Doc, float] | None:
    for a, b in _pairs(doc):
        if a["job"] == job and a["threads"] == threads:
            return a, b, a["wall_per_round_s"] / b["wall_per_round_s"]
    return None


def summary_line(doc: Doc | None) -> list[str]:
    if not doc:
        return []
    best = round_gain(doc)
    if best is None:
        return []
    a, b, gain = best
    p32, p16 = _part(doc, 1, "fp32", False), _part(doc, 1, "bf16-mixed", True)
    loop = p16["train_img_s"] / p32["train_img_s"] if p32 and p16 else None
    return [T.text("summary", fp32_s=f(a["wall_per_round_s"], 1), bf16_s=f(b["wall_per_round_s"], 1), threads=1,
                   gain=f(gain, 2), verdict="**met**" if gain >= ROUND_TARGET else "**not met**", loop_gain=f(loop, 2))]


def _rest(doc: Doc, threads: int) -> list[str]:
    best = round_gain(doc, threads=threads)
    p32, p16 = _part(doc, threads, "fp32", False), _part(doc, threads, "bf16-mixed", True)
    cl32 = _part(doc, threads, "fp32", True)
    if best is None or not (p32 and p16 and cl32):
        return []
    a, b, gain = best
    loop32, loop16 = FMNIST_IMAGES / p32["train_img_s"], FMNIST_IMAGES / p16["train_img_s"]
    step_share = (1 / p32["optimizer_step_img_s"]) / (1 / p32["train_img_s"])
    rest32, rest16 = a["wall_per_round_s"] - loop32, b["wall_per_round_s"] - loop16
    rest = (T.text("rest_positive", rest32=f(rest32, 1), rest16=f(rest16, 1),
                   eval_gain=f(p16["eval_img_s"] / p32["eval_img_s"], 2)) if rest32 > 0 and rest16 > 0 else
            T.text("rest_within_noise", round32=f(a["wall_per_round_s"], 1), round16=f(b["wall_per_round_s"], 1)))
    return ["", *T.lines("rest", threads=threads, loop_gain=f(p16["train_img_s"] / p32["train_img_s"], 2),
                         round_gain=f(gain, 2), images=f"{FMNIST_IMAGES:,}", loop32=f(loop32, 1), loop16=f(loop16, 1),
                         rest=rest, step_share=f"{100 * step_share:.1f} %"),
            "", *T.lines("channels_last", cl32=f(cl32["train_img_s"] / p32["train_img_s"], 2))]


def _gpu(gpu: Doc | None) -> list[str]:
    if not gpu or gpu.get("dry_run"):
        return T.lines("gpu_not_measured")
    rows = [[r["model"], r["numerics"], str(r["workers"]), f(r["clients_per_s"], 2),
             f(r["peak_allocated_mib_per_worker"], 0), f(r["peak_reserved_mib_per_worker"], 0),
             f(r["gpu_used_mib_peak"], 0)] for r in gpu["rows"]]
    clients = gpu["rows"][0]["clients"] if gpu["rows"] else "n/a"
    return T.table("gpu", rows, gpu=gpu["machine"].get("gpu", "a GPU"), clients=clients, batch=gpu["batch_size"],
                   images=gpu["per_client_images"])


def section_precision(doc: Doc | None, gpu: Doc | None) -> list[str]:
    if not doc:
        return T.lines("heading", cpu="n/a", machine="n/a", capability="n/a") + ["", *T.lines("not_measured"), "",
                                                                                   *_gpu(gpu), ""]
    m = doc["machine"]
    lines = T.lines("heading", cpu=f"{m['cpus']} cores", machine=m["platform"], capability=m.get("cpu_capability"))
    clients = {k: v["clients"] for k, v in doc["jobs"].items()}
    rows = [[a["job"], str(clients.get(a["job"], "")), str(a["threads"]),
             f"{f(a['wall_per_round_s'], 2)} ({f(a['cpu_per_round_s'], 2)})",
             f"{f(b['wall_per_round_s'], 2)} ({f(b['cpu_per_round_s'], 2)})",
             f"**{f(a['wall_per_round_s'] / b['wall_per_round_s'], 2)}x**",
             f"{f(a['cpu_per_round_s'] / b['cpu_per_round_s'], 2)}x",
             f"{f(a['load_at_start'], 2)} / {f(b['load_at_start'], 2)}"] for a, b in _pairs(doc)]
    timed = sorted({r["rounds_timed"] for r in doc["rows"]})
    lines += ["", *T.table("rounds", rows, rounds_timed="/".join(map(str, timed)))]
    slower = sorted({a["job"] for a, b in _pairs(doc) if b["wall_per_round_s"] > a["wall_per_round_s"]})
    if slower:
        lines += ["", *T.lines("slower", jobs=", ".join(slower))]
    parts = [[str(p["threads"]), p["precision"], "channels-last" if p["channels_last"] else "contiguous",
              f(p["forward_backward_img_s"], 0), f(p["optimizer_step_img_s"], 0), f(p["train_img_s"], 0),
              f(p["eval_img_s"], 0)] for p in doc["loop_parts"]]
    lines += ["", *T.table("parts", parts)]
    for threads in sorted({p["threads"] for p in doc["loop_parts"]}):
        lines += _rest(doc, threads)
    return lines + ["", *_gpu(gpu), ""]
