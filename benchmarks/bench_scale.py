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
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.harness import MemorySampler, load_result, machine, run_flower, write_result  # noqa: E402
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


def workload(clients: int, sampled: int, rounds: int, out_dir: str, eval_clients: int = 0) -> dict:
    return {"federated-eval-clients": eval_clients, "method": "fedavg", "dataset": "mnist-5k", "partition": "iid", "num-server-rounds": rounds,
            "fraction-train": fraction_for(sampled, clients), "min-train-nodes": min(2, sampled),
            "batch-size": 3, "max-local-steps": 1, "local-epochs": 1, "min-partition-size": 1,
            "local-test-fraction": local_test_fraction(clients),
            "federated-eval-every": rounds, "seed": 0, "out-dir": out_dir}


def one_run(clients: int, sampled: int, rounds: int, workers: int, eval_clients: int = 0) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as tmp, MemorySampler(1.0) as mem:
        res = run_flower(workload(clients, sampled, rounds, tmp, eval_clients), clients, total_cpus=workers)
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
        "clients": clients, "sampled": sampled, "rounds": rounds, "local_test_fraction": local_test_fraction(clients),
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
        "loadavg_after": list(os.getloadavg()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--sampled", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--name", default="scale")
    ap.add_argument("--federated-eval-clients", type=int, default=0,
                    help="evaluate a fixed seeded sample of this many clients in the last round (0 = all)")
    ap.add_argument("--keep", nargs="*", type=int, default=[],
                    help="N values whose runs are kept from the existing results file instead of re-run "
                         "(only if that run used the same workload)")
    ap.add_argument("--copy-per-message", action="store_true",
                    help="measure the code before the shared-record fix: one serialized copy of the parameters "
                         "and of the run config per message (patched in for this run only)")
    args = ap.parse_args()
    if args.copy_per_message:
        from flwr.app import RecordDict

        from flcore.records import config_to_record, params_to_record
        from strategies.base import FLStrategy

        FLStrategy.params_record = lambda self, params: params_to_record(params)
        FLStrategy._base_content = lambda self, rnd: RecordDict({"run_config": config_to_record(self.cfg.to_dict())})
    old = load_result(args.name) or {}
    kept = {r["clients"]: r for r in old.get("runs", []) if r["clients"] in args.keep
            and r.get("rounds") == args.rounds and r.get("sampled") == args.sampled
            and r.get("local_test_fraction", 0.25) == local_test_fraction(r["clients"])
            and r.get("federated_eval_clients", 0) == args.federated_eval_clients}
    runs = []
    for n in sorted(set(args.clients) | set(kept)):
        if n in kept:
            runs.append(kept[n])
            print(f"[N={n:5d}] kept from the previous results file (written {old.get('written')})")
            continue
        r = one_run(n, args.sampled, args.rounds, args.workers, args.federated_eval_clients)
        runs.append(r)
        print(f"[N={n:5d}, K={args.sampled}] registration {r['register_exchange_s']:.1f}s | per round "
              f"{r['per_round_s']:.2f}s wall {r['cpu_per_round_s']:.2f}s cpu | fed-eval of {r['num_evaluated']} clients "
              f"+{r['fed_eval_extra_s']:.1f}s wall +{r['fed_eval_extra_cpu_s']:.1f}s cpu "
              f"({r['fed_eval_bytes_sent'] / 2**20:.0f} MiB sent) | peak MiB driver/tree: train "
              f"{r['memory_train_rounds']['driver_mib']:.0f}/{r['memory_train_rounds']['tree_mib']:.0f}, eval "
              f"{r['memory_eval_round']['driver_mib']:.0f}/{r['memory_eval_round']['tree_mib']:.0f} | "
              f"load {r['loadavg_after'][0]:.1f}", flush=True)
    growth = {}
    if len(runs) >= 2:
        ns = [r["clients"] for r in runs]
        for phase in ("memory_train_rounds", "memory_eval_round"):
            for part in ("driver_mib", "tree_mib"):
                ys = [r[phase][part] for r in runs]
                growth[f"{phase}.{part}"] = {"mib_per_client": per_client_increment(ns, ys),
                                             "loglog_slope": growth_exponent(ns, ys)}
        for key in ("per_round_s", "cpu_per_round_s", "register_exchange_s", "cpu_to_round1_s", "fed_eval_extra_s",
                    "fed_eval_extra_cpu_s"):
            ys = [max(r[key], 1e-6) for r in runs]
            growth[key] = {"s_per_client": per_client_increment(ns, ys), "loglog_slope": growth_exponent(ns, ys)}
        for k, v in growth.items():
            print(f"growth {k}: " + ", ".join(f"{a} {b:.4g}" for a, b in v.items()))
    path = write_result(args.name, {"machine": machine(), "args": vars(args), "runs": runs, "growth": growth})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
