"""Framework overhead: FedAvg on the in-process engine and on Flower's Ray engine vs a plain PyTorch loop.

Three ways to run the identical work (same data, model, seeded sampling and shuffles; the benchmark
checks that all three produce the same global accuracy every round):
  plain      benchmarks/plain_loop.py: local training + averaging in one process, nothing else;
  inprocess  the in-process engine (engines.run_local): the real ServerApp, round driver, strategy and
             ClientApp through an in-process Flower Grid (records, config, validation, results.json and a
             checkpoint every round);
  flower     Flower's simulation engine (experiments.simulate(engine="ray"): Ray actors, in-memory SuperLink).
``inprocess/plain`` is the in-process engine's overhead, ``flower/plain`` Ray's. With ``--workers W``:
the plain loop gets W torch threads, the in-process engine W worker processes (engine-workers = W, one
torch thread each), Flower W Ray actors of one CPU each.

Each repeat runs the variants back to back (order rotating), and every ratio is taken within one
repeat. Two clocks: wall time (what a user waits; stretched by other jobs on a shared machine) and CPU
time of the whole process tree (the work done; much less sensitive to other jobs). Per variant: the
steady-state per-round time (wall: median interval between round ends after round 1; CPU: mean over
those rounds, as the CPU clock ticks in 10 ms) and the fixed start-up
cost (time to the end of round 1 minus one steady round: Ray start, actor pool, worker processes,
client registration, data loading; imports are already done: bench_startup.py measures a fresh process).

    python -m benchmarks.bench_overhead [--repeats 3] [--rounds 6] [--clients 10] [--workers 1 2]
        [--variants plain inprocess flower] [--set checkpoint=false ...]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from benchmarks.harness import (loadavg, machine, parser, run_flower, run_inprocess, set_overrides,  # noqa: E402
                                tree_cpu_seconds, write_result)
from benchmarks.plain_loop import plain_fedavg  # noqa: E402
from benchmarks.stats import paired_ratios, steady_state, summary  # noqa: E402

VARIANTS = ("plain", "inprocess", "flower")
RATIOS = (("flower", "plain"), ("inprocess", "plain"), ("flower", "inprocess"))


def workload(rounds: int, out_dir: str, dataset: str, max_steps: int) -> dict:
    return {"method": "fedavg", "dataset": dataset, "partition": "dirichlet", "num-server-rounds": rounds,
            "fraction-train": 1.0, "local-epochs": 1, "batch-size": 32, "max-local-steps": max_steps,
            "seed": 0, "federated-eval-every": 0, "out-dir": out_dir}


def _measure(t0: float, c0: float, ends: list[float], cpu_ends: list[float | None], accuracy: list[float]) -> dict:
    """Wall: median interval between round ends after round 1. CPU: the mean over rounds 2 .. R-1, from the
    process tree's CPU read at the end of rounds 1 and R-1 only. Process-tree CPU comes in 10 ms clock ticks;
    each reading scans /proc for ~0.8 ms, which per-round readings would add to every millisecond round they
    measure; round R ends with the run's final checkpoint, a once-per-run cost like the start-up (the wall
    median leaves it out the same way)."""
    wall = steady_state(t0, ends)
    if len(cpu_ends) < 3 or cpu_ends[0] is None or cpu_ends[-2] is None:
        raise ValueError("the process-tree CPU was not read at the end of round 1 and round R-1 (R >= 3)")
    cpu_mean = (cpu_ends[-2] - cpu_ends[0]) / (len(cpu_ends) - 2)
    return {"per_round_s": wall["per_round_s"], "startup_s": wall["startup_s"], "intervals_s": wall["intervals_s"],
            "cpu_per_round_s": cpu_mean, "cpu_startup_s": cpu_ends[0] - c0 - cpu_mean, "accuracy": accuracy}


def run_variant(name: str, cfg: dict, clients: int, workers: int) -> dict:
    if name == "plain":
        torch.set_num_threads(workers)
        ends: list[tuple[float, float | None]] = []
        last = cfg["num-server-rounds"]
        t0, c0 = time.time(), tree_cpu_seconds()
        res = plain_fedavg(cfg, clients, on_round=lambda r, t: ends.append(
            (t, tree_cpu_seconds() if r in (1, last - 1) else None)))
        torch.set_num_threads(1)
        return _measure(t0, c0, [t for t, _ in ends], [c for _, c in ends],
                        [r["global_accuracy"] for r in res["rounds"]])
    if name == "inprocess":
        torch.set_num_threads(1)
        res = run_inprocess(cfg, clients, workers=workers, cpu_each_round=False)
    else:
        torch.set_num_threads(1)
        res = run_flower(cfg, clients, total_cpus=workers, cpu_each_round=False)
    out = _measure(res["t_start"], res["cpu_start"], res["round_ends"], res["round_end_cpu"],
                   [r["global_accuracy"] for r in res["doc"]["rounds"]])
    out["shutdown_s"] = res["t_end"] - res["round_ends"][-1]
    return out


def ratios_of(variants: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(n, d) for n, d in RATIOS if n in variants and d in variants]


def one_repeat(k: int, args: argparse.Namespace, workers: int) -> dict:
    variants = tuple(args.variants)
    order = variants[k % len(variants):] + variants[:k % len(variants)]
    rep: dict = {"order": list(order)}
    for name in order:
        with tempfile.TemporaryDirectory(prefix="bench_overhead_") as tmp:
            cfg = {**workload(args.rounds, tmp, args.dataset, args.max_steps), **set_overrides(args.set)}
            rep[name] = run_variant(name, cfg, args.clients, workers)
    ref = rep[variants[0]]["accuracy"]
    rep["identical_accuracy"] = all(
        len(rep[v]["accuracy"]) == len(ref) and all(abs(a - b) < 1e-9 for a, b in zip(rep[v]["accuracy"], ref))
        for v in variants)
    if "plain" in variants and "inprocess" in variants:
        # with W > 1 torch threads the plain loop sums in a different order than single-threaded clients
        rep["identical_inprocess_plain"] = all(
            abs(a - b) < 1e-9 for a, b in zip(rep["inprocess"]["accuracy"], rep["plain"]["accuracy"]))
    for num, den in ratios_of(variants):
        rep[f"{num}/{den}"] = rep[num]["per_round_s"] / rep[den]["per_round_s"]
        rep[f"{num}/{den} cpu"] = rep[num]["cpu_per_round_s"] / rep[den]["cpu_per_round_s"]
    rep["loadavg_after"] = loadavg()
    return rep


def summarise(reps: list[dict], workers: int, variants: tuple[str, ...]) -> dict:
    out: dict = {"workers": workers, "variants": list(variants), "repeats": reps,
                 "identical_accuracy": all(r["identical_accuracy"] for r in reps)}
    for num, den in ratios_of(variants):
        for clock in ("", " cpu"):
            key = f"{num}/{den}{clock}"
            field = "cpu_per_round_s" if clock else "per_round_s"
            out[key] = summary(paired_ratios([r[num][field] for r in reps], [r[den][field] for r in reps]))
    for v in variants:
        for field in ("per_round_s", "cpu_per_round_s", "startup_s", "cpu_startup_s"):
            out[f"{v}.{field}"] = summary([r[v][field] for r in reps])
    if "flower" in variants:
        out["flower.shutdown_s"] = summary([r["flower"]["shutdown_s"] for r in reps])
    out["loadavg"] = summary([r["loadavg_after"][0] for r in reps])
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--workers", type=int, nargs="+", default=[1])
    ap.add_argument("--dataset", default="mnist-5k")
    ap.add_argument("--max-steps", type=int, default=0, help="max-local-steps (0 = full local epoch)")
    ap.add_argument("--name", default="overhead")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="run-config overrides on top of the workload (e.g. checkpoint=false)")
    args = ap.parse_args()
    variants = tuple(args.variants)
    report = {"machine": machine(), "args": vars(args), "configs": []}
    for workers in args.workers:
        reps = []
        for k in range(args.repeats):
            rep = one_repeat(k, args, workers)
            reps.append(rep)
            print(f"[workers={workers} repeat {k + 1}/{args.repeats}] per round (wall): "
                  + ", ".join(f"{v} {rep[v]['per_round_s']:.3f}s" for v in variants)
                  + " | ratios wall/cpu: "
                  + ", ".join(f"{n}/{d} {rep[f'{n}/{d}']:.3f}/{rep[f'{n}/{d} cpu']:.3f}" for n, d in ratios_of(variants))
                  + " | start-up " + ", ".join(f"{v} {rep[v]['startup_s']:.2f}s" for v in variants if v != "plain")
                  + f" | identical accuracies {rep['identical_accuracy']} | load {rep['loadavg_after'][0]:.1f}",
                  flush=True)
        summ = summarise(reps, workers, variants)
        report["configs"].append(summ)
        for n, d in ratios_of(variants):
            w, c = summ[f"{n}/{d}"], summ[f"{n}/{d} cpu"]
            print(f"== workers={workers} {n}/{d} per round: wall {w['median']:.3f} [{w['min']:.3f}, {w['max']:.3f}], "
                  f"cpu {c['median']:.3f} [{c['min']:.3f}, {c['max']:.3f}] (n={w['n']})")
        for v in variants:
            if v != "plain":
                print(f"== workers={workers} {v} start-up {summ[f'{v}.startup_s']['median']:.2f}s wall, "
                      f"{summ[f'{v}.cpu_startup_s']['median']:.2f}s cpu", flush=True)
    path = write_result(args.name, report)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
