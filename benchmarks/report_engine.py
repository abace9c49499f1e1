"""Section 7 of docs/PERFORMANCE.md: the in-process engine against the issue-17 targets (next to Flower's
Ray engine and pfl-research), its start-up and the profile of its remaining overhead; the targets' summary
lines open the report. Prose: docs/templates/performance/engine.md."""

from __future__ import annotations

from typing import Any

from benchmarks.report_text import blocks, f, machine_line, rng

Doc = dict[str, Any]
T, WORDS = blocks("engine"), blocks("common")
ENGINE_PLAIN_MAX = 1.10   # engine / plain loop, per round
STARTUP_MAX_S = 3.0       # start-up to round 1, default engine
TWO_WORKERS_MIN = 1.7     # throughput of 2 worker processes over 1
MEMORY_FLAT_SLOPE = 0.1   # log-log slope of peak memory vs registered clients below which it counts as flat


def _ratio_best(c: Doc, num: str, den: str, field: str = "per_round_s") -> float | None:
    """Ratio of the best (smallest) per-round times over the repeats: 'best of n'."""
    a, b = c.get(f"{num}.{field}"), c.get(f"{den}.{field}")
    if not a or not b or a.get("min") is None or not b.get("min"):
        return None
    return a["min"] / b["min"]


def _verdict(value: float | None, target: float, below: bool = True) -> str:
    if value is None:
        return WORDS.text("not_measured")
    return WORDS.text("met" if (value <= target if below else value >= target) else "not_met")


def _cfg(doc: Doc | None, workers: int) -> Doc | None:
    if doc is None:
        return None
    return next((c for c in doc["configs"] if c["workers"] == workers), None)


def _engine_vs_plain(label: str, c: Doc | None, p: Doc | None) -> tuple[list[str], str | None]:
    """The row and summary line of 'engine / plain loop' on one workload."""
    target, goal = T.text("plain_target", label=label), T.text("plain_goal", goal=f(ENGINE_PLAIN_MAX))
    if c is None or "inprocess/plain" not in c:
        return [target, goal, WORDS.text("not_measured"), "", "", ""], None
    best = _ratio_best(c, "inprocess", "plain")
    best_cpu = _ratio_best(c, "inprocess", "plain", "cpu_per_round_s")
    ray = rng(c.get("flower/plain"), 2) if "flower/plain" in c else f(None)
    pfl = (T.text("pfl_cell", ratio=rng(p["pfl/plain"], 2), version=p.get("pfl_version")) if p
           else WORDS.text("not_measured"))
    n, verdict = c["inprocess/plain"]["n"], _verdict(best, ENGINE_PLAIN_MAX)
    cell = T.text("plain_cell", n=n, best=f(best, 3), best_cpu=f(best_cpu, 3), median=rng(c["inprocess/plain"], 3),
                  median_cpu=rng(c["inprocess/plain cpu"], 3))
    line = T.text("plain_line", label=label, best=f(best, 3), best_cpu=f(best_cpu, 3), n=n,
                  median=rng(c["inprocess/plain"], 3), ray=ray, pfl=pfl, goal=f(ENGINE_PLAIN_MAX), verdict=verdict)
    return [target, goal, cell, ray, pfl, verdict], line


def _startup(startup: Doc) -> tuple[list[str], str]:
    summ, repeats = startup["summary"], startup["args"]["repeats"]
    parts, worst = [], None  # the default engine (engine-workers = 1) decides the verdict; the others are listed
    for key, v in summ.items():
        if not key.split()[-1].startswith("inprocess"):
            continue
        st = v["startup_from_start_s"]
        parts.append(T.text("startup_part", key=key, start=f(st["min"], 2),
                            start_cpu=f(v["cpu_startup_from_start_s"]["min"], 2), imports=f(v["imports_s"]["min"], 2),
                            call=f(v["startup_from_call_s"]["min"], 2)))
        if key.split()[-1] == "inprocess:1":
            worst = max(worst or 0.0, st["min"])
    ray = "; ".join(T.text("startup_ray_part", key=k, start=f(v["startup_from_start_s"]["min"], 1),
                           call=f(v["startup_from_call_s"]["min"], 1))
                    for k, v in summ.items() if k.split()[-1].startswith("ray"))
    verdict, goal = _verdict(worst, STARTUP_MAX_S), f(STARTUP_MAX_S, 0)
    row = [T.text("startup_target"), T.text("startup_goal", goal=goal),
           T.text("startup_cell", parts="; ".join(parts), repeats=repeats), ray or f(None), T.text("startup_issue"),
           verdict]
    return row, T.text("startup_line", repeats=repeats, parts="; ".join(parts), goal=goal, verdict=verdict)


def _memory(scale: Doc) -> tuple[list[str], str] | None:
    tr = scale.get("growth", {}).get("memory_train_rounds.tree_mib")
    if not tr:
        return None
    runs = {r["clients"]: r for r in scale["runs"]}
    ns = ", ".join(map(str, sorted(runs)))
    peaks = ", ".join(f(runs[n]["memory_train_rounds"]["tree_mib"], 0) for n in sorted(runs))
    flat = tr["loglog_slope"] < MEMORY_FLAT_SLOPE
    slope, kib = f(tr["loglog_slope"], 3), f(tr["mib_per_client"] * 1024, 1)
    row = [T.text("memory_target", clients=ns), T.text("memory_goal"),
           T.text("memory_cell", peaks=peaks, slope=slope, kib=kib), T.text("memory_ray"), "",
           WORDS.text("met" if flat else "not_met")]
    return row, T.text("memory_line", clients=ns, peaks=peaks, slope=slope, kib=kib,
                       flat=T.text("flat" if flat else "not_flat"))


def _two_workers(c1: Doc, c2: Doc) -> tuple[list[str], str]:
    med = c1["inprocess.per_round_s"]["median"] / c2["inprocess.per_round_s"]["median"]
    best = c1["inprocess.per_round_s"]["min"] / c2["inprocess.per_round_s"]["min"]
    ray = (T.text("workers_ray", ratio=f(c1["flower.per_round_s"]["median"] / c2["flower.per_round_s"]["median"], 2))
           if "flower.per_round_s" in c2 else f(None))
    n, verdict, goal = c2["inprocess/plain"]["n"], _verdict(best, TWO_WORKERS_MIN, below=False), f(TWO_WORKERS_MIN, 1)
    row = [T.text("workers_target"), T.text("workers_goal", goal=goal),
           T.text("workers_cell", best=f(best, 2), n=n, median=f(med, 2)), ray, "", verdict]
    return row, T.text("workers_line", best=f(best, 2), n=n, median=f(med, 2), ray=ray, goal=goal, verdict=verdict)


def engine_targets(ov: Doc | None, ovs: Doc | None, pfl: dict[str, Doc | None], startup: Doc | None,
                   scale: Doc | None) -> tuple[list[list[str]], list[str]]:
    """Rows of the issue-17 target table and one summary line per target."""
    rows, lines = [], []
    for label, doc, key in ((T.text("label_mnist"), ov, "mnist-5k"), (T.text("label_digits"), ovs, "digits")):
        row, line = _engine_vs_plain(label, _cfg(doc, 1), pfl.get(key))
        rows.append(row)
        lines += [line] if line is not None else []
    found = [_startup(startup) if startup is not None else None, _memory(scale) if scale is not None else None]
    c1, c2 = _cfg(ov, 1), _cfg(ov, 2)
    if c1 and c2 and "inprocess.per_round_s" in c1 and "inprocess.per_round_s" in c2:
        found.append(_two_workers(c1, c2))
    for row_line in filter(None, found):
        rows.append(row_line[0])
        lines.append(row_line[1])
    return rows, lines


def section_engine(ov: Doc | None, ovs: Doc | None, pfl: dict[str, Doc | None], startup: Doc | None,
                   scale: Doc | None, profile: Doc | None, instructions: Doc | None = None,
                   floor: Doc | None = None, sweeps: tuple[Doc | None, Doc | None] = (None, None)) -> list[str]:
    out = T.lines("intro") + T.table("targets", engine_targets(ov, ovs, pfl, startup, scale)[0])
    for key, p in pfl.items():
        if p is None:
            out += T.lines("pfl_not_measured", dataset=key)
            continue
        out += T.lines("pfl", version=p.get("pfl_version"), dataset=key, rounds=p["args"]["rounds"],
                       repeats=p["args"]["repeats"], torch=p.get("pfl_torch"), machine=machine_line(p),
                       plain=rng(p["plain.per_round_s"], 4), pfl=rng(p["pfl.per_round_s"], 4),
                       ratio=rng(p["pfl/plain"], 3), ratio_cpu=rng(p["pfl/plain cpu"], 3))
    if startup is not None:
        out += T.table("startup", [[key, rng(v["startup_from_start_s"], 2), rng(v["cpu_startup_from_start_s"], 2),
                                    rng(v["startup_from_call_s"], 2), rng(v["cpu_startup_from_call_s"], 2),
                                    rng(v["imports_s"], 2)] for key, v in startup["summary"].items()],
                       machine=machine_line(startup), repeats=startup["args"]["repeats"])
    if sweeps[1] is not None:
        out += _sweep(*sweeps)
    if profile is not None:
        out += _profile(profile, _cfg(ov, 1), _cfg(ovs, 1), floor)
    if instructions is not None:
        out += _instructions(instructions)
    return out + T.lines("gpu")


def summary_lines(floor: Doc | None, sweep: Doc | None, sweep_before: Doc | None = None) -> list[str]:
    """Summary lines for the digits floor (bench_client_floor) and a sweep in one process (bench_sweep)."""
    out = []
    if floor:
        best = floor["best_ratio_to_plain"]
        real, minimal = best["real ClientApp"], best["minimal ClientApp"]
        out.append(T.text("floor_line", minimal=f(minimal, 3), real=f(real, 3), repeats=floor["args"]["repeats"],
                          features=f(real - minimal, 2)))
    if sweep:
        b = sweep_before or {}
        out.append(T.text("sweep_line", runs=sweep["args"]["runs"], ratio=f(sweep["last3_over_first3"], 3),
                          builds=sweep["max_model_builds_after_first"], growth=f"{sweep['rss_growth_mib_per_run']:+.2f}",
                          before_ratio=f(b.get("last3_over_first3"), 3), before_builds=b.get("max_model_builds_after_first", "?"),
                          before_growth=f"{b['rss_growth_mib_per_run']:+.2f}" if b else "?"))
    return out


def _sweep(before: Doc | None, now: Doc) -> list[str]:
    """Runs of a sweep in one process (bench_sweep): the last runs against the first, before the fixes and now."""
    a = now["args"]
    rows = [[label, f(d["first3_cpu_per_round_s"] * 1e3, 2) + " ms", f(d["last3_cpu_per_round_s"] * 1e3, 2) + " ms",
             f(d["last3_over_first3"], 3), str(d["max_model_builds_after_first"]), f"{d['rss_growth_mib_per_run']:+.2f} MiB"]
            for label, d in ((T.text("sweep_before"), before), (T.text("sweep_now"), now)) if d is not None]
    return T.table("sweep", rows, dataset=a["dataset"], clients=a["clients"], rounds=a["rounds"], runs=a["runs"],
                   last_runs=f"{a['runs'] - 2}-{a['runs']}", machine=machine_line(now))


def _instructions(doc: Doc) -> list[str]:
    """Instructions per round, engine vs plain loop (bench_instructions: callgrind, independent of load)."""
    a = doc["args"]
    rows = [[f"{row['extra_per_round'] / 1e6:+.2f}", row["function"].replace("|", "/")] for row in doc["top_extra"]]
    return T.table("instructions", rows, dataset=a["dataset"], clients=a["clients"], rounds=a["rounds"],
                   written=doc.get("written", "?"), plain=f(doc["plain_per_round"] / 1e6, 1),
                   engine=f(doc["inprocess_per_round"] / 1e6, 1), ratio=f(doc["ratio"], 3))


def _profile(profile: Doc, mnist: Doc | None, digits: Doc | None, floor: Doc | None = None) -> list[str]:
    """Where the engine's remaining overhead goes (bench_engine_profile), read against the digits plain round."""
    a, share = profile["args"], profile["profile_share_of_run"]
    out = T.table("profile", [[k.replace("  ", "&nbsp;&nbsp;"), f"{v * 100:.1f}%"] for k, v in share.items()],
                  dataset=a["dataset"], rounds=a["rounds"], machine=machine_line(profile),
                  plain_ms=f(min(profile["plain_cpu_per_round_s"]) * 1e3, 2),
                  engine_ms=f(min(profile["engine_cpu_per_round_s"]) * 1e3, 2),
                  overhead_ms=f(profile["overhead_cpu_per_round_s"] * 1e3, 2),
                  per_client_us=f(profile["overhead_per_client_us"], 0))
    server = sum(v for k, v in share.items() if k.startswith(("server: collect", "method lookup", "server: messages")))
    plain_ms = digits["plain.cpu_per_round_s"]["median"] * 1e3 if digits else None
    copies = sum(share.get(k, 0) for k in ("boundary copies (engine)", "parameters -> records (both sides)",
                                           "records -> parameters (both sides)"))
    mnist_ratio = (T.text("profile_mnist", ratio=f(mnist["plain.cpu_per_round_s"]["median"]
                                                   / digits["plain.cpu_per_round_s"]["median"], 0))
                   if mnist and digits else "")
    flower = sum(v for k, v in share.items() if k.startswith("Flower: "))
    real = profile.get("real")
    if real:
        i, j = (min(range(len(real[f"{v}_cpu_per_round_s"])), key=real[f"{v}_cpu_per_round_s"].__getitem__)
                for v in ("plain", "engine"))
        p_all, p_train = real["plain_cpu_per_round_s"][i], real["plain_train_per_round_s"][i]
        e_all, e_train = real["engine_cpu_per_round_s"][j], real["engine_train_per_round_s"][j]
        out += T.lines("profile_real", repeats=len(real["plain_cpu_per_round_s"]), plain=f(p_all * 1e3, 2),
                       plain_train=f(p_train * 1e3, 2), engine=f(e_all * 1e3, 2), engine_train=f(e_train * 1e3, 2),
                       ratio=f(e_all / p_all, 3), rest_plain=f((p_all - p_train) * 1e3, 2),
                       rest_engine=f((e_all - e_train) * 1e3, 2), stub=f(profile["overhead_cpu_per_round_s"] * 1e3, 2),
                       train_extra=f((e_train - p_train) * 1e3, 2))
        client_real, client_stub = real.get("engine_client_side_per_round_s"), profile.get(
            "engine_client_side_stubbed_per_round_s")
        if client_real and client_stub:
            out += T.lines("profile_cold", real=f(min(client_real) * 1e3, 2), stub=f(min(client_stub) * 1e3, 2),
                           factor=f(min(client_real) / min(client_stub), 2))
        steps = profile.get("steps_us_per_call")
        if steps:
            rows = [[label, f(steps["stubbed"][label], 1), f(us, 1), f(us / steps["stubbed"][label], 2) + "x"]
                    for label, us in steps["real"].items() if label in steps["stubbed"]]
            out += T.table("profile_steps", rows, rounds=a["rounds"])
    if floor:
        fa, best, paired = floor["args"], floor["best_ratio_to_plain"], floor["paired_ratio_to_plain"]
        cpu = {k: f(min(v) * 1e3, 2) for k, v in floor["cpu_per_round_s"].items()}
        out += T.lines("profile_floor", dataset=fa["dataset"], rounds=fa["rounds"], repeats=fa["repeats"],
                       machine=machine_line(floor), identical="yes" if floor["identical_accuracy"] else "NO",
                       plain=cpu["plain"], real=cpu["real ClientApp"], minimal=cpu["minimal ClientApp"],
                       real_best=f(best["real ClientApp"], 3), minimal_best=f(best["minimal ClientApp"], 3),
                       real_median=rng(paired["real ClientApp"], 3), minimal_median=rng(paired["minimal ClientApp"], 3))
    probe = profile.get("cold_probe_us")
    if probe:
        out += T.table("profile_probe", [[label, f(us, 1)] for label, us in probe.items()],
                       calls=profile.get("cold_probe_calls", "?"))
    return out + T.lines("profile_reading", plain_ms=f(plain_ms, 1),
                         overhead_ms=f(profile["overhead_cpu_per_round_s"] * 1e3, 1), goal=f(ENGINE_PLAIN_MAX),
                         allowed_ms=f(0.10 * plain_ms, 1) if plain_ms else f(None),  # 0.10: ENGINE_PLAIN_MAX - 1
                         server=f(server * 100, 0), flower=f(flower * 100, 0), copies=f(copies * 100, 0),
                         mnist=mnist_ratio)
