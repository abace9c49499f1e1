"""What the engine's use of Flower's private members saves, and what the public-API model pool costs.

Issue round-pipeline item 3: torch's private module state is no longer read (the model pool checks the model's
structure through ``modules()`` / ``parameters()`` / ``buffers()``), and Flower's private members are touched
only in flcore/internals.py, whose every function has a public path (``NONIID_FL_PUBLIC_ONLY=1``). Printed,
from one run:

1. per message, the model the ClientApp needs: built anew (``models.build_model``) against reused from the
   pool and loaded with the received weights (digits MLP; Fashion-MNIST ConvNet);
2. CPU per round of the tiny job (FedAvg on digits, in-process engine, 10 clients) with flcore/internals.py's
   private paths and with its public ones, alternated ``--repeats`` times (median of each).

    python -m benchmarks.bench_public_api [--rounds 10] [--clients 10] [--repeats 3]
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

MODELS = (("digits", (1, 8, 8), "mlp"), ("fmnist", (1, 28, 28), "convnet"))


def model_costs(messages: int = 300) -> list[dict]:
    """Per message: ms to build the model, and ms to take it from the pool, load weights and give it back."""
    from client_app.model_pool import ModelPool
    from flcore.config import RunConfig, resolve_run_config
    from flcore.records import model_params
    from models import build_model

    rows = []
    for dataset, shape, model in MODELS:
        cfg = RunConfig.from_dict(resolve_run_config({"dataset": dataset, "model": model}))

        def build(cfg: RunConfig = cfg, shape: tuple[int, ...] = shape) -> torch.nn.Module:
            return build_model(cfg, shape, 10)

        params = dict(model_params(build()))
        t = time.perf_counter()
        for _ in range(messages):
            build()
        built = (time.perf_counter() - t) / messages
        pool = ModelPool()
        first = pool.get("k", build, 0)
        pool.give_back(first)
        del first
        t = time.perf_counter()
        for _ in range(messages):
            m = pool.get("k", build, 0)
            pool.load(m, params)
            if not pool.give_back(m):
                raise RuntimeError("the pool refused an unchanged model")
            del m
        reused = (time.perf_counter() - t) / messages
        rows.append({"dataset": dataset, "model": model, "build_ms": built * 1e3, "pool_reuse_and_load_ms": reused * 1e3,
                     "build_over_reuse": built / reused})
    return rows


def round_costs(rounds: int, clients: int, repeats: int, out_dir: str) -> dict:
    """CPU per round of the tiny job with the private and the public paths of flcore/internals.py."""
    from benchmarks.bench_client_floor import engine_round_cpu
    from benchmarks.bench_overhead import workload
    from flcore import internals

    cpu: dict[str, list[float]] = {"private": [], "public": []}
    accuracy: dict[str, list[float]] = {}
    try:
        for k in range(repeats):
            for mode in ("private", "public"):
                internals.PUBLIC_ONLY = mode == "public"
                value, acc = engine_round_cpu(workload(rounds, f"{out_dir}/{mode}-{k}", "digits", 0), clients,
                                              "client_app.app:app")
                cpu[mode].append(value)
                accuracy[mode] = acc
    finally:
        internals.PUBLIC_ONLY = False
    if accuracy["private"] != accuracy["public"]:
        raise RuntimeError(f"the two paths learned differently: {accuracy}")
    private, public = statistics.median(cpu["private"]), statistics.median(cpu["public"])
    return {"cpu_per_round_s": cpu, "private_median_s": private, "public_median_s": public,
            "public_over_private": public / private, "same_accuracy_every_round": True}


def main() -> None:
    from benchmarks.harness import machine, parser, write_result

    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--messages", type=int, default=300)
    args = ap.parse_args()
    if args.rounds < 3 or args.repeats < 1:
        ap.error("--rounds must be >= 3 (the steady state is rounds 2 .. R-1) and --repeats >= 1")
    torch.set_num_threads(1)
    started = machine()
    models = model_costs(args.messages)
    for row in models:
        print(f"{row['dataset']} {row['model']}: build {row['build_ms']:.3f} ms, pool reuse + load "
              f"{row['pool_reuse_and_load_ms']:.3f} ms per message ({row['build_over_reuse']:.1f}x)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_public_api_") as tmp:
        rounds = round_costs(args.rounds, args.clients, args.repeats, tmp)
    print(f"tiny job (digits FedAvg, {args.clients} clients): CPU per round {rounds['private_median_s'] * 1e3:.2f} ms "
          f"with flcore/internals.py's private paths, {rounds['public_median_s'] * 1e3:.2f} ms with its public ones "
          f"({rounds['public_over_private']:.3f}x); the same accuracy every round", flush=True)
    path = write_result("public_api", {"machine": started, "args": vars(args), "models": models, "rounds": rounds})
    print(f"-> {path}")


if __name__ == "__main__":
    main()
