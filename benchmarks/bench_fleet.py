"""Fleets of SuperNodes on loopback: round time, SuperLink memory, per-node memory, stragglers.

For each fleet size N a real federation is started with deploy/localfed.py (the operator's scripts
deploy/superlink.sh and deploy/supernode.sh): TLS, SuperNode authentication (every node's key registered
with `flwr supernode register`; ``--insecure`` drops both for comparison), one SuperLink and N SuperNodes as
separate process groups on 127.0.0.1.
The smallest job runs on it (FedAvg, digits, logistic model, iid, every node trains and evaluates every
round). A sampler reads /proc every second: RSS and PSS of the SuperLink process, of the ServerApp, and of
every node's process group (SuperNode + SuperExec at rest, plus the ClientApp while one runs), and the
CPU time of the SuperLink process. Reported per N: time to connect, idle SuperLink CPU per second (N
nodes polling), per-round wall time (results.json), SuperLink CPU per round and per message, memory at
rest and peaks. Linear fits over N give the per-node costs behind the 1,000-node projection in
docs/SCALING.md.

Stragglers (``--stragglers S`` at ``--straggler-nodes N``): S nodes are frozen (SIGSTOP of their process
group, SIGCONT after D seconds) as soon as they receive a train message in rounds 2..R, i.e. they answer
D seconds late. Two runs with round-timeout T and min-train-replies N - S: D < T (the round waits for them)
and D > T (the round closes at T with N - S updates; the late ones are recorded as timeouts).

``--idle-only`` measures each fleet connected and polling, without a job (what a machine too small for the
job's ClientApps can still hold). The machine is shared: a fleet waits up to ``--memory-wait-s`` for the
memory it needs (``--node-mib`` per node plus ``--min-available-mib``), is skipped if it never comes, and
is killed if available memory falls below ``--min-available-mib`` while it runs (recorded in the file,
with a PSS trace of where the memory went). docs/SCALING.md's tables: ``python -m benchmarks.fleet_tables``.

    nice -n 10 python -m benchmarks.bench_fleet [--nodes 3 10 30] [--rounds 3] [--mode tuned|stock]
        [--stragglers 2 --straggler-nodes 10 --round-timeout 20 --delays 12 30] [--idle-only] [--name fleet]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.harness import loadavg, machine, parser, write_result  # noqa: E402
from benchmarks.procfs import (cmdline, cpu_seconds, group_and_descendants, memory_mib,  # noqa: E402
                              mem_available_mib, process_groups)
from benchmarks.stats import per_client_increment  # noqa: E402
from deploy.localfed import LocalFederation, snapshot_app  # noqa: E402

# every key the numbers depend on is explicit (the common defaults changed in issue 19: a local test split is
# needed for the federated evaluation; lr, momentum and weight decay as when the first fleets were measured)
JOB = {"method": "fedavg", "dataset": "digits", "model": "mlp", "partition": "iid", "seed": 0,
       "federated-eval-every": 1, "local-test-fraction": 0.25, "lr": 0.05, "momentum": 0.0, "weight-decay": 0.0,
       "round-timeout": 600.0, "checkpoint": False}


_SUPEREXEC = re.compile(r"flower-superexec|tuned\.py\s.*\ssuperexec(\s|$)")


def roles(members: list[tuple[int, int]], leader: int) -> dict[str, list[int]]:
    """Split one process group: the leader (SuperLink / SuperNode), the SuperExec (TUNED=1: deploy/tuned.py
    superexec; the task processes it forks keep its command line, so a SuperExec is one whose parent is
    not one), and the app processes (ServerApp / ClientApp)."""
    cmds = {pid: cmdline(pid) for pid, _ in members}
    execs = {pid for pid, ppid in members if pid != leader and _SUPEREXEC.search(cmds[pid])
             and not _SUPEREXEC.search(cmds.get(ppid, ""))}
    out: dict[str, list[int]] = {"leader": [], "superexec": [], "app": []}
    for pid, _ in members:
        out["leader" if pid == leader else "superexec" if pid in execs else "app"].append(pid)
    return out


def wait_gone(pgids: list[int], timeout: float = 60.0) -> float:
    """Wait until no process of these process groups (or their descendants) is left; seconds waited. The
    next fleet's memory check must not count a stopped fleet's exiting processes."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        groups = process_groups()
        if not any(group_and_descendants(groups, g) for g in pgids):
            break
        time.sleep(0.5)
    return time.time() - t0


def wait_for_memory(need_mib: float, timeout: float) -> float:
    """Wait up to ``timeout`` s for ``need_mib`` of available memory (other jobs on the shared machine come
    and go); seconds waited."""
    t0 = time.time()
    while mem_available_mib() < need_mib and time.time() - t0 < timeout:
        time.sleep(5.0)
    return time.time() - t0


class FleetSampler(threading.Thread):
    """Every ``interval`` s: RSS/PSS/USS per role of the SuperLink group and of every node group, CPU time
    of the SuperLink process and of the whole fleet. If the machine's available memory falls below
    ``min_available_mib`` it calls ``on_low_memory`` once (the fleet is killed: the machine is shared)."""

    def __init__(self, link_pgid: int, node_pgids: dict[int, int], interval: float = 1.0,
                 min_available_mib: float = 0.0, on_low_memory: Any = None) -> None:
        super().__init__(daemon=True)
        self.link_pgid, self.node_pgids, self.interval = link_pgid, node_pgids, interval
        self.min_available_mib, self.on_low_memory = min_available_mib, on_low_memory
        self.low_memory: float | None = None
        self.samples: list[dict[str, Any]] = []
        self._stop_event = threading.Event()

    def sample(self) -> dict[str, Any]:
        groups = process_groups()

        def mem(pids: list[int]) -> tuple[float, float, float]:
            per = [memory_mib(p) for p in pids]
            return tuple(sum(m[k] for m in per) for k in range(3))  # type: ignore[return-value]

        link_members = group_and_descendants(groups, self.link_pgid)
        link = roles(link_members, self.link_pgid)
        row: dict[str, Any] = {"t": time.time(), "superlink_cpu_s": cpu_seconds(self.link_pgid, children=False),
                               "link_group_cpu_s": sum(cpu_seconds(p) for p, _ in link_members)}
        for role, key in (("leader", "superlink"), ("superexec", "link_superexec"), ("app", "serverapp")):
            row[key] = mem(link[role])
        nodes, fleet_cpu = {}, 0.0
        for i, pgid in self.node_pgids.items():
            members = group_and_descendants(groups, pgid)
            parts = roles(members, pgid)
            base = mem(parts["leader"] + parts["superexec"])
            app = mem(parts["app"])
            nodes[i] = {"base": base, "app": app, "apps": len(parts["app"])}
            fleet_cpu += sum(cpu_seconds(p) for p, _ in members)
        row["nodes"], row["nodes_cpu_s"] = nodes, fleet_cpu
        row["mem_available_mib"] = mem_available_mib()
        if row["mem_available_mib"] < self.min_available_mib and self.low_memory is None:
            self.low_memory = row["mem_available_mib"]
            if self.on_low_memory is not None:
                self.on_low_memory()
        return row

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.samples.append(self.sample())
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def window(self, t0: float, t1: float) -> list[dict[str, Any]]:
        return [s for s in self.samples if t0 <= s["t"] <= t1]


def _cpu_rate(rows: list[dict[str, Any]], key: str) -> float | None:
    if len(rows) < 2 or rows[-1]["t"] <= rows[0]["t"]:
        return None
    return (rows[-1][key] - rows[0][key]) / (rows[-1]["t"] - rows[0]["t"])


def memory_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Peaks and means (MiB) over a window: SuperLink, ServerApp, per node (base = SuperNode + SuperExec,
    total = base + ClientApp), and the largest single node's ClientApp."""
    if not rows:
        return {}
    out: dict[str, Any] = {}
    for key in ("superlink", "link_superexec", "serverapp"):
        for kind, idx in (("rss", 0), ("pss", 1), ("uss", 2)):
            out[f"{key}_{kind}_peak"] = max(r[key][idx] for r in rows)
    out["superlink_rss_mean"] = statistics.mean(r["superlink"][0] for r in rows)
    ids = list(rows[0]["nodes"])
    for kind, idx in (("rss", 0), ("pss", 1), ("uss", 2)):
        base = [statistics.mean(r["nodes"][i]["base"][idx] for r in rows) for i in ids]
        peak = [max(r["nodes"][i]["base"][idx] + r["nodes"][i]["app"][idx] for r in rows) for i in ids]
        out[f"node_base_{kind}_mean"] = statistics.mean(base)
        out[f"node_base_{kind}_max"] = max(base)
        out[f"node_total_{kind}_peak_mean"] = statistics.mean(peak)
        out[f"node_total_{kind}_peak_max"] = max(peak)
        out[f"fleet_total_{kind}_peak"] = max(sum(r["nodes"][i]["base"][idx] + r["nodes"][i]["app"][idx]
                                                  for i in ids) for r in rows)
    for kind, idx in (("rss", 0), ("uss", 2)):
        out[f"clientapp_{kind}_peak"] = max((r["nodes"][i]["app"][idx] for r in rows for i in ids
                                             if r["nodes"][i]["apps"] == 1), default=None)
    out["max_concurrent_clientapps"] = max(sum(r["nodes"][i]["apps"] for i in ids) for r in rows)
    return out


def memory_trace(rows: list[dict[str, Any]], t0: float, every: float = 5.0) -> list[list[float]]:
    """[seconds since the fleet's start, machine's available memory, fleet PSS (all nodes), SuperLink-side
    PSS (SuperLink + its SuperExec + ServerApp)] in MiB, one sample per ``every`` s: where the memory went.
    PSS, not USS: a forked ClientApp shares its SuperExec's pages until it writes them, and a shared page
    is in neither's USS (a node's USS falls while its forks start), while PSS sums to the memory used."""
    out: list[list[float]] = []
    for r in rows:
        if not out or r["t"] - t0 >= out[-1][0] + every:
            fleet = sum(v["base"][1] + v["app"][1] for v in r["nodes"].values())
            link = r["superlink"][1] + r["link_superexec"][1] + r["serverapp"][1]
            out.append([round(r["t"] - t0, 1), round(r["mem_available_mib"]), round(fleet), round(link)])
    return out


# ------------------------------------------------------------------------------------- stragglers
class Freezer(threading.Thread):
    """SIGSTOP a straggler node's process group when its log shows a new train message (after the first
    ``skip`` of them), SIGCONT it ``delay`` s later. Every frozen group is resumed by :meth:`stop`."""

    def __init__(self, fed: LocalFederation, nodes: list[int], delay: float, skip: int = 1) -> None:
        super().__init__(daemon=True)
        self.fed, self.nodes, self.delay, self.skip = fed, nodes, delay, skip
        self.seen = {i: self._count(i) for i in nodes}
        self.frozen: dict[int, dict[str, Any]] = {}  # node -> its open freeze event
        self.events: list[dict[str, Any]] = []
        self._stop_event = threading.Event()

    def _count(self, i: int) -> int:
        return self.fed.nodes[i].log.read_text(errors="replace").count("Receiving: train message")

    def run(self) -> None:
        start = dict(self.seen)
        while not self._stop_event.is_set():
            now = time.time()
            for i in self.nodes:
                if i in self.frozen:
                    if now >= self.frozen[i]["stopped"] + self.delay:
                        self.fed.nodes[i].signal_group(signal.SIGCONT)
                        self.frozen.pop(i)["resumed"] = time.time()
                    continue
                n = self._count(i)
                if n > self.seen[i]:
                    self.seen[i] = n
                    if n - start[i] > self.skip:
                        self.fed.nodes[i].signal_group(signal.SIGSTOP)
                        self.frozen[i] = {"node": i, "train_message": n - start[i], "stopped": time.time()}
                        self.events.append(self.frozen[i])
            self._stop_event.wait(0.02)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        for i in list(self.frozen):
            self.fed.nodes[i].signal_group(signal.SIGCONT)
            self.frozen.pop(i)["resumed"] = time.time()


# ------------------------------------------------------------------------------------- one fleet
def run_job(fed: LocalFederation, cfg: dict[str, Any], name: str, sampler: FleetSampler) -> dict[str, Any]:
    t0 = time.time()
    res = fed.run(cfg, timeout=7200, name=name)
    t1 = time.time()
    if res.doc is None or not res.status.startswith("finished:completed"):
        raise RuntimeError(f"{name}: run ended {res.status}; logs in {fed.logs}\n{res.output[-3000:]}")
    rows = res.doc["rounds"]
    window = sampler.window(t0, t1)
    return {"wall_s": t1 - t0, "round_s": [float(r["wall_time_s"]) for r in rows],
            "num_updates": [r["num_updates"] for r in rows],
            "failures": [[(f["cid"], f["phase"], f["kind"]) for f in r["failures"]] for r in rows],
            "final_accuracy": float(res.doc["final"]["global_accuracy"]),
            "superlink_cpu_s": window[-1]["superlink_cpu_s"] - window[0]["superlink_cpu_s"] if window else None,
            "link_group_cpu_s": window[-1]["link_group_cpu_s"] - window[0]["link_group_cpu_s"] if window else None,
            "nodes_cpu_s": window[-1]["nodes_cpu_s"] - window[0]["nodes_cpu_s"] if window else None,
            "memory": memory_summary(window), "t0": t0, "t1": t1}


def print_idle(n: int, args: argparse.Namespace, out: dict[str, Any]) -> None:
    """One line for an ``--idle-only`` fleet."""
    im = out["idle"]["memory"]
    print(f"[N={n:3d} {args.mode}, idle only] connected in {out['connected_s']:.0f}s | idle SuperLink "
          f"{out['idle']['superlink_cpu_per_s']:.3f} CPU s/s, nodes {out['idle']['nodes_cpu_per_s']:.2f} | "
          f"RSS MiB: SuperLink {im['superlink_rss_mean']:.0f}, node at rest {im['node_base_rss_mean']:.0f} "
          f"(USS {im['node_base_uss_mean']:.0f}), all nodes' USS {im['fleet_total_uss_peak']:.0f} | "
          f"load {os.getloadavg()[0]:.1f}", flush=True)


def measure_job(fed: LocalFederation, n: int, args: argparse.Namespace, sampler: FleetSampler, work: Path,
                out: dict[str, Any]) -> None:
    """The job (every node trains and evaluates every round) and, at ``--straggler-nodes``, the straggler
    runs, on a connected fleet; results into ``out``."""
    cfg = {**JOB, "num-server-rounds": args.rounds, "min-train-nodes": n, "out-dir": str(work / "out")}
    job = run_job(fed, cfg, "job", sampler)
    messages = n * (1 + 2 * args.rounds)  # registration query + train + evaluate per round
    job["messages"] = messages
    job["superlink_cpu_ms_per_message"] = 1e3 * job["superlink_cpu_s"] / messages
    # what the messages cost the SuperLink beyond its idle load (nodes polling, heartbeats) over the job
    job["superlink_cpu_above_idle_s"] = job["superlink_cpu_s"] - out["idle"]["superlink_cpu_per_s"] * job["wall_s"]
    job["superlink_cpu_above_idle_ms_per_message"] = 1e3 * job["superlink_cpu_above_idle_s"] / messages
    out["job"] = job
    print(f"[N={n:3d} {args.mode}] connected in {out['connected_s']:.0f}s | idle SuperLink "
          f"{out['idle']['superlink_cpu_per_s']:.3f} CPU s/s | rounds {['%.1f' % s for s in job['round_s']]} s | "
          f"SuperLink CPU {job['superlink_cpu_s']:.1f}s ({job['superlink_cpu_ms_per_message']:.1f} ms/msg) | "
          f"RSS MiB: SuperLink peak {job['memory']['superlink_rss_peak']:.0f}, ServerApp "
          f"{job['memory']['serverapp_rss_peak']:.0f}, node at rest {out['idle']['memory']['node_base_rss_mean']:.0f} "
          f"(USS {out['idle']['memory']['node_base_uss_mean']:.0f}), node peak "
          f"{job['memory']['node_total_rss_peak_max']:.0f} (USS {job['memory']['node_total_uss_peak_max']:.0f}) | "
          f"acc {job['final_accuracy']:.3f} | "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    if args.stragglers and n == args.straggler_nodes:
        out["stragglers"] = [straggler_run(fed, n, args, delay, sampler, work) for delay in args.delays]


def one_fleet(n: int, args: argparse.Namespace, root: Path, node_mib: float) -> dict[str, Any]:
    """Start a fleet of ``n`` SuperNodes, measure idle, one job and (optionally) stragglers, stop it.
    ``node_mib``: expected memory per node (USS) at its peak (at rest with ``--idle-only``), to refuse a
    fleet this machine cannot hold."""
    work = root / f"n{n}"
    out: dict[str, Any] = {"nodes": n, "mode": args.mode, "tls_and_node_auth": not args.insecure,
                           "poll_s": args.poll if args.mode == "tuned" else 3.0, "idle_only": args.idle_only,
                           "loadavg_before": os.getloadavg()[0], "mem_available_before_mib": mem_available_mib()}
    need = n * node_mib + args.min_available_mib
    waited = wait_for_memory(need, args.memory_wait_s)
    out["memory_wait_s"], out["mem_available_before_mib"] = waited, mem_available_mib()
    out["loadavg_before"] = os.getloadavg()[0]
    if out["mem_available_before_mib"] < need:
        out["skipped"] = (f"needs ~{need / 1024:.1f} GiB ({n} x {node_mib:.0f} MiB per node + "
                          f"{args.min_available_mib:.0f} MiB kept free), {out['mem_available_before_mib'] / 1024:.1f} "
                          f"GiB available after waiting {waited:.0f} s")
        print(f"[N={n:3d}] skipped: {out['skipped']}", flush=True)
        return out
    t_start = time.time()
    secure = not args.insecure
    fed = LocalFederation(work, n, tls=secure, node_auth=secure, tuned=args.mode == "tuned", poll=args.poll,
                          app_dir=snapshot_app(work / "app"), startup_timeout=max(120.0, 15.0 * n))

    def kill_fleet() -> None:
        for proc in [fed.superlink, *fed.nodes.values()]:
            if proc is not None:
                proc.signal_group(signal.SIGKILL)

    sampler: FleetSampler | None = None
    try:
        fed.start()
        out["started_s"] = time.time() - t_start  # PKI, SuperLink, N key registrations, N SuperNodes launched
        sampler = FleetSampler(fed.superlink.popen.pid, {i: p.popen.pid for i, p in fed.nodes.items()},
                               min_available_mib=args.min_available_mib, on_low_memory=kill_fleet)
        sampler.start()
        fed.wait_connected(timeout=max(120.0, 15.0 * n))
        out["connected_s"] = time.time() - t_start
        time.sleep(args.idle_s)
        idle = sampler.window(time.time() - args.idle_s, time.time())
        out["idle"] = {"seconds": idle[-1]["t"] - idle[0]["t"], "superlink_cpu_per_s": _cpu_rate(idle, "superlink_cpu_s"),
                       "nodes_cpu_per_s": _cpu_rate(idle, "nodes_cpu_s"), "memory": memory_summary(idle)}
        if args.idle_only:
            print_idle(n, args, out)
        else:
            measure_job(fed, n, args, sampler, work, out)
    except Exception as exc:  # noqa: BLE001 - a fleet killed for memory is recorded, anything else raised
        if sampler is None or sampler.low_memory is None:
            raise
        out["aborted"] = (f"killed: available memory fell to {sampler.low_memory:.0f} MiB "
                          f"(< {args.min_available_mib:.0f}) ({type(exc).__name__})")
        print(f"[N={n:3d}] {out['aborted']}", flush=True)
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        fed.stop()
        out["teardown_s"] = wait_gone([p.popen.pid for p in [fed.superlink, *fed.nodes.values()] if p is not None])
    if sampler is not None and sampler.samples:
        out["mem_available_min_mib"] = min(r["mem_available_mib"] for r in sampler.samples)
        out["memory_trace"] = memory_trace(sampler.samples, t_start)
    out["loadavg_after"] = os.getloadavg()[0]
    return out


def straggler_run(fed: LocalFederation, n: int, args: argparse.Namespace, delay: float, sampler: FleetSampler,
                  work: Path) -> dict[str, Any]:
    slow = list(range(n - args.stragglers, n))
    cfg = {**JOB, "num-server-rounds": args.rounds, "min-train-nodes": n, "federated-eval-every": 0,
           "round-timeout": args.round_timeout, "min-train-replies": n - args.stragglers,
           "out-dir": str(work / f"straggle-{delay:g}")}
    freezer = Freezer(fed, slow, delay, skip=1)
    freezer.start()
    try:
        job = run_job(fed, cfg, f"straggle-{delay:g}", sampler)
    finally:
        freezer.stop()
    job.update({"delay_s": delay, "round_timeout_s": args.round_timeout, "stragglers": slow,
                "min_train_replies": n - args.stragglers, "freezes": freezer.events})
    # SuperLink CPU while the ServerApp waits for frozen stragglers only (from 10 s after a freeze, when the
    # other nodes have answered, until the freeze ends): idle load plus the ServerApp's reply polls and the
    # streamed log, without message traffic
    rates = []
    for e in freezer.events:
        rows = sampler.window(e["stopped"] + 10.0, e.get("resumed", e["stopped"] + delay) - 1.0)
        if len(rows) >= 5 and (rate := _cpu_rate(rows, "superlink_cpu_s")) is not None:
            rates.append(rate)
    job["superlink_cpu_per_s_while_waiting"] = statistics.median(rates) if rates else None
    print(f"[N={n:3d} stragglers {slow}, frozen {delay:g}s, round-timeout {args.round_timeout:g}s] rounds "
          f"{['%.1f' % s for s in job['round_s']]} s, updates {job['num_updates']}, failures {job['failures']}",
          flush=True)
    time.sleep(max(0.0, delay - args.round_timeout) + 5.0)  # let late replies land before the next run
    return job


HEARTBEAT_S = 24.0  # a SuperNode heartbeats every 0.8 x 30 s (flwr.common.constant, HEARTBEAT_*)


def _line(ns: list[int], ys: list[float]) -> tuple[float, float]:
    """Least-squares (fixed, per-node) of y = fixed + per_node x N."""
    slope = per_client_increment(ns, ys)
    return statistics.mean(ys) - slope * statistics.mean(ns), slope


def projection(fleets: list[dict[str, Any]], rounds: int, project: int) -> dict[str, Any]:
    """Per-node costs fitted over the measured fleet sizes, and what they give at ``project`` nodes.

    Model (docs/SCALING.md): the SuperLink's idle CPU is requests x CPU per request, every node sending
    1/poll polls + 1/24 heartbeats per second; a message costs the SuperLink a fixed CPU time beyond that
    (pull by the node, push of the reply, the ServerApp's push and pull); SuperLink and ServerApp memory
    grow linearly in N. Nodes run on their own machines, so their cost per node does not add up there."""
    ns = [f["nodes"] for f in fleets]
    poll = fleets[0]["poll_s"]
    jobs = all("job" in f for f in fleets)  # False for --idle-only fleets: the idle fits only
    out: dict[str, Any] = {"nodes": ns, "projection_nodes": project, "poll_s": poll, "heartbeat_s": HEARTBEAT_S}
    series = {
        "superlink_idle_cpu_per_s": [f["idle"]["superlink_cpu_per_s"] for f in fleets],
        "superlink_rss_idle_mib": [f["idle"]["memory"]["superlink_rss_mean"] for f in fleets],
    }
    if jobs:
        series.update({
            "superlink_cpu_above_idle_s": [f["job"]["superlink_cpu_above_idle_s"] for f in fleets],
            "superlink_rss_peak_mib": [f["job"]["memory"]["superlink_rss_peak"] for f in fleets],
            "serverapp_rss_peak_mib": [f["job"]["memory"]["serverapp_rss_peak"] for f in fleets],
            "serverapp_uss_peak_mib": [f["job"]["memory"]["serverapp_uss_peak"] for f in fleets],
        })
    lines = {}
    for key, ys in series.items():
        fixed, per_node = _line(ns, ys)
        lines[key] = {"values": ys, "fixed": fixed, "per_node": per_node, "at_projection": fixed + per_node * project}
    out["lines"] = lines
    req_per_node_s = 1.0 / poll + 1.0 / HEARTBEAT_S
    cpu_per_request_ms = 1e3 * lines["superlink_idle_cpu_per_s"]["per_node"] / req_per_node_s
    out["superlink_cpu_per_request_ms"] = cpu_per_request_ms
    out["at_projection"] = {
        f"idle_superlink_cpu_per_s_poll_{p:g}s": project * (1.0 / p + 1.0 / HEARTBEAT_S) * cpu_per_request_ms / 1e3
        for p in sorted({poll, 3.0})}
    out["at_projection"]["superlink_rss_idle_mib"] = lines["superlink_rss_idle_mib"]["at_projection"]
    out["node_rss_base_mib"] = [f["idle"]["memory"]["node_base_rss_mean"] for f in fleets]
    out["node_uss_base_mib"] = [f["idle"]["memory"]["node_base_uss_mean"] for f in fleets]
    if not jobs:
        return out
    # Upper bound: besides the messages, the job's SuperLink CPU includes the ServerApp's reply polls and the
    # streamed log, which grow with the job's wall time - and on one shared box that grows with N as well.
    messages_per_node = 1 + 2 * rounds  # registration + train + evaluate per round
    cpu_per_message_ms = 1e3 * lines["superlink_cpu_above_idle_s"]["per_node"] / messages_per_node
    out["superlink_cpu_per_message_ms_upper_bound"] = cpu_per_message_ms
    # Refined: take off what a job costs the SuperLink per second without messages (measured while the
    # ServerApp waited for frozen stragglers), then divide by the messages.
    waiting = [s["superlink_cpu_per_s_while_waiting"] for f in fleets for s in f.get("stragglers", [])
               if s.get("superlink_cpu_per_s_while_waiting") is not None]
    strag = [f for f in fleets if f.get("stragglers")]
    if waiting and strag:
        extra = statistics.median(waiting) - strag[0]["idle"]["superlink_cpu_per_s"]  # above idle, per second
        per_msg = [(f["job"]["superlink_cpu_above_idle_s"] - extra * f["job"]["wall_s"]) / f["job"]["messages"]
                   for f in fleets]
        out["job_overhead_cpu_per_s"] = extra
        out["superlink_cpu_per_message_ms"] = [1e3 * v for v in per_msg]
    out["at_projection"]["superlink_cpu_s_per_round_upper_bound"] = 2 * project * cpu_per_message_ms / 1e3
    out["at_projection"]["superlink_rss_mib"] = lines["superlink_rss_peak_mib"]["at_projection"]
    out["at_projection"]["serverapp_rss_mib"] = lines["serverapp_rss_peak_mib"]["at_projection"]
    per_node = [f["job"]["nodes_cpu_s"] / f["nodes"] / (1 + rounds) for f in fleets]
    out["node_cpu_s_per_round_each"] = per_node  # a node's own CPU per round (incl. its share of registration)
    out["node_rss_peak_mib"] = [f["job"]["memory"]["node_total_rss_peak_max"] for f in fleets]
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--nodes", type=int, nargs="+", default=[3, 10, 30])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mode", choices=("tuned", "stock"), default="tuned")
    ap.add_argument("--poll", type=float, default=0.5, help="TUNED=1 poll interval of SuperNodes/SuperExecs (s)")
    ap.add_argument("--idle-s", type=float, default=20.0, help="seconds of idle sampling before the job")
    ap.add_argument("--stragglers", type=int, default=0, help="number of slow nodes (0 = no straggler runs)")
    ap.add_argument("--straggler-nodes", type=int, default=10, help="fleet size of the straggler runs")
    ap.add_argument("--round-timeout", type=float, default=20.0, help="round-timeout of the straggler runs (s)")
    ap.add_argument("--delays", type=float, nargs="+", default=[12.0, 30.0], help="straggler freeze lengths (s)")
    ap.add_argument("--project", type=int, default=1000, help="fleet size of the linear projection")
    ap.add_argument("--min-available-mib", type=float, default=3000.0,
                    help="keep this much memory free on the (shared) machine: a fleet that would not fit is "
                         "skipped, one that drives available memory below it is killed and recorded")
    ap.add_argument("--memory-wait-s", type=float, default=600.0,
                    help="wait up to this long for the memory a fleet needs before skipping it")
    ap.add_argument("--idle-only", action="store_true",
                    help="measure each fleet connected and idle only (no job, no stragglers): SuperLink CPU and "
                         "memory at rest, node memory at rest")
    ap.add_argument("--node-mib", type=float, default=700.0,
                    help="expected memory (USS) per node before one was measured (TUNED=1 preloads torch)")
    ap.add_argument("--insecure", action="store_true",
                    help="plain HTTP, no node authentication (to see what TLS + node auth cost the SuperLink)")
    ap.add_argument("--name", default="fleet")
    args = ap.parse_args()
    # `kill <pid>` (SIGTERM) unwinds like Ctrl-C, so every fleet is stopped by its finally block
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.idle_s < 10:
        ap.error("--idle-s must be >= 10 (the idle CPU rate needs several 1-s samples)")
    if args.stragglers and args.idle_only:
        ap.error("--stragglers needs a job: drop --idle-only")
    if args.stragglers and args.stragglers >= args.straggler_nodes:
        ap.error("--stragglers must be smaller than --straggler-nodes")
    if any(d > 32 for d in args.delays):
        # a SuperNode heartbeats every ~24 s and is expired 60 s after its last one: a longer freeze would
        # turn the straggler into a lost node
        ap.error("--delays must be <= 32 s (longer freezes make the SuperLink expire the node)")
    started = machine()
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    fleets: list[dict[str, Any]] = []
    node_mib = args.node_mib
    for n in sorted(set(args.nodes)):
        fleets.append(one_fleet(n, args, root, node_mib))
        if "job" in fleets[-1]:  # what the nodes of the last measured fleet really took
            node_mib = max(args.node_mib, fleets[-1]["job"]["memory"]["node_total_uss_peak_max"])
        elif "idle" in fleets[-1] and args.idle_only:
            node_mib = max(args.node_mib, fleets[-1]["idle"]["memory"]["node_base_uss_max"])
    payload = {"machine": started, "args": vars(args), "job": JOB, "fleets": fleets,
               "loadavg_at_end": loadavg()}
    measured = [f for f in fleets if ("idle" if args.idle_only else "job") in f]
    if len(measured) >= 2:
        proj = payload["projection"] = projection(measured, args.rounds, args.project)
        for key, v in proj["lines"].items():
            print(f"fit {key}: {v['fixed']:.4g} + {v['per_node']:.4g} x N -> {v['at_projection']:.4g} at "
                  f"N={args.project}")
        print(f"SuperLink CPU per request {proj['superlink_cpu_per_request_ms']:.2f} ms, per message "
              f"<= {proj.get('superlink_cpu_per_message_ms_upper_bound', float('nan')):.1f} ms; at N={args.project}: "
              f"{proj['at_projection']}")
    print(f"wrote {write_result(args.name, payload)} (work dir {root})")


if __name__ == "__main__":
    main()
