"""Wall time per round: real deployment (SuperLink + SuperNodes as processes on loopback, `flwr run`)
vs Flower's simulation engine, for the same run config, measured in one invocation.

    nice -n 10 python -m benchmarks.bench_deployment                 # simulation, stock, tuned
    python -m benchmarks.bench_deployment --rounds 3 --nodes 3 --modes sim,stock,tuned -c "method='fedbc'"

Modes:
    sim     experiments.simulate (Ray actors: one warm Python process per virtual client)
    stock   flower-superlink / flower-supernode as shipped (deploy/superlink.sh, deploy/supernode.sh)
    tuned   the same with TUNED=1: ClientApps/ServerApp forked from a warm interpreter, 0.5 s polls
            (deploy/tuned.py)

Per round = results.json ``wall_time_s`` (train exchange + server-side evaluation + federated evaluation
on every client, as configured). Round 1 is reported separately: in deployment it also pays for the FAB
install and the first imports. The final G-FL accuracy is printed for each mode: the runs are seeded, so
the modes must agree (the deployment runs the very same ServerApp and ClientApp).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from deploy.localfed import LocalFederation, _parse_overrides, snapshot_app  # noqa: E402

BASE = {"method": "fedavg", "dataset": "digits", "partition": "dirichlet", "seed": 0,
        "federated-eval-every": 1, "round-timeout": 300.0, "checkpoint": False}


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


def run_deploy(cfg: dict[str, Any], nodes: int, tuned: bool, workdir: Path) -> dict[str, Any]:
    t0 = time.time()
    with LocalFederation(workdir, nodes, tuned=tuned, app_dir=snapshot_app(workdir / "app")) as fed:
        fed.wait_connected()
        res = fed.run(cfg, timeout=3600)
    if res.doc is None or not res.status.startswith("finished:completed"):
        raise RuntimeError(f"deployment run ended {res.status}; see {workdir}/logs\n{res.output[-3000:]}")
    return summarize(res.doc, time.time() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--modes", default="sim,stock,tuned")
    parser.add_argument("-c", "--run-config", default="", help="extra run-config overrides (TOML pairs)")
    ns = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    modes = [m.strip() for m in ns.modes.split(",") if m.strip()]
    unknown = set(modes) - {"sim", "stock", "tuned"}
    if unknown:
        parser.error(f"unknown mode(s) {sorted(unknown)}; choose from sim, stock, tuned")
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
            rows[mode] = run_deploy(cfg, ns.nodes, mode == "tuned", root / mode)
    cfg = {**BASE, "num-server-rounds": ns.rounds, **extra}
    print(f"\nconfig: {cfg['method']} on {cfg['dataset']} ({cfg['partition']}), {ns.nodes} clients, "
          f"{ns.rounds} rounds, federated-eval-every={cfg['federated-eval-every']}; "
          f"{os.cpu_count()} CPUs, load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'mode':<8} {'round s (2..R)':>15} {'min':>7} {'round 1 s':>10} {'total s':>9} {'final acc':>10} {'failures':>9}")
    for mode, r in rows.items():
        print(f"{mode:<8} {r['mean']:>15.1f} {r['min']:>7.1f} {r['first']:>10.1f} {r['total']:>9.1f} "
              f"{r['acc']:>10.4f} {r['failures']:>9d}")
    base = rows.get("sim")
    for mode in ("stock", "tuned"):
        if mode in rows and base:
            print(f"ratio {mode}/sim per round: {rows[mode]['mean'] / base['mean']:.1f}x")
    if "stock" in rows and "tuned" in rows:
        print(f"ratio tuned/stock per round: {rows['tuned']['mean'] / rows['stock']['mean']:.2f}x")
    print(f"(work dir {root})")


if __name__ == "__main__":
    main()
