"""The fleet tables of docs/SCALING.md, generated from benchmarks/results/fleet*.json (bench_fleet's files).

SCALING.md is written by hand except for the blocks between ``<!-- fleet-tables:KIND:FILE -->`` and
``<!-- /fleet-tables -->``, which this module rewrites from benchmarks/results/FILE.json:

    python -m benchmarks.fleet_tables            # rewrites the blocks in docs/SCALING.md
    python -m benchmarks.fleet_tables --print    # prints the rewritten doc instead

Kinds: ``tuned`` (a TUNED=1 run: one row per fleet size), ``stock`` (a TUNED=0 run), ``insecure``
(``insecure:SECURE:PLAIN``: the SuperLink's CPU for the same sizes with and without TLS + node auth),
``stragglers`` (a run's straggler runs) and ``projection`` (a run's per-node fits and what they give at
the projected size).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import load_result, parser  # noqa: E402
from flcore.stack import describe  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "SCALING.md"


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


def _secs(xs: list[float]) -> str:
    return ", ".join(f"{x:.1f}" for x in xs)


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _load_span(doc: dict[str, Any]) -> str:
    loads = [v for f in doc["fleets"] for v in (f.get("loadavg_before"), f.get("loadavg_after")) if v is not None]
    return f"{min(loads):.1f}-{max(loads):.1f}" if loads else "not recorded"


def _not_measured(f: dict[str, Any]) -> str:
    return f"not measured: {f.get('skipped') or f.get('aborted')}"


def _fleet_rows(doc: dict[str, Any], header: list[str], cells) -> list[list[Any]]:  # noqa: ANN001
    """One row per fleet: ``cells(fleet, idle, job, idle memory, job memory)``, or 'not measured' for a fleet
    whose job did not run."""
    rows = []
    for f in doc["fleets"]:
        if "job" not in f:
            rows.append([f["nodes"], _not_measured(f)] + [""] * (len(header) - 2))
            continue
        idle, job = f["idle"], f["job"]
        rows.append(cells(f, idle, job, idle["memory"], job["memory"]))
    return rows


def tuned(doc: dict[str, Any]) -> list[str]:
    """One row per fleet size of a TUNED=1 run: start-up, round times, memory of every role, CPU."""
    header = ["SuperNodes", "connected after", "round 1, 2, 3 (s)", "SuperLink RSS at rest / peak (MiB)",
              "ServerApp RSS / USS (MiB)", "node at rest RSS / USS (MiB)", "node peak RSS / USS (MiB)",
              "all nodes' USS at peak (GiB)", "SuperLink CPU idle (s/s) / job (s)", "nodes' idle CPU (s/s)",
              "load before / after"]

    def cells(f: dict[str, Any], idle: dict[str, Any], job: dict[str, Any], im: dict[str, Any],
              jm: dict[str, Any]) -> list[Any]:
        return [f["nodes"], f"{f['connected_s']:.0f} s", _secs(job["round_s"]),
                f"{_mib(im['superlink_rss_mean'])} / {_mib(jm['superlink_rss_peak'])}",
                f"{_mib(jm['serverapp_rss_peak'])} / {_mib(jm['serverapp_uss_peak'])}",
                f"{_mib(im['node_base_rss_mean'])} / {_mib(im['node_base_uss_mean'])}",
                f"{_mib(jm['node_total_rss_peak_max'])} / {_mib(jm['node_total_uss_peak_max'])}",
                f"{jm['fleet_total_uss_peak'] / 1024:.1f}",
                f"{idle['superlink_cpu_per_s']:.3f} / {job['superlink_cpu_s']:.1f}",
                f"{idle['nodes_cpu_per_s']:.2f}", f"{f['loadavg_before']:.1f} / {f['loadavg_after']:.1f}"]
    return [f"*{doc['written']}, `{doc['benchmark']}.json`, {', '.join(map(str, doc['args']['nodes']))} nodes "
            f"asked, load average {_load_span(doc)}; {describe(doc.get('stack'))}.*", "", *_table(header, _fleet_rows(doc, header, cells))]


def stock(doc: dict[str, Any]) -> list[str]:
    """One row per fleet size of a stock (TUNED=0) run: a cold ClientApp process per message."""
    rounds = doc["args"]["rounds"]
    header = ["SuperNodes", f"round {', '.join(str(r + 1) for r in range(rounds))} (s)",
              "SuperLink RSS at rest / peak (MiB)", "ServerApp RSS / USS (MiB)", "node at rest RSS / USS (MiB)",
              "one ClientApp RSS / USS (MiB)", "SuperLink CPU idle (s/s) / job (s)"]

    def cells(f: dict[str, Any], idle: dict[str, Any], job: dict[str, Any], im: dict[str, Any],
              jm: dict[str, Any]) -> list[Any]:
        return [f["nodes"], _secs(job["round_s"]),
                f"{_mib(im['superlink_rss_mean'])} / {_mib(jm['superlink_rss_peak'])}",
                f"{_mib(jm['serverapp_rss_peak'])} / {_mib(jm['serverapp_uss_peak'])}",
                f"{_mib(im['node_base_rss_mean'])} / {_mib(im['node_base_uss_mean'])}",
                f"{_mib(jm['clientapp_rss_peak'])} / {_mib(jm['clientapp_uss_peak'])}",
                f"{idle['superlink_cpu_per_s']:.3f} / {job['superlink_cpu_s']:.1f}"]
    return [f"*{doc['written']}, `{doc['benchmark']}.json`, load average {_load_span(doc)}; {describe(doc.get('stack'))}.*", "",
            *_table(header, _fleet_rows(doc, header, cells))]


def idle(doc: dict[str, Any]) -> list[str]:
    """One row per fleet size of an ``--idle-only`` run: the fleet connected and polling, no job."""
    header = ["SuperNodes", "connected after", "idle sampled", "SuperLink RSS / USS (MiB)", "node RSS / USS (MiB)",
              "all nodes' PSS (GiB)", "SuperLink CPU (s/s)", "nodes' CPU (s/s)", "load before / after"]
    rows = []
    for f in doc["fleets"]:
        if "idle" not in f:
            rows.append([f["nodes"], _not_measured(f)] + [""] * (len(header) - 2))
            continue
        i, m = f["idle"], f["idle"]["memory"]
        rows.append([f["nodes"], f"{f['connected_s']:.0f} s", f"{i['seconds']:.0f} s",
                f"{_mib(m['superlink_rss_mean'])} / {_mib(m['superlink_uss_peak'])}",
                f"{_mib(m['node_base_rss_mean'])} / {_mib(m['node_base_uss_mean'])}",
                     f"{m['fleet_total_pss_peak'] / 1024:.1f}", f"{i['superlink_cpu_per_s']:.3f}",
                     f"{i['nodes_cpu_per_s']:.2f}", f"{f['loadavg_before']:.1f} / {f['loadavg_after']:.1f}"])
    security = "plain HTTP, no node auth" if doc["args"]["insecure"] else "TLS + node auth"
    poll = doc["fleets"][0]["poll_s"]
    return [f"*{doc['written']}, `{doc['benchmark']}.json`, {doc['args']['mode']} nodes ({poll:g}-s polls), "
            f"{security}, load average {_load_span(doc)}; {describe(doc.get('stack'))}.*", "", *_table(header, rows)]


def insecure(secure: dict[str, Any], plain: dict[str, Any]) -> list[str]:
    """The SuperLink's CPU for the same job with and without TLS + node auth, per fleet size in both files."""
    by_n = {f["nodes"]: f for f in plain["fleets"] if "job" in f}
    rows = []
    for f in secure["fleets"]:
        g = by_n.get(f["nodes"])
        if "job" not in f or g is None:
            continue
        rows.append([f["nodes"], f"{f['job']['superlink_cpu_s']:.1f}", f"{g['job']['superlink_cpu_s']:.1f}",
                     f"{f['idle']['superlink_cpu_per_s']:.3f}", f"{g['idle']['superlink_cpu_per_s']:.3f}"])
    header = ["SuperNodes", "SuperLink CPU per job, TLS + auth (s)", "without (s)",
              "SuperLink idle CPU, TLS + auth (s/s)", "without (s/s)"]
    return [f"*`{secure['benchmark']}.json` ({secure['written']}) against `{plain['benchmark']}.json` "
            f"({plain['written']}, load average {_load_span(plain)}; {describe(secure.get('stack'))}).*", "", *_table(header, rows)]


def stragglers(doc: dict[str, Any]) -> list[str]:
    """The straggler runs: freeze length against round-timeout, round times, updates and failures."""
    rows = []
    for f in doc["fleets"]:
        for s in f.get("stragglers", []):
            fails = sorted({(cid, phase, kind) for r in s["failures"] for cid, phase, kind in r})
            where = [i + 1 for i, r in enumerate(s["failures"]) if r]
            failed = ("none" if not fails else
                      f"clients {', '.join(str(c) for c in sorted({c for c, _, _ in fails}))}: "
                      f"{', '.join(sorted({f'`{p}` `{k}`' for _, p, k in fails}))} in rounds "
                      f"{', '.join(map(str, where))}")
            side = "<" if s["delay_s"] < s["round_timeout_s"] else ">"
            rows.append([f"{f['nodes']} nodes, {len(s['stragglers'])} frozen {s['delay_s']:g} s "
                         f"({side} round-timeout {s['round_timeout_s']:g} s)", f"{s['round_s'][0]:.1f} s",
                         ", ".join(f"{x:.1f} s" for x in s["round_s"][1:]),
                         ", ".join(map(str, s["num_updates"])), failed])
    if not rows:
        return [f"*No straggler runs in `{doc['benchmark']}.json`.*"]
    header = ["run", "round 1 (no freeze)", "later rounds", "updates per round", "failures recorded"]
    return [f"*`{doc['benchmark']}.json` ({doc['written']}), min-train-replies = nodes - frozen, no federated "
            f"evaluation; {describe(doc.get('stack'))}.*", "", *_table(header, rows)]


PROJECTION_LINES = (
    ("superlink_rss_idle_mib", "SuperLink RSS at rest (MiB)", 1.0),
    ("superlink_rss_peak_mib", "SuperLink RSS, job peak (MiB)", 1.0),
    ("serverapp_rss_peak_mib", "ServerApp RSS, job peak (MiB)", 1.0),
    ("serverapp_uss_peak_mib", "ServerApp USS (private), job peak (MiB)", 1.0),
    ("superlink_idle_cpu_per_s", "SuperLink idle CPU (ms/s), 0.5-s polls", 1e3),
)


def projection(doc: dict[str, Any]) -> list[str]:
    """The linear fits (fixed + per node x N) over the measured sizes and their value at the projected N."""
    p = doc.get("projection")
    if p is None:
        return [f"*No projection in `{doc['benchmark']}.json` (fewer than 2 fleet sizes measured).*"]
    n = p["projection_nodes"]
    rows = []
    for key, label, scale in PROJECTION_LINES:
        if key not in p["lines"]:  # an --idle-only run has the idle fits only
            continue
        line = p["lines"][key]
        if key == "superlink_idle_cpu_per_s":
            label = label.replace("0.5-s", f"{p['poll_s']:g}-s")
        rows.append([label, ", ".join(f"{v * scale:,.1f}" for v in line["values"]), f"{line['fixed'] * scale:,.1f}",
                     f"{line['per_node'] * scale:.3g}", f"{line['at_projection'] * scale:,.0f}"])
    per_msg = p.get("superlink_cpu_per_message_ms")
    at = p["at_projection"]
    out = _table(["quantity", f"measured at {', '.join(map(str, p['nodes']))} nodes", "fixed", "per node",
                  f"at {n:,} nodes"], rows)
    idle_at = ", ".join(f"{at[k]:.2f} s/s with {k.rsplit('_', 1)[1][:-1]}-s polls" for k in sorted(at)
                        if k.startswith("idle_superlink_cpu_per_s_poll_"))
    out += ["", f"- SuperLink CPU per request (idle fit / (1/{p['poll_s']:g} s polls + 1/{p['heartbeat_s']:g} s "
                f"heartbeats) per node): {p['superlink_cpu_per_request_ms']:.2f} ms; idle SuperLink CPU at {n:,} "
                f"nodes: {idle_at}."]
    if "superlink_cpu_per_message_ms_upper_bound" not in p:
        return [f"*`{doc['benchmark']}.json` ({doc['written']}), fits over {', '.join(map(str, p['nodes']))} "
                "nodes, idle fleets only.*", "", *out]
    out += [f"- SuperLink CPU per message: at most {p['superlink_cpu_per_message_ms_upper_bound']:.0f} ms (job CPU "
            f"above idle, per-node slope / messages per node)"
            + (f"; {min(per_msg):.0f}-{max(per_msg):.0f} ms per fleet size after taking off the "
               f"{p['job_overhead_cpu_per_s']:.3f} CPU s/s a job costs without messages" if per_msg else "")
            + f"; at {n:,} nodes a round of 2 messages per node: at most "
              f"{at['superlink_cpu_s_per_round_upper_bound']:.0f} s of SuperLink CPU"
            + (f", {2 * n * min(per_msg) / 1e3:.0f}-{2 * n * max(per_msg) / 1e3:.0f} s with the correction"
               if per_msg else "") + ".",
            f"- A node's own CPU per round (training, evaluation, polls; one box shared by all): "
            f"{', '.join(f'{v:.2f}' for v in p['node_cpu_s_per_round_each'])} s at "
            f"{', '.join(map(str, p['nodes']))} nodes."]
    return [f"*`{doc['benchmark']}.json` ({doc['written']}), fits over {', '.join(map(str, p['nodes']))} "
            "nodes.*", "", *out]


def _need(name: str) -> dict[str, Any]:
    doc = load_result(name)
    if doc is None:
        raise ValueError(f"benchmarks/results/{name}.json is missing: run benchmarks.bench_fleet (docs/SCALING.md "
                         "section 3 has the commands)")
    return doc


# kind -> (number of result files it reads, renderer)
KINDS: dict[str, tuple[int, Callable[..., list[str]]]] = {
    "tuned": (1, tuned), "stock": (1, stock), "idle": (1, idle), "insecure": (2, insecure),
    "stragglers": (1, stragglers),
    "projection": (1, projection),
}
MARK = re.compile(r"(<!-- fleet-tables:([a-z]+):([\w:]+) -->\n).*?(<!-- /fleet-tables -->)", re.S)


def render(kind: str, names: list[str], load: Callable[[str], dict[str, Any]] = _need) -> list[str]:
    """One block: ``kind`` over the result files ``names`` (benchmarks/results/<name>.json)."""
    if kind not in KINDS:
        raise ValueError(f"unknown fleet table '{kind}' (known: {', '.join(KINDS)})")
    if len(names) != KINDS[kind][0]:
        raise ValueError(f"fleet table '{kind}' reads {KINDS[kind][0]} result file(s), the marker names {names}")
    return KINDS[kind][1](*(load(n) for n in names))


def rewrite(text: str, load: Callable[[str], dict[str, Any]] = _need) -> str:
    """Rewrite the body of every ``<!-- fleet-tables:KIND:FILE[:FILE] -->`` ... ``<!-- /fleet-tables -->``
    block of ``text`` from the named result files."""
    return MARK.sub(lambda m: m.group(1) + "\n".join(render(m.group(2), m.group(3).split(":"), load)) + "\n"
                    + m.group(4), text)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--print", action="store_true", help="print the rewritten doc instead of writing it")
    ap.add_argument("--doc", type=Path, default=DOC)
    args = ap.parse_args()
    text = args.doc.read_text()
    blocks = MARK.findall(text)
    if not blocks:
        raise SystemExit(f"no '<!-- fleet-tables:KIND:FILE -->' block in {args.doc}")
    new = rewrite(text)
    if args.print:
        print(new)
        return
    args.doc.write_text(new)
    print(f"rewrote {len(blocks)} block(s) in {args.doc}: {', '.join(b[1] + ':' + b[2] for b in blocks)}")


if __name__ == "__main__":
    main()
