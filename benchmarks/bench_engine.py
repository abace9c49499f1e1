"""Server-side scale costs measured in-process, in CPU time (steady on a shared machine):

1. Building one exchange with all N registered clients (the federated evaluation every
   ``federated-eval-every`` rounds; the registration query is the same shape without parameters) and
   with the K sampled clients of a training round: peak traced memory and CPU, with the shared
   parameter record (current code) and without it (the code before the fix), N = 10, 100, 1000.
2. The client registry (strategy.clients) and the per-round refresh_clients() check; what Flower's
   simulation keeps per registered node (SuperLink node record, the node's Context).
3. One polling cycle of Flower's simulation engine with N registered nodes and P pending messages
   (Flower's own code; O(N x P)): the cost every 0.1 s while any exchange is in flight.
4. The CPU an idle Ray burns per second (its daemons), paid for every second a simulation runs.

    python -m benchmarks.bench_engine [--clients 10 100 1000] [--sampled 10]
"""

from __future__ import annotations

import logging
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.engine_costs import (engine_poll_cost, flower_node_state_cost, ray_idle_cpu,  # noqa: E402
                                     registry_cost, server_exchange_cost)
from benchmarks.harness import machine, parser, write_result  # noqa: E402


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--sampled", type=int, default=10)
    ap.add_argument("--dataset", default="mnist-5k")
    args = ap.parse_args()
    logging.getLogger("noniid_fl").setLevel(logging.ERROR)  # the capturing grid answers nobody: no timeout spam
    exchange = []
    for n in args.clients:
        for shared in (True, False):
            r = server_exchange_cost(n, min(args.sampled, n), {"dataset": args.dataset, "out-dir": "runs/bench-engine"},
                                     shared_records=shared)
            r.update({"clients": n, "sampled": min(args.sampled, n), "shared_records": shared})
            exchange.append(r)
            print(f"[N={n:5d}] {'shared record ' if shared else 'copy per message'}: evaluate-all "
                  f"{r['evaluate_all_peak_mib']:8.1f} MiB {r['evaluate_all_cpu_ms']:8.1f} ms cpu | train (K="
                  f"{r['sampled']}) {r['train_sampled_peak_mib']:6.1f} MiB {r['train_sampled_cpu_ms']:6.1f} ms cpu "
                  f"(model {r['model_mib']:.2f} MiB; times under tracemalloc)", flush=True)
    poll = []
    for n in args.clients:
        for pending in sorted({min(args.sampled, n), n}):
            r = engine_poll_cost(n, pending)
            poll.append(r)
            print(f"[engine] N={n:5d} nodes, {pending:5d} pending messages: one polling cycle "
                  f"{r['first_cycle_cpu_ms']:9.1f} ms cpu (delivering), {r['later_cycle_cpu_ms']:9.1f} ms cpu "
                  f"(nothing new; repeats every 0.1 s)", flush=True)
    registry = []
    for n in args.clients:
        r = registry_cost(n)
        registry.append(r)
        print(f"[registry] N={n:5d}: {r['registry_mib']:.3f} MiB, refresh with all nodes known "
              f"{r['refresh_known_cpu_ms']:.2f} ms cpu per round", flush=True)
    from flcore.config import defaults

    node_state = []
    for n in args.clients:
        r = flower_node_state_cost(n, defaults())
        node_state.append(r)
        print(f"[flower] N={n:5d}: {r['linkstate_kib_per_node']:.2f} KiB per node in the SuperLink state, "
              f"{r['context_kib_per_node']:.2f} KiB per node Context (full run config)", flush=True)
    idle = ray_idle_cpu(20.0)
    print(f"[ray] idle Ray (2 CPUs, no dashboard): {idle['cpu_per_wall_s']:.3f} CPU s per wall s", flush=True)
    path = write_result("engine", {"machine": machine(), "args": vars(args), "exchange": exchange, "poll": poll,
                                   "registry": registry, "node_state": node_state, "ray_idle": idle})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
