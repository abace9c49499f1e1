"""fp32 against bf16-mixed + channels-last (run-config precision / memory-format), side by side in one run.

Two parts, both on this machine's CPU (docs/PERFORMANCE.md, section 8):

1. **Rounds** through the real engine (engines.run_local, in process): per job and thread count, a run at fp32 and
   one at ``precision = bf16-mixed`` (``memory-format = auto``: channels-last for the ConvNet), interleaved; the
   seconds of every round after the first (the first holds start-up and the data's first load), wall and CPU.
   Jobs: the Fashion-MNIST FedAvg round (20 clients, Dirichlet(0.1), one epoch of B = 64, the ConvNet), a
   FedRANE round on the same federation (local steps capped: its LRA graph per batch makes a full epoch long),
   the mnist-5k ConvNet (10 clients) and the digits MLP (10 clients).
2. **Where the time goes** in a plain loop of the same ConvNet (B = 64): images per second of forward + backward
   alone, of the optimizer step alone (fp32 in both: parameters stay fp32) and of evaluation (B = 512, no
   gradients), per precision and layout: the ceiling the rounds are measured against.

    python -m benchmarks.bench_precision [--rounds 3] [--threads 1 2] [--jobs fmnist-fedavg ...]
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.harness import machine, parser, run_inprocess, write_result  # noqa: E402

ARMS = {"fp32": {"precision": "fp32"}, "bf16-mixed": {"precision": "bf16-mixed"}}
FMNIST = {"dataset": "fmnist", "model": "convnet", "partition": "dirichlet", "dirichlet-alpha": 0.1,
          "local-epochs": 1, "batch-size": 64, "fraction-train": 1.0}
JOBS: dict[str, tuple[dict, int]] = {   # name -> (run config, clients)
    "fmnist-fedavg": ({**FMNIST, "method": "fedavg"}, 20),
    "fmnist-fedrane": ({**FMNIST, "method": "fedrane", "max-local-steps": 20}, 20),
    "mnist5k-convnet": ({"method": "fedavg", "dataset": "mnist-5k", "model": "convnet", "local-epochs": 1,
                         "batch-size": 32}, 10),
    "digits-mlp": ({"method": "fedavg", "dataset": "digits", "model": "mlp", "local-epochs": 1,
                    "batch-size": 32}, 10),
}


def run_round_job(name: str, arm: str, rounds: int) -> dict:
    base, clients = JOBS[name]
    with tempfile.TemporaryDirectory(prefix="bench_precision_") as tmp:
        cfg = {**base, **ARMS[arm], "num-server-rounds": rounds, "seed": 0, "federated-eval-every": 0,
               "checkpoint": False, "out-dir": tmp}
        res = run_inprocess(cfg, clients)
    ends, cpu = res["round_ends"], res["round_end_cpu"]
    wall = [b - a for a, b in zip(ends, ends[1:])]
    cpus = [b - a for a, b in zip(cpu, cpu[1:])]
    rows = res["doc"]["rounds"]
    return {"wall_per_round_s": sum(wall) / len(wall), "cpu_per_round_s": sum(cpus) / len(cpus),
            "rounds_timed": len(wall), "final_global_accuracy": rows[-1].get("global_accuracy")}


def _convnet():
    from models.networks import convnet

    torch.manual_seed(0)
    body, dim = convnet((1, 28, 28))
    return torch.nn.Sequential(body, torch.nn.Linear(dim, 10))


def loop_parts(arm: str, channels_last: bool, batches: int = 40) -> dict:
    """Images per second of a plain ConvNet loop's parts (B = 64): forward + backward, optimizer step, evaluation."""
    from models.numerics import Numerics, applied

    model = _convnet()
    numerics = Numerics(ARMS[arm]["precision"], "channels-last" if channels_last else "contiguous")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batches * 64, 1, 28, 28, generator=g), torch.randint(0, 10, (batches * 64,), generator=g)
    out = {}
    with applied(model, numerics, torch.device("cpu")):
        for phase in ("warm", "timed"):
            t_fb = t_step = 0.0
            for i in range(batches):
                xb, yb = x[i * 64:(i + 1) * 64], y[i * 64:(i + 1) * 64]
                t0 = time.perf_counter()
                loss = F.cross_entropy(model(xb).float(), yb)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                t1 = time.perf_counter()
                opt.step()
                t_step += time.perf_counter() - t1
                t_fb += t1 - t0
            t0 = time.perf_counter()
            with torch.no_grad():
                for i in range(0, x.shape[0], 512):
                    model(x[i:i + 512]).argmax(1)
            t_eval = time.perf_counter() - t0
            if phase == "timed":
                n = batches * 64
                out = {"forward_backward_img_s": n / t_fb, "optimizer_step_img_s": n / t_step,
                       "train_img_s": n / (t_fb + t_step), "eval_img_s": n / t_eval}
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    ap.add_argument("--name", default="precision")
    args = ap.parse_args()
    rows, parts = [], []
    info = machine()
    info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    for threads in args.threads:
        torch.set_num_threads(threads)
        for arm, last in (("fp32", False), ("fp32", True), ("bf16-mixed", False), ("bf16-mixed", True)):
            p = {"threads": threads, "precision": arm, "channels_last": last, **loop_parts(arm, last)}
            parts.append(p)
            print(p, flush=True)
        for job in args.jobs:
            for arm in ARMS:  # fp32 first, then bf16, for each job and thread count: interleaved
                row = {"job": job, "threads": threads, "precision": arm, "load_at_start": os.getloadavg()[0],
                       **run_round_job(job, arm, args.rounds)}
                rows.append(row)
                print(row, flush=True)
    path = write_result(args.name, {"machine": info, "rounds": args.rounds, "jobs": {k: {"run_config": v[0],
                                    "clients": v[1]} for k, v in JOBS.items()}, "rows": rows, "loop_parts": parts})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
