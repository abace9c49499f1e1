"""Tensor operations FedRANE dispatches next to FedAvg's, per local step and per evaluated image (issue 31 item 4).

    OMP_NUM_THREADS=1 python -m benchmarks.bench_lra_ops [--clients 2] [--steps 2 6] [--images 256]
        [--set key=value ...]          # --report prints docs/FEDRANE.md's table from the result file

Why count operations: on a GPU a small ConvNet's step is bound by launching kernels, not by arithmetic, so a
round's time follows the number of operations it dispatches (each is one or more kernel launches and, with many
processes sharing one GPU, one trip through the driver). On one H200, with 20 runs sharing it, a FedRANE round
of the preset took 114 s against FedAvg's 32 s (results/fmnist-table-dir01-gpu), where the CPU benchmark
(benchmarks/bench_fedrane_round.py) measures 1.22x: on a CPU the convolutions dominate, on a GPU the count does.

What is counted: every ATen operation dispatched (a TorchDispatchMode that counts calls), in the real round
(tests/fakegrid.py + the round driver, as bench_fedrane_round runs it), preset ``fedrane-fmnist-dir01`` with
``method`` replaced. Per local step: the difference between rounds capped at two step counts, divided by the
extra steps of all clients (those rounds evaluate nothing). Per evaluated image: the G-FL evaluation of ``--images`` test images with the
initial model, each graph path of bench_fedrane_round's probe. Writes benchmarks/results/lra_ops.json.

Host synchronisations per local step are counted the same way (:class:`OpCounter`): each dispatched operation
whose result the host must read (``float(t)``, ``bool(t)``, ``.item()``, ``nonzero``, boolean-mask indexing) and
each call of ``Tensor.cpu/numpy/tolist``. On a GPU every one of them stalls the host until the queue drains, so
the launches of the next step cannot overlap the kernels of this one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from benchmarks.bench_fedrane_round import PRESET, PROBE, job  # noqa: E402
from benchmarks.harness import machine, parser, print_report, set_overrides, write_result  # noqa: E402

RESULT = "lra_ops"
NO_EVAL = {"test-evaluation": False, "local-test-fraction": 0.0}  # the step-counting rounds: training alone


# operations whose result the host reads (a Python number, or a shape that depends on the data): on a GPU each
# one waits until every kernel queued before it has run
SYNC_OPS = frozenset({"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten._unique2",
                      "aten.unique_dim", "aten.unique_consecutive", "aten.equal", "aten.allclose"})
INDEX_OPS = frozenset({"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"})
# Tensor methods that copy to host memory: no-ops on a CPU tensor (nothing is dispatched), a device-to-host copy
# that waits for the queue on a GPU, so their calls are counted too
HOST_COPIES = ("cpu", "numpy", "tolist")


def is_sync(func, args: tuple) -> bool:  # noqa: ANN001 - an OpOverload
    """Whether dispatching ``func`` on ``args`` makes the host wait for the device: a scalar read, an output
    shape that depends on the values, or indexing with a boolean mask (a hidden nonzero)."""
    name = str(func.overloadpacket)
    if name in SYNC_OPS:
        return True
    if name in INDEX_OPS:
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices)
    return False


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations dispatched while active (views and in-place updates included), and among
    them the host synchronisations (:func:`is_sync`) plus the calls of :data:`HOST_COPIES`.

    What a CPU run cannot see: a blocking host-to-device copy (``.to('cuda')`` of a CPU tensor without
    ``non_blocking``), which is no operation at all when everything is on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.syncs = 0
        self._saved: dict[str, Any] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        self.count += 1
        self.syncs += is_sync(func, args)
        return func(*args, **(kwargs or {}))

    def _counting(self, name: str) -> Any:
        original = self._saved[name]

        def method(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.syncs += 1
            return original(tensor, *args, **kwargs)
        return method

    def __enter__(self) -> "OpCounter":
        for name in HOST_COPIES:
            self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counting(name))
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            for name, original in self._saved.items():
                setattr(torch.Tensor, name, original)
            self._saved.clear()


def round_ops(overrides: dict[str, Any], clients: int) -> tuple[int, int]:
    """(operations, host synchronisations) of one in-process round (training, evaluations, aggregation)."""
    from flcore.config import RunConfig, resolve_run_config
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    from models.fedrane.neck import clear_constants

    cfg = RunConfig.from_dict(resolve_run_config(overrides))
    clear_constants()   # every counted round builds its cached constants once (the step count is a difference)
    with OpCounter() as counter:
        run_federation(FakeGrid(clients), cfg)
    return counter.count, counter.syncs


def eval_ops(n: int, clients: int, extra: dict[str, Any]) -> dict[str, Any]:
    """Operations of evaluating the first ``n`` test images, per graph path of PROBE."""
    from data_partitioning.federated import global_test_set
    from data_partitioning.support import training_pool_sample
    from flcore.config import RunConfig, resolve_run_config
    from models import build_model
    from models.evaluation import eval_support_size, evaluate, set_eval_support
    from models.fedrane.neck import clear_constants

    out = {}
    for label, over in PROBE.items():
        cfg = RunConfig.from_dict(resolve_run_config({"preset": PRESET, **extra, **over}))
        clear_constants()
        x, y = (torch.as_tensor(a)[:n] for a in global_test_set(cfg, clients))
        model = build_model(cfg, tuple(x.shape[1:]), 10)
        size = eval_support_size(model)
        if size:
            set_eval_support(model, torch.as_tensor(training_pool_sample(cfg, clients, size)))
        with OpCounter() as counter:
            evaluate(model, x, y)
        out[label] = {"images": int(x.shape[0]), "ops": counter.count, "ops_per_image": counter.count / x.shape[0]}
        print(f"  {label:72s} {counter.count:9d} ops / {x.shape[0]} images", flush=True)
    return out


def report(res: dict[str, Any]) -> str:
    """The markdown of docs/FEDRANE.md's operation-count table from an lra_ops result."""
    lines = [f"Measured {res['written']} (`benchmarks/results/{RESULT}.json`, `python -m benchmarks.bench_lra_ops`): "
             f"preset `{res['preset']}`, {res['clients']} clients, rounds capped at {res['steps'][0]} and "
             f"{res['steps'][1]} local steps of B = {res['batch_size']}.", "",
             "| method | operations per local step | / FedAvg's | host synchronisations per local step |",
             "|---|---|---|---|"]
    base = res["per_step"]["fedavg"]
    syncs = res.get("syncs_per_step", {})
    for m, ops in res["per_step"].items():
        lines.append(f"| {m} | {ops:.0f} | {ops / base:.1f} | {syncs[m]:g} |" if m in syncs else
                     f"| {m} | {ops:.0f} | {ops / base:.1f} | not counted |")
    probe = res["eval"]
    first = next(iter(probe.values()))
    lines += ["", f"Evaluating {first['images']} test images at once (G-FL, inductive, the initial model):", "",
              "| evaluation path | operations | / FedAvg's |", "|---|---|---|"]
    for label, r in probe.items():
        lines.append(f"| {label} | {r['ops']} | {r['ops'] / first['ops']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = parser(__doc__, summary=True)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--steps", type=int, nargs=2, default=[2, 6], metavar=("LOW", "HIGH"))
    ap.add_argument("--methods", nargs="*", default=["fedavg", "fedrane", "fedrane-code"])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--set", nargs="*", default=[], help="extra run-config key=value for every method")
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    if args.report:
        print_report(RESULT, report)
        return
    if args.methods[0] != "fedavg":
        raise SystemExit("--methods must start with fedavg (the ratios are to FedAvg's)")
    lo, hi = args.steps
    if not 0 < lo < hi:
        raise SystemExit(f"--steps LOW HIGH needs 0 < LOW < HIGH, got {lo} {hi}")
    torch.set_num_threads(1)
    info = machine()
    per_step, syncs = {}, {}
    extra = set_overrides(args.set)
    with tempfile.TemporaryDirectory() as tmp:
        for m in args.methods:
            (ops_lo, sync_lo), (ops_hi, sync_hi) = (
                round_ops({**job(m, args.clients, 1, s, Path(tmp) / f"{m}-{s}"), **NO_EVAL, **extra}, args.clients)
                for s in (lo, hi))
            per_step[m] = (ops_hi - ops_lo) / (args.clients * (hi - lo))
            syncs[m] = (sync_hi - sync_lo) / (args.clients * (hi - lo))
            print(f"{m:14s} {per_step[m]:9.0f} operations, {syncs[m]:g} host synchronisations per local step",
                  flush=True)
    from flcore.config import RunConfig, resolve_run_config

    batch = RunConfig.from_dict(resolve_run_config({"preset": PRESET})).batch_size
    path = write_result(RESULT, {"machine": info, "preset": PRESET, "clients": args.clients, "steps": [lo, hi],
                                 "batch_size": batch, "per_step": per_step,
                                 "syncs_per_step": syncs, "extra": extra,
                                 "eval": eval_ops(args.images, args.clients, extra)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
