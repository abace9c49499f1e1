"""fp32 / TF32 / bf16-mixed on one GPU shared by 100 clients: clients per second, GPU memory, workers per GPU.

What is timed is the clients' local training as the ClientApp runs it: the project's local loop
(client_app/training.py) under the run-config numerics (models/numerics.py: precision, memory-format auto,
tf32), one epoch of B = 64 on each client's 500 images, SGD with momentum 0.9, then an evaluation of its 100
test images. W worker processes (spawned: each has its own CUDA context, as Ray actors or engine workers do)
share the GPU and train the 100 clients between them, each client's data copied to the device per client (as
``load_client_data`` does per message). Models: the FedRANE/FedUFO ConvNet on Fashion-MNIST-shaped images
(1 x 28 x 28) and the CIFAR ResNet-18 (GroupNorm) on CIFAR-shaped ones (3 x 32 x 32); the images are seeded
random tensors (the GPU machine has no datasets; throughput does not depend on pixel values). Per (model,
numerics, W): clients/s over the timed clients (each worker's first client is a warm-up), the peak memory
torch allocated and reserved per worker, and the whole GPU's used memory at the peak (nvidia-smi, if present).

    python -m benchmarks.bench_precision_gpu                  # on a GPU: writes benchmarks/results/precision_gpu.json
    python -m benchmarks.bench_precision_gpu --dry-run        # anywhere (CPU): 2 tiny clients per case, the same code
                                                              # paths, the file under --out (default a temp dir)
A deadline (``--deadline-s``, default 540) skips the cases left when it passes, so the command fits a
10-minute GPU lease; the file says which ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

NUMERICS = {"fp32": ("fp32", False), "tf32": ("fp32", True), "bf16-mixed": ("bf16-mixed", False)}
MODELS = {"convnet": ((1, 28, 28), "convnet"), "resnet18": ((3, 32, 32), "resnet18")}


def _build(backbone: str, shape: tuple[int, ...]):
    import torch

    from models.networks import BACKBONES

    torch.manual_seed(0)
    body, dim = BACKBONES[backbone](shape)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = body, torch.nn.Linear(dim, 10)

        def forward_features(self, x):  # noqa: ANN001, ANN202 - the local loop's contract
            z = self.body(x)
            return self.head(z), z

        def forward(self, x):  # noqa: ANN001, ANN202
            return self.forward_features(x)[0]

    return Net()


def worker(args: tuple) -> dict[str, Any]:
    """Train clients ``cids`` one after another; (seconds of the timed ones, peak memory). Runs in its own process."""
    model_name, numerics_name, cids, per_client, device_name, batch, barrier_file = args
    import torch

    from client_app.training import OptimConfig, evaluate, local_train
    from models.numerics import Numerics, applied

    torch.set_num_threads(1)
    device = torch.device(device_name)
    shape, backbone = MODELS[model_name]
    precision, tf32 = NUMERICS[numerics_name]
    numerics = Numerics(precision, "auto", tf32)
    model = _build(backbone, shape).to(device)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = OptimConfig(lr=0.01, epochs=1, batch_size=batch, momentum=0.9, weight_decay=5e-4)
    times = []
    while barrier_file and not Path(barrier_file).exists():  # start together: the GPU is shared while timed
        time.sleep(0.01)
    for i, cid in enumerate(cids):
        g = torch.Generator().manual_seed(cid)
        x = torch.randn(per_client + per_client // 5, *shape, generator=g)
        y = torch.randint(0, 10, (x.shape[0],), generator=g)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        xd, yd = x.to(device), y.to(device)
        model.load_state_dict(init)
        with applied(model, numerics, device):
            local_train(model, xd[:per_client], yd[:per_client], cfg, generator=torch.Generator().manual_seed(cid))
            evaluate(model, xd[per_client:], yd[per_client:])
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i > 0:
            times.append(time.perf_counter() - t0)
    peak = reserved = 0
    if device.type == "cuda":
        peak, reserved = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
    return {"timed_clients": len(times), "seconds": sum(times), "peak_allocated_mib": peak / 2 ** 20,
            "peak_reserved_mib": reserved / 2 ** 20}


def gpu_used_mib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
        return float(out.stdout.split()[0]) if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def run_case(model: str, numerics: str, workers: int, clients: int, per_client: int, device: str,
             batch: int) -> dict[str, Any]:
    import multiprocessing as mp

    shares = [list(range(w, clients, workers)) for w in range(workers)]
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as tmp:
        barrier = str(Path(tmp) / "go")
        ctx = mp.get_context("spawn")
        with ctx.Pool(workers) as pool:
            pending = pool.map_async(worker, [(model, numerics, s, per_client, device, batch, barrier) for s in shares])
            time.sleep(0.5)
            t0 = time.perf_counter()
            Path(barrier).touch()
            used = None
            while not pending.ready():
                now = gpu_used_mib()
                used = max(used or 0.0, now) if now is not None else used
                pending.wait(0.5)
            wall = time.perf_counter() - t0
            parts = pending.get()
    timed = sum(p["timed_clients"] for p in parts)
    busiest = max(p["seconds"] for p in parts)
    return {"model": model, "numerics": numerics, "workers": workers, "clients": clients, "timed_clients": timed,
            "clients_per_s": timed / busiest if busiest > 0 else None, "wall_s": wall,
            "peak_allocated_mib_per_worker": max(p["peak_allocated_mib"] for p in parts),
            "peak_reserved_mib_per_worker": max(p["peak_reserved_mib"] for p in parts), "gpu_used_mib_peak": used}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.harness import machine, parser, write_result

    ap = parser(__doc__)
    ap.add_argument("--dry-run", action="store_true", help="CPU, 2 clients of 64 images per case, 1 worker")
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--deadline-s", type=float, default=540.0)
    ap.add_argument("--out", type=Path, default=None, help="result file (default: benchmarks/results/precision_gpu.json; "
                                                           "a dry run: a temporary directory's)")
    args = ap.parse_args(argv)
    import torch

    if args.dry_run:
        device, clients, per_client, workers, batch = "cpu", 2, 64, [1], 32
        cases = [(m, n, w) for m in MODELS for n in ("fp32", "bf16-mixed") for w in workers]
        skipped: list[dict[str, Any]] = [{"numerics": "tf32", "why": "TF32 needs CUDA (a dry run is on the CPU)"}]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --dry-run on a CPU")
        device, clients, per_client, batch = "cuda", args.clients, 500, 64
        cases = [(m, n, w) for m in MODELS for n in NUMERICS for w in args.workers]
        skipped = []
    start, rows = time.monotonic(), []
    for model, numerics, w in cases:
        if time.monotonic() - start > args.deadline_s:
            skipped.append({"model": model, "numerics": numerics, "workers": w, "why": "deadline"})
            continue
        row = run_case(model, numerics, w, clients, per_client, device, batch)
        rows.append(row)
        print(json.dumps(row), flush=True)
    info = machine()
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    payload = {"dry_run": args.dry_run, "machine": info, "per_client_images": per_client, "batch_size": batch,
               "rows": rows, "skipped": skipped}
    if args.out is not None or args.dry_run:
        out = args.out or Path(tempfile.mkdtemp(prefix="precision_gpu_")) / "precision_gpu.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        from flcore.stack import stack_info

        out.write_text(json.dumps({"benchmark": "precision_gpu", "stack": stack_info(), **payload}, indent=1,
                                  default=float))
    else:
        out = write_result("precision_gpu", payload)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
