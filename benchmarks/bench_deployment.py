"""Wall time per round: real deployment (SuperLink + SuperNodes as processes on loopback, `flwr run`)
vs single-box simulation, for the same run config, measured in one invocation.

    nice -n 10 python -m benchmarks.bench_deployment                 # simulation, stock, tuned
    python -m benchmarks.bench_deployment --rounds 3 --nodes 3 --modes sim,stock,tuned -c "method='fedbc'"
    python -m benchmarks.bench_deployment --modes tuned --poll 0.1 --profile-dir /tmp/prof   # where it goes

Modes:
    sim     experiments.simulate on the run config's engine (the in-process engine by default;
            ``-c "engine='ray'"`` for Flower's Ray simulation)
    stock   flower-superlink / flower-supernode as shipped (deploy/superlink.sh, deploy/supernode.sh)
    tuned   the same with TUNED=1: ClientApps/ServerApp forked from a warm interpreter, ``--poll`` s polls
            (deploy/tuned.py)

Per round = results.json ``wall_time_s`` (train exchange + server-side evaluation + federated evaluation
on every client, as configured). Round 1 is reported separately: in deployment it also pays for the FAB
install and the first imports. The final G-FL accuracy is printed for each mode: the runs are seeded, so
the modes must agree (the deployment runs the very same ServerApp and ClientApp).

Where the time of a tuned round goes: the tuned SuperExecs log every task process they fork with its wall
and CPU time (``flwr-clientapp (pid N) exited 0 after X s wall, Y s CPU``); the script prints their median
and count per round. With ``--profile-dir`` every forked task process also writes a cProfile file there
(deploy/tuned.py's FLWR_TUNED_PROFILE_DIR), and the script splits a ClientApp task's time into the
project's handler, imports, and Flower's own work (FAB, message pull/push, object store).
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import parser  # noqa: E402
from deploy.localfed import LocalFederation, _parse_overrides, snapshot_app  # noqa: E402

# the job the recorded results ran (deployment*.txt): the run-config defaults of that time are pinned (issue 19
# later changed lr, momentum, weight-decay and local-test-fraction, which federated evaluation needs)
BASE = {"method": "fedavg", "dataset": "digits", "partition": "dirichlet", "seed": 0,
        "federated-eval-every": 1, "round-timeout": 300.0, "checkpoint": False,
        "local-test-fraction": 0.25, "lr": 0.05, "momentum": 0.0, "weight-decay": 0.0}


def summarize(doc: dict[str, Any], total_s: float) -> dict[str, Any]:
    rounds = [float(r["wall_time_s"]) for r in doc["rounds"]]
    later = rounds[1:] or rounds
    return {"first": rounds[0], "mean": statistics.mean(later), "min": min(later), "total": total_s,
            "acc": float(doc["final"]["global_accuracy"]), "failures": sum(len(r["failures"]) for r in doc["rounds"])}


def run_sim(cfg: dict[str, Any], nodes: int) -> dict[str, Any]:
    from experiments.simulate import simulate

    t0 = time.time()
    doc = simulate(cfg, num_supernodes=nodes, cpus_per_client=1.0, engine="ray")
    return summarize(doc, time.time() - t0)


TASK_LINE = re.compile(r"(flwr-clientapp|flwr-serverapp) \(pid (\d+)\) exited (\S+) after ([\d.]+)s wall, ([\d.]+)s CPU")


def task_times(logs: Path) -> dict[str, Any]:
    """Wall / CPU of every task process the tuned SuperExecs forked (from their log lines)."""
    client = []
    for path in logs.glob("*.log"):
        for m in TASK_LINE.finditer(path.read_text(errors="replace")):
            if m.group(1) == "flwr-clientapp":
                client.append((float(m.group(4)), float(m.group(5))))
    if not client:
        return {}
    return {"clientapp_tasks": len(client), "clientapp_wall_median_s": statistics.median(w for w, _ in client),
            "clientapp_cpu_median_s": statistics.median(c for _, c in client)}


PROFILE_PARTS = (("handler (this project's ClientApp)", ("client_app/app.py",)),
                 ("imports", ("<frozen importlib._bootstrap>",)),
                 ("FAB install + app loading", ("flwr/cli/install.py", "flwr/clientapp/utils.py")),
                 ("message pull/push + object store", ("flwr/supercore/inflatable/", "flwr/supercore/runtime/",
                                                       "httpx/", "httpcore/")))


def profile_split(profile_dir: Path) -> dict[str, float]:
    """Median share of a ClientApp task process's profiled time spent in each part (inclusive times of the
    outermost calls into each part; the rest is process set-up, heartbeats and waiting)."""
    import pstats

    shares: dict[str, list[float]] = {label: [] for label, _ in PROFILE_PARTS}
    totals = []
    for prof in profile_dir.glob("flwr-clientapp-*.prof"):
        stats = pstats.Stats(str(prof)).stats
        total = max(v[3] for v in stats.values())
        totals.append(total)
        for label, frags in PROFILE_PARTS:
            part = sum(v[3] for (path, _, _), v in stats.items() if any(fr in path for fr in frags)
                       and not any(any(fr in c[0] for fr in frags) for c in v[4]))
            shares[label].append(part / total if total else 0.0)
    if not totals:
        return {}
    out = {label: statistics.median(v) for label, v in shares.items()}
    out["profiled task seconds (median)"] = statistics.median(totals)
    out["profiled tasks"] = len(totals)
    return out


COLD = r"""
import json, time
c = time.process_time
t0 = c(); import flwr.supernode.runtime.run_clientapp  # noqa: E401
t1 = c(); import client_app.app  # noqa: F401
t2 = c(); import torch._dynamo  # noqa: F401
t3 = c()
print(json.dumps({"flwr_clientapp_runtime_s": t1 - t0, "project_clientapp_with_torch_s": t2 - t1,
                  "torch_dynamo_first_optimizer_s": t3 - t2}))
"""


def cold_start_costs(repeats: int = 3) -> dict[str, float]:
    """CPU seconds a fresh (stock) ClientApp process spends importing, best of ``repeats`` fresh interpreters:
    Flower's ClientApp runtime, this project's ClientApp (torch, Flower's app API, the project), and
    ``torch._dynamo``, which the first optimizer step of a train message imports."""
    import json
    import subprocess

    runs = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True, check=True,
                             cwd=str(Path(__file__).resolve().parents[1]))
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {k: min(r[k] for r in runs) for k in runs[0]}


def run_deploy(cfg: dict[str, Any], nodes: int, tuned: bool, workdir: Path, poll: float,
               database: bool = True) -> dict[str, Any]:
    t0 = time.time()
    with LocalFederation(workdir, nodes, tuned=tuned, poll=poll, app_dir=snapshot_app(workdir / "app"),
                         database=database) as fed:
        fed.wait_connected()
        res = fed.run(cfg, timeout=3600)
    if res.doc is None or not res.status.startswith("finished:completed"):
        raise RuntimeError(f"deployment run ended {res.status}; see {workdir}/logs\n{res.output[-3000:]}")
    out = summarize(res.doc, time.time() - t0)
    out.update(task_times(workdir / "logs"))
    return out


def main() -> None:
    ap = parser(__doc__, summary=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--modes", default="sim,stock,tuned")
    ap.add_argument("-c", "--run-config", default="", help="extra run-config overrides (TOML pairs)")
    ap.add_argument("--poll", type=float, default=0.5, help="tuned mode's poll interval, seconds (default 0.5)")
    ap.add_argument("--profile-dir", default="", help="tuned mode: cProfile every forked task process here")
    ap.add_argument("--superlink-state", choices=("sqlite", "memory"), default="sqlite",
                        help="the SuperLink's state: an SQLite file (DATABASE of deploy/superlink.sh, as documented for "
                             "production: runs and registered node keys survive a restart; the default here) or "
                             "Flower's in-memory state")
    ns = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if ns.profile_dir:
        Path(ns.profile_dir).mkdir(parents=True, exist_ok=True)
        os.environ["FLWR_TUNED_PROFILE_DIR"] = str(Path(ns.profile_dir).resolve())
    modes = [m.strip() for m in ns.modes.split(",") if m.strip()]
    unknown = set(modes) - {"sim", "stock", "tuned"}
    if unknown:
        ap.error(f"unknown mode(s) {sorted(unknown)}; choose from sim, stock, tuned")
    root = Path(tempfile.mkdtemp(prefix="bench-deploy-"))
    extra = _parse_overrides(ns.run_config)
    rows: dict[str, dict[str, Any]] = {}
    load0 = os.getloadavg()[0]
    for mode in modes:
        cfg = {**BASE, "num-server-rounds": ns.rounds, **extra, "out-dir": str(root / mode / "out")}
        print(f"... {mode}", flush=True)
        if mode == "sim":
            rows[mode] = run_sim(cfg, ns.nodes)
        else:
            rows[mode] = run_deploy(cfg, ns.nodes, mode == "tuned", root / mode, ns.poll,
                                    database=ns.superlink_state == "sqlite")
    cfg = {**BASE, "num-server-rounds": ns.rounds, **extra}
    print(f"\nconfig: {cfg['method']} on {cfg['dataset']} ({cfg['partition']}), {ns.nodes} clients, "
          f"{ns.rounds} rounds, federated-eval-every={cfg['federated-eval-every']}; "
          f"SuperLink state {ns.superlink_state}; {os.cpu_count()} CPUs, load average {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")
    print(f"{'mode':<8} {'round s (2..R)':>15} {'min':>7} {'round 1 s':>10} {'total s':>9} {'final acc':>10} {'failures':>9}")
    for mode, r in rows.items():
        print(f"{mode:<8} {r['mean']:>15.1f} {r['min']:>7.1f} {r['first']:>10.1f} {r['total']:>9.1f} "
              f"{r['acc']:>10.4f} {r['failures']:>9d}")
    for mode, r in rows.items():
        if r.get("clientapp_tasks"):
            print(f"{mode}: {r['clientapp_tasks']} ClientApp task processes, median {r['clientapp_wall_median_s']:.2f}s "
                  f"wall, {r['clientapp_cpu_median_s']:.2f}s CPU each (poll {ns.poll}s)")
    if "stock" in rows:
        cold = cold_start_costs()
        print("stock: a fresh ClientApp process imports (CPU s, best of 3): "
              + ", ".join(f"{k.replace('_s', '').replace('_', ' ')} {v:.2f}" for k, v in cold.items()))
    if ns.profile_dir:
        for label, share in profile_split(Path(ns.profile_dir)).items():
            print(f"profile: {label}: " + (f"{share * 100:.0f}%" if label[0] != "p" else f"{share:.2f}"))
    base = rows.get("sim")
    for mode in ("stock", "tuned"):
        if mode in rows and base:
            print(f"ratio {mode}/sim per round: {rows[mode]['mean'] / base['mean']:.1f}x")
    if "stock" in rows and "tuned" in rows:
        print(f"ratio tuned/stock per round: {rows['tuned']['mean'] / rows['stock']['mean']:.2f}x")
    print(f"(work dir {root})")


if __name__ == "__main__":
    main()
