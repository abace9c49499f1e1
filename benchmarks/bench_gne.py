"""GNE aggregation cost vs model size and K, against the local training it aggregates (issue 10, item 2).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_gne [--models mlp convnet resnet18] [--clients 10 50 100]

For each model (FedRANE's: extractor + LRA neck + head, as ``build_model`` makes it for method=fedrane)
and each K, the whole ``GNEStrategy.aggregate`` of one round is timed in CPU time, cold start (Gram matrix
over every floating tensor in float64, Nash solve, step coefficients, combination): median over
``--repeats``. K client models are made from the global one plus correlated deltas (a shared drift plus
client-specific parts of five sizes), so the solver sees a well-posed, non-trivial Gram matrix.

The reference is the local training of one FedRANE round with the paper's setup (5 local epochs, batch
128) on ``--local-samples`` samples per client (default 500: CIFAR-10's 50,000 over 100 clients): the
measured CPU time of one LRA training step at batch 128 (median of ``--steps``, after a warm-up) times
the number of steps. The plain step of the same model is timed alongside (the LRA/plain step ratio). Two ratios are printed:

* GNE / one client's local round -- the deployment view: clients train in parallel and the server
  aggregates after the slowest one, so this is the share GNE adds to a round's critical path;
* GNE / (K x one client's local round) -- one box simulating every client on one worker, one after another.

Inputs: mlp and convnet on 1x28x28 (MNIST-shaped), resnet18 on 3x32x32 (CIFAR-shaped), 10 classes.
"""

from __future__ import annotations

import math
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.harness import machine, parser, write_result  # noqa: E402
from client_app.training import OptimConfig, make_optimizer  # noqa: E402
from flcore.config import RunConfig, resolve_run_config  # noqa: E402
from models import build_model  # noqa: E402
from flcore.methods.fedrane import before_issue_40  # noqa: E402
from models.fedrane.neck import contrastive_discrimination  # noqa: E402
from strategies.base import ClientUpdate  # noqa: E402
from strategies.methods.fedrane.strategy import GNEStrategy  # noqa: E402

INPUT_SHAPES = {"mlp": (1, 28, 28), "convnet": (1, 28, 28), "resnet18": (3, 32, 32), "vgg11": (3, 32, 32)}


def fedrane_config(model: str, **over) -> RunConfig:
    # the fedrane defaults its recorded results ran with (before issue 40)
    return RunConfig.from_dict(resolve_run_config({"dataset": "mnist-5k", "model": model, "method": "fedrane",
                                                   **before_issue_40("fedrane"), **over}))


def global_params(cfg: RunConfig, model: str) -> dict[str, np.ndarray]:
    net = build_model(cfg, INPUT_SHAPES[model], 10)
    return {n: v.detach().numpy().copy() for n, v in net.state_dict().items()}


def client_updates(glob: dict[str, np.ndarray], k: int, seed: int = 0) -> list[ClientUpdate]:
    """K updates around ``glob``: a shared drift plus client-specific parts of varying size (float tensors
    only; integer buffers are copied)."""
    rng = np.random.default_rng(seed)
    floating = {n for n, v in glob.items() if np.issubdtype(v.dtype, np.floating)}
    common = {n: rng.standard_normal(glob[n].shape, dtype=np.float32) * 0.01 for n in floating}
    updates = []
    for cid in range(k):
        s = np.float32(0.005 * (1 + cid % 5))
        params = {n: (v + common[n] + rng.standard_normal(v.shape, dtype=np.float32) * s) if n in floating
                  else v.copy() for n, v in glob.items()}
        updates.append(ClientUpdate(cid, params, 50 + 10 * cid, {}, {}))
    return updates


def time_gne(cfg: RunConfig, glob: dict[str, np.ndarray], updates: list[ClientUpdate], repeats: int
             ) -> dict[str, float]:
    """CPU seconds of one whole GNE aggregation (median, cold start), with the aggregator's own wall-clock
    split into Gram / solve / rest and the solver's iterations and residual."""
    totals, gram, solve, iters, resid = [], [], [], 0, float("nan")
    for _ in range(repeats):
        strat = GNEStrategy(cfg)
        t = time.process_time()
        strat.aggregate(1, glob, updates)
        totals.append(time.process_time() - t)
        m = strat._metrics
        gram.append(m["gne-gram-seconds"])
        solve.append(m["gne-solve-seconds"])
        iters, resid = m["gne-iterations"], m["gne-residual"]
    return {"gne_cpu_s": statistics.median(totals), "gram_wall_s": statistics.median(gram),
            "solve_wall_s": statistics.median(solve), "iterations": iters, "residual": resid}


def step_seconds(model: str, steps: int, batch: int) -> dict[str, float]:
    """Median CPU seconds of one training step at ``batch`` on random inputs of the model's input shape:
    ``lra`` = FedRANE's step (features, LRA augmentation, CE + lambda_CD L_CD, backward, SGD update),
    ``lra-closed-form`` = the same with ``fedrane.lra-graph=closed-form`` (the authors' one-shot SLIM graph),
    ``plain`` = the same model's plain CE step (the base trainer's forward). The variants are interleaved
    so that load changes hit them alike; one untimed warm-up step each."""
    nets = {}
    variants = (("plain", {"method": "fedavg"}), ("lra", {}), ("lra-closed-form", {"fedrane.lra-graph": "closed-form"}))
    for variant, over in variants:
        net = build_model(fedrane_config(model, **over), INPUT_SHAPES[model], 10)
        net.train()
        nets[variant] = (net, make_optimizer(net.parameters(), OptimConfig(lr=0.05, epochs=1, batch_size=batch)))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *INPUT_SHAPES[model], generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)

    def one(variant: str) -> float:
        net, opt = nets[variant]
        t = time.process_time()
        z = net.features(x)
        if variant == "plain":
            loss = F.cross_entropy(net.head(net.neck(z)), y)
        else:
            z_hat = net.neck.augment(z)
            loss = F.cross_entropy(net.head(net.neck.mix(z, z_hat)), y) + 0.2 * contrastive_discrimination(z, z_hat)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return time.process_time() - t

    times: dict[str, list[float]] = {v: [] for v in nets}
    for i in range(steps + 1):
        for variant in times:
            dt = one(variant)
            if i:
                times[variant].append(dt)
    return {v: statistics.median(t) for v, t in times.items()}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--models", nargs="+", default=["mlp", "convnet", "resnet18"], choices=sorted(INPUT_SHAPES))
    ap.add_argument("--clients", nargs="+", type=int, default=[10, 50, 100])
    ap.add_argument("--solvers", nargs="+", default=["cvxpy", "newton"], choices=["cvxpy", "newton"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="timed training steps per model (median)")
    ap.add_argument("--local-samples", type=int, default=500)
    ap.add_argument("--local-epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--name", default="gne")
    args = ap.parse_args()
    from strategies.methods.fedrane.nash import solve_nash_cvxpy
    solve_nash_cvxpy(np.eye(3))  # pay cvxpy's one-off import/canonicalisation before timing
    steps_per_round = args.local_epochs * math.ceil(args.local_samples / args.batch_size)
    print(f"torch threads {torch.get_num_threads()}; local round = {args.local_epochs} epochs x "
          f"ceil({args.local_samples}/{args.batch_size}) = {steps_per_round} LRA steps", flush=True)
    rows, models = [], {}
    for model in args.models:
        cfg = fedrane_config(model)
        glob = global_params(cfg, model)
        n_params = int(sum(v.size for v in glob.values() if np.issubdtype(v.dtype, np.floating)))
        step = step_seconds(model, args.steps, args.batch_size)
        local_round = step["lra"] * steps_per_round
        models[model] = {"params": n_params, "input_shape": INPUT_SHAPES[model], "lra_step_cpu_s": step["lra"],
                         "plain_step_cpu_s": step["plain"], "lra_step_ratio": step["lra"] / step["plain"],
                         "lra_closed_form_step_cpu_s": step["lra-closed-form"],
                         "lra_closed_form_step_ratio": step["lra-closed-form"] / step["plain"],
                         "local_round_cpu_s": local_round}
        print(f"[{model}] {n_params / 1e6:.2f}M parameters; step at batch {args.batch_size}: plain "
              f"{step['plain']:.3f} s, LRA {step['lra']:.3f} s CPU (ratio {step['lra'] / step['plain']:.2f}; closed-form "
              f"graph {step['lra-closed-form'] / step['plain']:.2f}); one "
              f"client's local round {local_round:.1f} s CPU", flush=True)
        updates = client_updates(glob, max(args.clients))
        for k in sorted(args.clients):
            for solver in args.solvers:
                solver_cfg = fedrane_config(model, **{"fedrane.gne-solver": solver})
                r = time_gne(solver_cfg, glob, updates[:k], args.repeats)
                r.update({"model": model, "params": n_params, "clients": k, "solver": solver,
                          "vs_one_client_round": r["gne_cpu_s"] / local_round,
                          "vs_all_clients_sequential": r["gne_cpu_s"] / (k * local_round)})
                rows.append(r)
                print(f"  K={k:3d} {solver:6s}: GNE {r['gne_cpu_s']:7.3f} s CPU (Gram {r['gram_wall_s']:.3f} s, "
                      f"solve {r['solve_wall_s']:.4f} s wall, {r['iterations']} it, residual {r['residual']:.1e}) = "
                      f"{100 * r['vs_one_client_round']:.2f}% of one client's local round, "
                      f"{100 * r['vs_all_clients_sequential']:.3f}% of K clients' rounds", flush=True)
        del updates
    path = write_result(args.name, {"machine": machine(), "args": vars(args), "steps_per_round": steps_per_round,
                                    "models": models, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
