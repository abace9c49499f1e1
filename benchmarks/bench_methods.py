"""Method costs relative to FedAvg: per-round time (wall and CPU) and message bytes, same workload.

Every method runs through the project's real round driver, strategies and ClientApp with messages
delivered in this process (engines/grid.py: no Ray, so no start-up or scheduling noise; the
messages are still pickled like the simulation engine does). Per repeat, FedAvg runs first and every
method's figures are divided by that repeat's FedAvg figures. Per method: mean per-round time over
rounds 2..R (rounds differ for methods with stages, e.g. FedUFO's UAD stage one and CGR stage two),
bytes sent/received per round, and per message phase (FedUFO: train.prior, then train.posterior with
the relayed priors). Methods that fail to build or run are reported as missing with the error.

FedRANE (GNE/LRA) is measured by benchmarks/bench_gne.py.

    python -m benchmarks.bench_methods [--methods fedavg fedufo ...] [--repeats 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import traceback

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from benchmarks.harness import machine, parser, run_inprocess, write_result  # noqa: E402
from benchmarks.stats import summary  # noqa: E402

DEFAULT_METHODS = ("fedavg", "fedprox", "scaffold", "moon", "fedufo", "fedbr", "fedbc", "fedbc-finetune", "per-fedbc",
                   "fedetf", "fedgmv")


def workload(method: str, rounds: int, clients: int, out_dir: str, dataset: str) -> dict:
    return {"method": method, "dataset": dataset, "partition": "dirichlet", "num-server-rounds": rounds,
            "fraction-train": 0.5, "local-epochs": 1, "batch-size": 32, "seed": 0, "federated-eval-every": 0,
            "out-dir": out_dir}


def run_method(method: str, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_methods_") as tmp:
        res = run_inprocess(workload(method, args.rounds, args.clients, tmp, args.dataset), args.clients)
    ends, cpu = res["round_ends"], res["round_end_cpu"]
    wall_iv = [b - a for a, b in zip(ends, ends[1:])]
    cpu_iv = [b - a for a, b in zip(cpu, cpu[1:])]
    rows = res["doc"]["rounds"][1:]
    phases: dict[str, dict] = {}
    for e in res["exchanges"]:
        if e["round"] < 2:
            continue
        p = phases.setdefault(e["phase"], {"messages": 0, "bytes_sent": 0, "bytes_received": 0, "seconds": 0.0})
        for k in ("messages", "bytes_sent", "bytes_received", "seconds"):
            p[k] += e[k]
    n = max(len(rows), 1)
    for p in phases.values():
        for k in ("messages", "bytes_sent", "bytes_received", "seconds"):
            p[k] = p[k] / n  # per round
    return {"per_round_s": sum(wall_iv) / len(wall_iv), "cpu_per_round_s": sum(cpu_iv) / len(cpu_iv),
            "bytes_sent_per_round": sum(r["bytes_sent"] for r in rows) / n,
            "bytes_received_per_round": sum(r["bytes_received"] for r in rows) / n,
            "updates_per_round": sum(r["num_updates"] for r in rows) / n,
            "phases": phases, "final_global_accuracy": res["doc"]["rounds"][-1]["global_accuracy"]}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--dataset", default="mnist-5k")
    ap.add_argument("--name", default="methods")
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds must be >= 2 (round 1 is excluded as warm-up)")
    torch.set_num_threads(1)
    methods = ["fedavg"] + [m for m in args.methods if m != "fedavg"]
    reps: list[dict] = []
    missing: dict[str, str] = {}
    for k in range(args.repeats):
        rep: dict = {}
        for m in methods:
            if m in missing:
                continue
            try:
                rep[m] = run_method(m, args)
            except Exception as exc:  # noqa: BLE001 - a method that does not run is reported, not fatal
                missing[m] = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
                continue
            base = rep["fedavg"]
            r = rep[m]
            r["time_ratio"] = r["per_round_s"] / base["per_round_s"]
            r["cpu_ratio"] = r["cpu_per_round_s"] / base["cpu_per_round_s"]
            r["bytes_sent_ratio"] = r["bytes_sent_per_round"] / base["bytes_sent_per_round"]
            r["bytes_received_ratio"] = r["bytes_received_per_round"] / base["bytes_received_per_round"]
            print(f"[repeat {k + 1}/{args.repeats}] {m:15s} per round {r['per_round_s']:.2f}s wall "
                  f"{r['cpu_per_round_s']:.2f}s cpu | x fedavg: wall {r['time_ratio']:.2f} cpu {r['cpu_ratio']:.2f} "
                  f"sent {r['bytes_sent_ratio']:.2f} received {r['bytes_received_ratio']:.2f} | load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
        reps.append(rep)
    table = {}
    for m in methods:
        runs = [rep[m] for rep in reps if m in rep]
        if not runs:
            continue
        table[m] = {key: summary([r[key] for r in runs]) for key in
                    ("time_ratio", "cpu_ratio", "bytes_sent_ratio", "bytes_received_ratio", "per_round_s",
                     "cpu_per_round_s", "bytes_sent_per_round", "bytes_received_per_round")}
        table[m]["phases"] = runs[-1]["phases"]
    for m, t in table.items():
        print(f"== {m:15s} cpu x fedavg {t['cpu_ratio']['median']:.2f} [{t['cpu_ratio']['min']:.2f}, "
              f"{t['cpu_ratio']['max']:.2f}] | wall x fedavg {t['time_ratio']['median']:.2f} | bytes sent x fedavg "
              f"{t['bytes_sent_ratio']['median']:.2f}, received {t['bytes_received_ratio']['median']:.2f}")
    for m, why in missing.items():
        print(f"== {m:15s} did not run: {why}")
    path = write_result(args.name, {"machine": machine(), "args": vars(args), "table": table, "repeats": reps,
                                    "missing": missing})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
