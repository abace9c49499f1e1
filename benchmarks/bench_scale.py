"""Scale: memory and time as the number of simulated clients grows, with a fixed number sampled per round.

For N in (10, 100, 1000) registered clients (SuperNodes) FedAvg samples K = 10 per round; per-client work
is held fixed (one local SGD step on 3 samples: mnist-5k split iid, batch 3, max-local-steps 1; the
same ConvNet, so every message carries the same ~1 MB of parameters). Rounds 1..R-1 are training rounds;
round R adds the federated evaluation of the global model on *every* client (federated-eval-every = R).
Reported per N: the registration exchange (query to all nodes), steady per-round time, the
federated-evaluation exchange, and peak memory (PSS, MiB) of the driver process (ServerApp + simulated
SuperLink) and of the whole process tree (plus Ray and its ClientApp workers), sampled every second, split into the
training rounds and the evaluation round. Memory growth is summarised as the fitted MiB per extra
registered client and the log-log slope (0 = flat, 1 = linear in N).

    python -m benchmarks.bench_scale [--clients 10 100 1000] [--sampled 10] [--rounds 5] [--workers 2]

Large populations (docs/SCALING.md): ``--dataset synthetic`` (Synthetic(1,1), generated per client, so
any N works; the G-FL test set is the union of the clients' test splits and grows with N) and
``--engine inprocess`` (the in-process engine, engines.run_local, instead of Flower's Ray engine):

    python -m benchmarks.bench_scale --dataset synthetic --clients 10000 --sampled 100 \
        --federated-eval-clients 100 --rounds 3 --engine inprocess --name scale_10k_inprocess

``--poll-cycles`` adds one polling cycle of Flower's simulation engine (benchmarks/engine_costs.py) at
each N with the sampled and the given pending-message counts: the measured cause of the Ray engine's
superlinear all-client exchanges.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.harness import (MemorySampler, load_result, loadavg, machine, parser, run_flower,  # noqa: E402
                                run_inprocess, write_result)
from benchmarks.stats import growth_exponent, per_client_increment, steady_state, summary  # noqa: E402


def fraction_for(sampled: int, clients: int) -> float:
    """fraction-train giving exactly ``sampled`` clients under the strategy's ceil(fraction * N) rule."""
    import math

    frac = sampled / clients
    if math.ceil(frac * clients) != sampled:  # float rounding: nudge down to the exact count
        frac = math.nextafter(frac, 0.0)
    if math.ceil(frac * clients) != sampled:
        raise ValueError(f"no fraction-train gives {sampled} of {clients} clients")
    return frac


POOL = 4000  # mnist-5k training pool after the 20% global test hold-out


def local_test_fraction(clients: int) -> float:
    """The local-test-fraction that leaves every client exactly one local test sample (iid split of POOL)."""
    return 1.0 / (POOL // clients)


def workload(clients: int, sampled: int, rounds: int, out_dir: str, eval_clients: int = 0,
             dataset: str = "mnist-5k") -> dict:
    base = {"federated-eval-clients": eval_clients, "method": "fedavg", "num-server-rounds": rounds,
            "fraction-train": fraction_for(sampled, clients), "min-train-nodes": min(2, sampled),
            "batch-size": 3, "max-local-steps": 1, "local-epochs": 1, "min-partition-size": 1,
            "federated-eval-every": rounds, "seed": 0, "out-dir": out_dir}
    if dataset == "synthetic":  # generated per client: any N; every client has >= 50 samples
        return {**base, "dataset": "synthetic", "partition": "natural", "local-test-fraction": 0.25}
    if dataset != "mnist-5k":
        raise ValueError(f"--dataset must be mnist-5k or synthetic, got {dataset!r}")
    return {**base, "dataset": "mnist-5k", "partition": "iid", "local-test-fraction": local_test_fraction(clients)}


def gfl_test_set_mib(overrides: dict, clients: int) -> float:
    """Size of the server's G-FL test set (for synthetic it is every client's test split: grows with N)."""
    from data_partitioning.federated import global_test_set
    from flcore.config import RunConfig, resolve_run_config

    x, y = global_test_set(RunConfig.from_dict(resolve_run_config(dict(overrides))), clients)
    return (x.nbytes + y.nbytes) / 2**20


def one_run(clients: int, sampled: int, rounds: int, workers: int, eval_clients: int = 0, engine: str = "ray",
            dataset: str = "mnist-5k", engine_workers: int = 1, round_timeout: float | None = None) -> dict:
    # PSS of Ray's many processes every 1 s; the in-process engine is one process and its phases are short
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as tmp, MemorySampler(1.0 if engine == "ray" else 0.2) as mem:
        wl = workload(clients, sampled, rounds, tmp, eval_clients, dataset)
        if round_timeout is not None:  # also the registration exchange's limit: it asks all N nodes at once
            wl["round-timeout"] = round_timeout
        if engine == "ray":
            res = run_flower(wl, clients, total_cpus=workers)
        else:
            res = run_inprocess(wl, clients, workers=engine_workers)
    ends = res["round_ends"]
    # process-tree CPU minus what the memory sampler (a thread of this process) used itself
    res["round_end_cpu"] = [c - mem.cpu_until(t) for c, t in zip(res["round_end_cpu"], ends)]
    res["cpu_start"] -= mem.cpu_until(res["t_start"])
    ex = res["exchanges"]
    reg = [e for e in ex if e["phase"] == "register"]
    train = [e for e in ex if e["phase"] == "train"]
    ev = [e for e in ex if e["phase"] == "evaluate"]
    st = steady_state(res["t_start"], ends[:-1])  # training-only rounds
    cpu = res["round_end_cpu"]
    cst = steady_state(res["cpu_start"], cpu[:-1])
    eval_round = ends[-1] - ends[-2]
    rows = res["doc"]["rounds"]
    t_reg_end = reg[-1]["start"] + reg[-1]["seconds"] if reg else res["t_start"]
    return {
        "engine": engine, "engine_workers": engine_workers if engine == "inprocess" else None, "dataset": dataset,
        "clients": clients, "sampled": sampled, "rounds": rounds,
        "local_test_fraction": wl["local-test-fraction"], "wall_s": res["t_end"] - res["t_start"],
        "cpu_total_s": cpu[-1] - res["cpu_start"],
        "round_timeout": wl.get("round-timeout"),
        # Flower's simulation registers its nodes in a thread while the ServerApp starts: at large N the
        # ServerApp's first node list is incomplete and the rest register at the start of round 1
        "registered_at_start": res["doc"]["final"].get("num_clients"),
        "num_registered": sum(e["replies"] for e in reg),
        "register_exchanges": [{"round": e["round"], "messages": e["messages"], "replies": e["replies"],
                                "seconds": e["seconds"], "started_after_s": e["start"] - res["t_start"]} for e in reg],
        "failures": sum(len(r["failures"]) for r in rows),
        "federated_eval_clients": eval_clients, "num_evaluated": rows[-1].get("num_evaluated"),
        "num_sampled": [r["num_sampled"] for r in rows],
        "startup_s": res["t_registered"] - res["t_start"] if res["t_registered"] else None,
        "register_exchange_s": sum(e["seconds"] for e in reg), "register_messages": sum(e["messages"] for e in reg),
        "per_round_s": st["per_round_s"], "train_exchange_s": summary([e["seconds"] for e in train[1:]]),
        "cpu_per_round_s": cst["per_round_s"], "cpu_to_round1_s": cpu[0] - res["cpu_start"],
        "eval_round_s": eval_round, "fed_eval_extra_s": eval_round - st["per_round_s"],
        "eval_round_cpu_s": cpu[-1] - cpu[-2], "fed_eval_extra_cpu_s": cpu[-1] - cpu[-2] - cst["per_round_s"],
        "start_attempts": res.get("start_attempts", 1),
        "fed_eval_exchange_s": sum(e["seconds"] for e in ev), "fed_eval_messages": sum(e["messages"] for e in ev),
        "fed_eval_bytes_sent": sum(e["bytes_sent"] for e in ev),
        "train_bytes_sent_per_round": summary([e["bytes_sent"] for e in train]),
        "memory_registration": mem.peak(res["t_start"], t_reg_end),
        "memory_train_rounds": mem.peak(t_reg_end, ends[-2]),
        "memory_eval_round": mem.peak(ends[-2], ends[-1]),
        "memory_overall": mem.peak(),
        "memory_samples": len(mem.series),
        "final_global_accuracy": rows[-1]["global_accuracy"],
        "client_eval_answered": len(rows[-1].get("per_client", {}) or {}),
        "loadavg_after": loadavg(),
    }


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--sampled", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--name", default="scale")
    ap.add_argument("--federated-eval-clients", type=int, default=0,
                    help="evaluate a fixed seeded sample of this many clients in the last round (0 = all)")
    ap.add_argument("--engine", choices=("ray", "inprocess"), default="ray",
                    help="ray: Flower's simulation engine (--workers CPUs); inprocess: engines.run_local")
    ap.add_argument("--engine-workers", type=int, default=1, help="worker processes of the in-process engine")
    ap.add_argument("--dataset", choices=("mnist-5k", "synthetic"), default="mnist-5k",
                    help="mnist-5k (at most 4000 clients) or synthetic (generated per client: any N)")
    ap.add_argument("--round-timeout", type=float, default=None,
                    help="run-config round-timeout (default 600 s; the start-up registration asks all N nodes "
                         "within it, which takes longer than that on Flower's engine at N = 10,000)")
    ap.add_argument("--poll-cycles", type=int, nargs="*", default=[],
                    help="also time one polling cycle of Flower's engine at each N with the sampled count and "
                         "these counts of pending messages")
    ap.add_argument("--keep", nargs="*", type=int, default=[],
                    help="N values whose runs are kept from the existing results file instead of re-run "
                         "(only if that run used the same workload)")
    ap.add_argument("--copy-per-message", action="store_true",
                    help="measure the code before the shared-record fix: one serialized copy of the parameters "
                         "and of the run config per message (patched in for this run only)")
    args = ap.parse_args()
    started = machine()  # load average at the start (write time is the end)
    if args.copy_per_message:
        from flcore.records import config_to_record, params_to_record
        from strategies.messages import MessageBuilder

        MessageBuilder.params_record = lambda self, params: params_to_record(params)
        MessageBuilder.base_records = lambda self: {"run_config": config_to_record(self.cfg.to_dict())}
    old = load_result(args.name) or {}
    kept = {r["clients"]: r for r in old.get("runs", []) if r["clients"] in args.keep
            and r.get("rounds") == args.rounds and r.get("sampled") == args.sampled
            and r.get("engine", "ray") == args.engine and r.get("dataset", "mnist-5k") == args.dataset
            and r.get("local_test_fraction", 0.25) == workload(r["clients"], args.sampled, args.rounds, "",
                                                               dataset=args.dataset)["local-test-fraction"]
            and r.get("federated_eval_clients", 0) == args.federated_eval_clients}
    runs = []
    for n in sorted(set(args.clients) | set(kept)):
        if n in kept:
            runs.append(kept[n])
            print(f"[N={n:5d}] kept from the previous results file (written {old.get('written')})")
            continue
        r = one_run(n, args.sampled, args.rounds, args.workers, args.federated_eval_clients, args.engine,
                    args.dataset, args.engine_workers, args.round_timeout)
        if args.dataset == "synthetic":
            r["gfl_test_set_mib"] = gfl_test_set_mib(workload(n, args.sampled, args.rounds, "", 0, "synthetic"), n)
        runs.append(r)
        print(f"[{args.engine} N={n:5d}, K={args.sampled}] registration {r['register_exchange_s']:.1f}s | per round "
              f"{r['per_round_s']:.2f}s wall {r['cpu_per_round_s']:.2f}s cpu | fed-eval of {r['num_evaluated']} clients "
              f"+{r['fed_eval_extra_s']:.1f}s wall +{r['fed_eval_extra_cpu_s']:.1f}s cpu "
              f"({r['fed_eval_bytes_sent'] / 2**20:.0f} MiB sent) | peak MiB driver/tree: train "
              f"{_mib(r['memory_train_rounds']['driver_mib'])}/{_mib(r['memory_train_rounds']['tree_mib'])}, eval "
              f"{_mib(r['memory_eval_round']['driver_mib'])}/{_mib(r['memory_eval_round']['tree_mib'])} | "
              f"load {r['loadavg_after'][0]:.1f}", flush=True)
    growth = {}
    if len(runs) >= 2:
        ns = [r["clients"] for r in runs]
        for phase in ("memory_train_rounds", "memory_eval_round"):
            for part in ("driver_mib", "tree_mib"):
                ys = [r[phase][part] for r in runs]
                if None in ys:  # a phase shorter than the sampling interval
                    continue
                growth[f"{phase}.{part}"] = {"mib_per_client": per_client_increment(ns, ys),
                                             "loglog_slope": growth_exponent(ns, ys)}
        for key in ("per_round_s", "cpu_per_round_s", "register_exchange_s", "cpu_to_round1_s", "fed_eval_extra_s",
                    "fed_eval_extra_cpu_s"):
            ys = [max(r[key], 1e-6) for r in runs]
            growth[key] = {"s_per_client": per_client_increment(ns, ys), "loglog_slope": growth_exponent(ns, ys)}
        for k, v in growth.items():
            print(f"growth {k}: " + ", ".join(f"{a} {b:.4g}" for a, b in v.items()))
    cycles = []
    for n in sorted(set(args.clients) | set(kept)) if args.poll_cycles else []:
        from benchmarks.engine_costs import engine_poll_cost

        for pending in sorted({min(args.sampled, n), *(min(p, n) for p in args.poll_cycles)}):
            c = engine_poll_cost(n, pending)
            c["cpu_us_per_node_and_message"] = c["later_cycle_cpu_ms"] * 1e3 / (n * pending) if pending else None
            cycles.append(c)
            print(f"[flower engine] N={n:5d}, {pending:5d} pending: one polling cycle {c['first_cycle_cpu_ms']:.0f} ms "
                  f"cpu (delivering), {c['later_cycle_cpu_ms']:.0f} ms (nothing new; every 0.1 s)", flush=True)
    path = write_result(args.name, {"machine": started, "args": vars(args), "runs": runs, "growth": growth,
                                    "poll_cycles": cycles, "loadavg_at_end": loadavg()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
