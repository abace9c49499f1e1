"""How much of the in-process engine's overhead on the digits job is this project's ClientApp glue.

Three variants alternate in one process, each repeat in the same order: the plain loop, the engine with the
real ClientApp, and the engine with ``benchmarks/minimal_client_app.py`` (the same learning with almost no glue).
CPU per round is this process's CPU from the end of round 1 to the end of round R-1 over R-2 (the sequential
engine runs in this process). The three must give the same global accuracy in every round (checked). The gap
between the real and the minimal ClientApp is what any trimming of the ClientApp could win; the gap between
the minimal ClientApp and the plain loop is the floor of Flower's messages, the engine's boundary copies and
the server's per-update work.

    python -m benchmarks.bench_client_floor [--dataset digits] [--clients 10] [--rounds 40] [--repeats 5]
"""

from __future__ import annotations

import json
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

VARIANTS = {"real ClientApp": "client_app.app:app", "minimal ClientApp": "benchmarks.minimal_client_app:app"}


def engine_round_cpu(cfg: dict, clients: int, client_app: str) -> tuple[float, list[float]]:
    """CPU per round (rounds 2 .. R-1) and the global accuracy of every round of one in-process run."""
    import server_app.runner as runner
    from engines.local import parse_run_config, run_inprocess

    ends: list[float] = []
    with runner.observe_lines(lambda text: ends.append(time.process_time()) if text.startswith("[round ") else None,
                              echo=False):
        run_cfg = parse_run_config(cfg).with_out_dir()
        run_inprocess(run_cfg, clients, client_app=client_app)
    doc = json.loads((run_cfg.out_path / "results.json").read_text())
    return (ends[-2] - ends[0]) / (len(ends) - 2), [r["global_accuracy"] for r in doc["rounds"]]


def plain_round_cpu(cfg: dict, clients: int) -> tuple[float, list[float]]:
    from benchmarks.plain_loop import plain_fedavg

    ends: list[float] = []
    res = plain_fedavg(cfg, clients, on_round=lambda r, t: ends.append(time.process_time()))
    return (ends[-2] - ends[0]) / (len(ends) - 2), [r["global_accuracy"] for r in res["rounds"]]


def main() -> None:
    from benchmarks.bench_overhead import workload
    from benchmarks.harness import machine, parser, write_result
    from benchmarks.stats import summary

    ap = parser(__doc__)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="client_floor")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds must be >= 3 (the steady state is rounds 2 .. R-1)")
    torch.set_num_threads(1)
    started = machine()
    per_round: dict[str, list[float]] = {"plain": [], **{v: [] for v in VARIANTS}}
    identical = True
    with tempfile.TemporaryDirectory(prefix="bench_client_floor_") as tmp:
        runs = 0

        def cfg(rounds: int) -> dict:
            nonlocal runs
            runs += 1
            return workload(rounds, f"{tmp}/{runs}", args.dataset, 0)

        plain_round_cpu(cfg(3), args.clients)  # warm: imports, data, first-call costs
        for app in VARIANTS.values():
            engine_round_cpu(cfg(3), args.clients, app)
        for k in range(args.repeats):
            cpu, accuracy = plain_round_cpu(cfg(args.rounds), args.clients)
            per_round["plain"].append(cpu)
            for name, app in VARIANTS.items():
                cpu, acc = engine_round_cpu(cfg(args.rounds), args.clients, app)
                per_round[name].append(cpu)
                identical &= acc == accuracy
            print(f"[repeat {k + 1}/{args.repeats}] CPU per round: "
                  + ", ".join(f"{n} {v[-1] * 1e3:.2f} ms" for n, v in per_round.items()), flush=True)
    if not identical:
        raise SystemExit("the variants' global accuracies differ: the minimal ClientApp no longer learns as the "
                         "real one does")
    ratios = {n: [e / p for e, p in zip(per_round[n], per_round["plain"])] for n in VARIANTS}
    out = {"machine": started, "args": vars(args), "cpu_per_round_s": per_round, "identical_accuracy": identical,
           "paired_ratio_to_plain": {n: summary(r) for n, r in ratios.items()},
           "best_ratio_to_plain": {n: min(per_round[n]) / min(per_round["plain"]) for n in VARIANTS}}
    for n in VARIANTS:
        s = out["paired_ratio_to_plain"][n]
        print(f"== {n} / plain: best {out['best_ratio_to_plain'][n]:.3f}, paired median {s['median']:.3f} "
              f"[{s['min']:.3f}, {s['max']:.3f}]")
    print(f"wrote {write_result(args.name, out)}")


if __name__ == "__main__":
    main()
