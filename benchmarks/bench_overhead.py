"""Framework overhead: FedAvg in Flower's simulation engine vs a plain in-process PyTorch loop.

Three ways to run the identical work (same data, model, seeded sampling and shuffles; the benchmark
checks that all three produce the same global accuracy every round):
  plain      benchmarks/plain_loop.py: local training + averaging in one process, nothing else;
  inprocess  the project's round driver, strategy and ClientApp with messages delivered in this process
             (benchmarks/inproc_grid.py): records, config parsing, validation, results, checkpoints;
  flower     experiments.simulate: Flower's simulation engine (Ray actors, in-memory SuperLink).
``flower/plain`` is the framework overhead, ``inprocess/plain`` the share of it that is this project's
own code, ``flower/inprocess`` the simulation engine's. With ``--workers W`` Flower gets W Ray actors of
one CPU each and the in-process loops W torch threads.

Each repeat runs the variants back to back (order rotating), and every ratio is taken within one
repeat. Two clocks: wall time (what a user waits; stretched by other jobs on a shared machine) and CPU
time of the whole process tree (the work done; much less sensitive to other jobs). Per variant: the
steady-state per-round time (median interval between round ends after round 1) and the fixed start-up
cost (time to the end of round 1 minus one steady round: Ray start, actor pool, ClientApp import,
client registration, data loading).

    python -m benchmarks.bench_overhead [--repeats 3] [--rounds 6] [--clients 10] [--workers 1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from benchmarks.harness import machine, run_flower, run_inprocess, tree_cpu_seconds, write_result  # noqa: E402
from benchmarks.plain_loop import plain_fedavg  # noqa: E402
from benchmarks.stats import paired_ratios, steady_state, summary  # noqa: E402

VARIANTS = ("plain", "inprocess", "flower")
RATIOS = (("flower", "plain"), ("inprocess", "plain"), ("flower", "inprocess"))


def workload(rounds: int, out_dir: str, dataset: str, max_steps: int) -> dict:
    return {"method": "fedavg", "dataset": dataset, "partition": "dirichlet", "num-server-rounds": rounds,
            "fraction-train": 1.0, "local-epochs": 1, "batch-size": 32, "max-local-steps": max_steps,
            "seed": 0, "federated-eval-every": 0, "out-dir": out_dir}


def _measure(t0: float, c0: float, ends: list[float], cpu_ends: list[float], accuracy: list[float]) -> dict:
    wall, cpu = steady_state(t0, ends), steady_state(c0, cpu_ends)
    return {"per_round_s": wall["per_round_s"], "startup_s": wall["startup_s"], "intervals_s": wall["intervals_s"],
            "cpu_per_round_s": cpu["per_round_s"], "cpu_startup_s": cpu["startup_s"], "accuracy": accuracy}


def run_variant(name: str, cfg: dict, clients: int, workers: int) -> dict:
    if name == "plain":
        torch.set_num_threads(workers)
        ends: list[tuple[float, float]] = []
        t0, c0 = time.time(), tree_cpu_seconds()
        res = plain_fedavg(cfg, clients, on_round=lambda r, t: ends.append((t, tree_cpu_seconds())))
        torch.set_num_threads(1)
        return _measure(t0, c0, [t for t, _ in ends], [c for _, c in ends],
                        [r["global_accuracy"] for r in res["rounds"]])
    if name == "inprocess":
        torch.set_num_threads(workers)
        res = run_inprocess(cfg, clients)
        torch.set_num_threads(1)
    else:
        torch.set_num_threads(1)
        res = run_flower(cfg, clients, total_cpus=workers)
    out = _measure(res["t_start"], res["cpu_start"], res["round_ends"], res["round_end_cpu"],
                   [r["global_accuracy"] for r in res["doc"]["rounds"]])
    out["shutdown_s"] = res["t_end"] - res["round_ends"][-1]
    return out


def one_repeat(k: int, args: argparse.Namespace, workers: int) -> dict:
    order = VARIANTS[k % 3:] + VARIANTS[:k % 3]
    rep: dict = {"order": list(order)}
    for name in order:
        with tempfile.TemporaryDirectory(prefix="bench_overhead_") as tmp:
            rep[name] = run_variant(name, workload(args.rounds, tmp, args.dataset, args.max_steps), args.clients,
                                    workers)
    ref = rep["plain"]["accuracy"]
    rep["identical_accuracy"] = all(
        len(rep[v]["accuracy"]) == len(ref) and all(abs(a - b) < 1e-9 for a, b in zip(rep[v]["accuracy"], ref))
        for v in VARIANTS)
    # with W > 1 torch threads the in-process variants sum in a different order than Flower's 1-thread actors
    rep["identical_inprocess_plain"] = all(abs(a - b) < 1e-9 for a, b in zip(rep["inprocess"]["accuracy"], ref))
    for num, den in RATIOS:
        rep[f"{num}/{den}"] = rep[num]["per_round_s"] / rep[den]["per_round_s"]
        rep[f"{num}/{den} cpu"] = rep[num]["cpu_per_round_s"] / rep[den]["cpu_per_round_s"]
    rep["loadavg_after"] = list(os.getloadavg())
    return rep


def summarise(reps: list[dict], workers: int) -> dict:
    out: dict = {"workers": workers, "repeats": reps, "identical_accuracy": all(r["identical_accuracy"] for r in reps)}
    for num, den in RATIOS:
        for clock in ("", " cpu"):
            key = f"{num}/{den}{clock}"
            field = "cpu_per_round_s" if clock else "per_round_s"
            out[key] = summary(paired_ratios([r[num][field] for r in reps], [r[den][field] for r in reps]))
    for v in VARIANTS:
        for field in ("per_round_s", "cpu_per_round_s", "startup_s", "cpu_startup_s"):
            out[f"{v}.{field}"] = summary([r[v][field] for r in reps])
    out["flower.shutdown_s"] = summary([r["flower"]["shutdown_s"] for r in reps])
    out["loadavg"] = summary([r["loadavg_after"][0] for r in reps])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--workers", type=int, nargs="+", default=[1])
    ap.add_argument("--dataset", default="mnist-5k")
    ap.add_argument("--max-steps", type=int, default=0, help="max-local-steps (0 = full local epoch)")
    ap.add_argument("--name", default="overhead")
    args = ap.parse_args()
    report = {"machine": machine(), "args": vars(args), "configs": []}
    for workers in args.workers:
        reps = []
        for k in range(args.repeats):
            rep = one_repeat(k, args, workers)
            reps.append(rep)
            print(f"[workers={workers} repeat {k + 1}/{args.repeats}] per round (wall): "
                  + ", ".join(f"{v} {rep[v]['per_round_s']:.2f}s" for v in VARIANTS)
                  + " | ratios wall/cpu: "
                  + ", ".join(f"{n}/{d} {rep[f'{n}/{d}']:.3f}/{rep[f'{n}/{d} cpu']:.3f}" for n, d in RATIOS)
                  + f" | flower start-up {rep['flower']['startup_s']:.1f}s | identical accuracies "
                  f"{rep['identical_accuracy']} | load {rep['loadavg_after'][0]:.1f}", flush=True)
        summ = summarise(reps, workers)
        report["configs"].append(summ)
        for n, d in RATIOS:
            w, c = summ[f"{n}/{d}"], summ[f"{n}/{d} cpu"]
            print(f"== workers={workers} {n}/{d} per round: wall {w['median']:.3f} [{w['min']:.3f}, {w['max']:.3f}], "
                  f"cpu {c['median']:.3f} [{c['min']:.3f}, {c['max']:.3f}] (n={w['n']})")
        print(f"== workers={workers} flower start-up {summ['flower.startup_s']['median']:.1f}s wall, "
              f"{summ['flower.cpu_startup_s']['median']:.1f}s cpu; shut-down {summ['flower.shutdown_s']['median']:.1f}s",
              flush=True)
    path = write_result(args.name, report)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
