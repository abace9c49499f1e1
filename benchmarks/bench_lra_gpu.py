"""Local-step wall time of FedRANE and fedrane-code next to FedAvg's on one device, with and without per-step host
synchronisations, in one process (scripts/lra_gpu_bench.sh runs it on a GPU):

    python -m benchmarks.bench_lra_gpu [--device cuda] [--steps 200] [--warmup 20] [--repeats 3]
        [--methods fedavg fedrane fedrane-code] [--out lra_gpu]

Each method: preset ``fedrane-fmnist-dir01`` with ``method`` replaced (ConvNet, batch 128, the paper's FedRANE
keys: complete graph, one message-passing step) and lr 0.05, on Fashion-MNIST-shaped random data
(steps x 128 rows of 1 x 28 x 28, 10 classes, generated on the device: no dataset needed), through the method's
own trainer (client_app/trainers) and the one local loop. A timing is ``--steps`` local steps (one ``fit``),
the trainer's metrics read at the end, the device synchronised before and after; ``--warmup`` steps first.
Two modes, alternated ``--repeats`` times in the same process, the median kept:

* ``after``: this code (running sums on the device, read once when the metrics are built);
* ``before``: the same code with the per-step host reads of the code before restored (``float()`` of each step's
  loss, of each L_CD / mixup value and of each graph's density sum, as the loop and the trainer did). The other
  changes (cached constants, non-blocking copies of fedrane-code's mixup permutation and dropout mask) stay,
  so ``before`` is the old step's cost minus those.

What it measures is local training, the part of a round this change touches; a round also evaluates (40,000
images in the preset) and aggregates. The committed round figures of one H200 (20 runs sharing it, docs/FEDRANE.md
section 7): FedRANE 3.6x FedAvg's round, fedrane-code 9x. Writes benchmarks/results/<--out>.json.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from benchmarks.harness import loadavg, machine, parser, write_result
from flcore.methods.fedrane import before_issue_40

PRESET = "fedrane-fmnist-dir01"
SHAPE, CLASSES, BATCH = (1, 28, 28), 10, 128


def make_trainer(method: str, steps: int, device: torch.device, seed: int = 0):  # noqa: ANN201 - a Trainer
    """The method's trainer on a fresh model and ``steps`` batches of random FMNIST-shaped data on ``device``."""
    from flwr.app import RecordDict

    from client_app.state import ClientState
    from client_app.trainers.base import ClientData, TrainJob
    from flcore.config import RunConfig, resolve_run_config
    from flcore.registry import get_method, resolve
    from models import build_model

    # the FedRANE values its recorded results ran with (the defaults before issue 40; the preset's complete graph)
    cfg = RunConfig.from_dict(resolve_run_config({"preset": PRESET, "method": method, "lr": 0.05,
                                                  **before_issue_40("fedrane"), **before_issue_40("fedrane-code"),
                                                  "fedrane.lra-cut": "none",
                                                  "max-local-steps": steps, "local-epochs": 1}))
    torch.manual_seed(seed)
    model = build_model(cfg, SHAPE, CLASSES).to(device)
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(steps * BATCH, *SHAPE, generator=g, device=device)
    y = torch.randint(0, CLASSES, (steps * BATCH,), generator=g, device=device)
    data = ClientData(x, y, x[:0], y[:0], CLASSES)
    glob = {k: v.detach().clone() for k, v in model.state_dict().items()}
    job = TrainJob(cfg, 0, 1, model, glob, data, {}, {}, ClientState(RecordDict(), 0), device,
                   torch.Generator().manual_seed(seed))
    trainer = resolve(get_method(method).trainer)(job)
    neck = getattr(trainer, "neck", None)
    if neck is not None:
        neck.generator = job.generator   # as LRATrainer.run sets it (fedrane-code's dropout)
    return trainer


@contextmanager
def per_step_syncs() -> Iterator[None]:
    """The code before: every running sum also read to the host each step (float(), as it was summed)."""
    from models.device_sum import DeviceSum

    add = DeviceSum.add

    def add_and_read(self: DeviceSum, value: torch.Tensor) -> None:
        float(value.detach())  # the loop's loss, L_CD and mixup terms, each graph's density sum
        add(self, value)

    DeviceSum.add = add_and_read
    try:
        yield
    finally:
        DeviceSum.add = add


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_fit(trainer: Any, device: torch.device) -> tuple[float, int]:
    """(wall seconds, steps) of one ``fit`` and the reads of its metrics."""
    sync(device)
    t = time.perf_counter()
    stats = trainer.fit()
    trainer.extra_metrics(stats)
    _ = stats.mean_loss
    sync(device)
    return time.perf_counter() - t, stats.steps


def measure(method: str, steps: int, warmup: int, repeats: int, device: torch.device) -> dict[str, Any]:
    """Median seconds per local step of ``method`` in each mode (alternated, same trainer and data)."""
    timer, warm = make_trainer(method, steps, device), make_trainer(method, warmup, device)
    timed_fit(warm, device)
    with per_step_syncs():
        timed_fit(warm, device)
    times: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(repeats):
        with per_step_syncs():
            s, n = timed_fit(timer, device)
        times["before"].append(s / n)
        s, n = timed_fit(timer, device)
        times["after"].append(s / n)
    return {mode: {"ms_per_step": 1e3 * statistics.median(v), "all_ms": [1e3 * x for x in v]}
            for mode, v in times.items()}


def main() -> None:
    ap = parser(__doc__, summary=True)
    ap.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a check that it runs)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", nargs="*", default=["fedavg", "fedrane", "fedrane-code"])
    ap.add_argument("--out", default="lra_gpu", help="result file benchmarks/results/<out>.json")
    args = ap.parse_args()
    if args.methods[:1] != ["fedavg"]:
        raise SystemExit("--methods must start with fedavg (the ratios are to FedAvg's)")
    if min(args.steps, args.warmup, args.repeats) < 1:
        raise SystemExit("--steps, --warmup and --repeats must be >= 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this benchmark times a GPU; `--device cpu` checks that it runs")
    info = machine()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    res = {m: measure(m, args.steps, args.warmup, args.repeats, device) for m in args.methods}
    ratios = {mode: {m: res[m][mode]["ms_per_step"] / res["fedavg"][mode]["ms_per_step"] for m in res}
              for mode in ("before", "after")}
    print(f"device {gpu or device}: ms per local step (median of {args.repeats}), / FedAvg's")
    for m in res:
        b, a = res[m]["before"]["ms_per_step"], res[m]["after"]["ms_per_step"]
        print(f"  {m:14s} before {b:8.3f} ms ({ratios['before'][m]:.2f}x)   after {a:8.3f} ms "
              f"({ratios['after'][m]:.2f}x)", flush=True)
    path = write_result(args.out, {"machine": info, "device": str(device), "gpu": gpu, "preset": PRESET,
                                   "batch_size": BATCH, "steps": args.steps, "warmup": args.warmup,
                                   "repeats": args.repeats, "per_method": res, "ratio_vs_fedavg": ratios,
                                   "loadavg_at_end": loadavg()})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
