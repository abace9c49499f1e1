"""A sweep in one process: does the Nth run cost what the first did?

The experiment runner (experiments/run.py) and a test worker run many federations one after another in one
process on the in-process engine. Anything the process keeps per run (caches keyed by the run config, the
model pool, data) must neither grow without bound nor stop working as runs accumulate. This benchmark runs
the same small job ``--runs`` times in one process, each with its own out-dir and a learning rate from a
small grid (as a sweep's runs differ), and prints per run: CPU per round (rounds 2 .. R-1), how many models
the ClientApp built (1 when its model pool works: 0 once a sweep repeats a setting), and the process's
resident memory after the run. The summary compares the last three runs with the first three and gives the
memory growth per run over the second half of the runs.

Before the model pool forgot its least recently used key (it refused new keys once it held eight), the
ninth run of a sweep rebuilt the model for every message: digits 23.3 -> 31.7 ms CPU per round.

    python -m benchmarks.bench_sweep [--dataset digits] [--clients 10] [--rounds 10] [--runs 24]
"""

from __future__ import annotations

import os
import statistics
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

LRS = (0.02, 0.05, 0.1)


def sweep(dataset: str, clients: int, rounds: int, runs: int, out_dir: str) -> list[dict]:
    """One row per run: lr, CPU per round, model builds, resident MiB after the run."""
    from benchmarks.bench_client_floor import engine_round_cpu
    from benchmarks.bench_overhead import workload
    from benchmarks.procfs import memory_mib
    from client_app.model_pool import POOL

    rows = []
    for k in range(runs):
        cfg = {**workload(rounds, f"{out_dir}/{k}", dataset, 0), "lr": LRS[k % len(LRS)]}
        builds = POOL.builds
        cpu, _ = engine_round_cpu(cfg, clients, "client_app.app:app")
        rows.append({"run": k + 1, "lr": cfg["lr"], "cpu_per_round_s": cpu, "model_builds": POOL.builds - builds,
                     "rss_mib": memory_mib(os.getpid())[0]})  # resident now, not the peak
    return rows


def summarise(rows: list[dict]) -> dict:
    """Last three runs against the first three: CPU per round (ratio of medians); resident memory growth per
    run over the second half of the runs (after the per-process caches have filled); most model builds in
    a run after the first."""
    first, last = rows[:3], rows[-3:]
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    half = len(rows) // 2
    return {"first3_cpu_per_round_s": med(first, "cpu_per_round_s"), "last3_cpu_per_round_s": med(last, "cpu_per_round_s"),
            "last3_over_first3": med(last, "cpu_per_round_s") / med(first, "cpu_per_round_s"),
            "rss_growth_mib_per_run": (rows[-1]["rss_mib"] - rows[half - 1]["rss_mib"]) / (len(rows) - half),
            "max_model_builds_after_first": max((r["model_builds"] for r in rows[1:]), default=0)}


def main() -> None:
    from benchmarks.harness import machine, parser, write_result

    ap = parser(__doc__)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=24)
    ap.add_argument("--name", default="sweep")
    args = ap.parse_args()
    if args.rounds < 3 or args.runs < 4:
        ap.error("--rounds must be >= 3 (the steady state is rounds 2 .. R-1) and --runs >= 4")
    torch.set_num_threads(1)
    started = machine()
    with tempfile.TemporaryDirectory(prefix="bench_sweep_") as tmp:
        rows = sweep(args.dataset, args.clients, args.rounds, args.runs, tmp)
        for row in rows:
            print(f"[run {row['run']}/{args.runs}] lr {row['lr']}: CPU per round {row['cpu_per_round_s'] * 1e3:.2f} ms, "
                  f"model builds {row['model_builds']}, resident {row['rss_mib']:.0f} MiB", flush=True)
    out = {"machine": started, "args": vars(args), "runs": rows, **summarise(rows)}
    print(f"== last 3 / first 3 runs, CPU per round: {out['last3_over_first3']:.3f}; resident memory "
          f"{out['rss_growth_mib_per_run']:+.2f} MiB per run; most model builds in a run after the first: "
          f"{out['max_model_builds_after_first']}")
    print(f"wrote {write_result(args.name, out)}")


if __name__ == "__main__":
    main()
