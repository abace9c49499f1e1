"""apple/pfl-research on the jobs of bench_overhead: its per-round time next to a plain PyTorch loop.

pfl is not a dependency of this project: install it in a separate environment (it pins its own torch),
e.g. ``python3 -m venv /tmp/pflvenv && /tmp/pflvenv/bin/pip install "pfl[pytorch]"``. This script exports
the job from this project's data code (each client's train/test split of the Dirichlet(0.5) partition, the
global test set, the initial weights of the model) and runs benchmarks/pfl_side.py in that environment,
which times a plain loop and pfl's FedAvg back to back on the same torch (see its docstring for what
each does). Ratios pfl/plain are taken within a repeat; steady state = median interval between round ends
after round 1, start-up = time to the end of round 1 minus one steady round (from the variant's start:
data already in memory, imports done).

    python -m benchmarks.bench_pfl --dataset digits --pfl-python /tmp/pflvenv/bin/python [--repeats 3]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from benchmarks.harness import machine, parser, write_result  # noqa: E402
from benchmarks.stats import paired_ratios, steady_state, summary  # noqa: E402

SIDE = Path(__file__).resolve().parent / "pfl_side.py"


def export_job(path: Path, dataset: str, clients: int, seed: int = 0) -> dict:
    """The bench_overhead workload (FedAvg, Dirichlet(0.5), batch 32, one local epoch) as arrays."""
    from data_partitioning.datasets import dataset_shape
    from data_partitioning.federated import client_arrays, global_test_set
    from flcore.config import RunConfig, resolve_run_config
    from flcore.records import model_params
    from models import build_model, model_name

    cfg = RunConfig.from_dict(resolve_run_config({"dataset": dataset, "partition": "dirichlet", "seed": seed}))
    in_shape, classes = dataset_shape(cfg.dataset)
    init = list(model_params(build_model(cfg, in_shape, classes)).values())
    x_test, y_test = global_test_set(cfg, clients)
    arrays = {"model": np.array(model_name(cfg)), "in_shape": np.array(in_shape), "classes": np.array(classes),
              "lr": np.array(cfg.lr), "batch_size": np.array(cfg.batch_size), "seed": np.array(seed),
              "num_clients": np.array(clients), "num_init": np.array(len(init)), "x_test": x_test, "y_test": y_test}
    arrays.update({f"init_{i}": a for i, a in enumerate(init)})
    sizes = []
    for c in range(clients):
        a = client_arrays(cfg, c, clients)
        arrays.update({f"xtr_{c}": a.x_train, f"ytr_{c}": a.y_train, f"xte_{c}": a.x_test, f"yte_{c}": a.y_test})
        sizes.append(int(len(a.y_train)))
    np.savez(path, **arrays)
    return {"model": model_name(cfg), "client_sizes": sizes, "lr": cfg.lr, "batch_size": cfg.batch_size}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pfl-python", default="/tmp/pflvenv/bin/python")
    ap.add_argument("--name", default=None, help="result name (default pfl_<dataset>)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_pfl_") as tmp:
        job_path = Path(tmp) / "job.npz"
        job = export_job(job_path, args.dataset, args.clients)
        proc = subprocess.run([args.pfl_python, str(SIDE), str(job_path), "--rounds", str(args.rounds),
                               "--repeats", str(args.repeats)], capture_output=True, text=True, check=False)
    sys.stderr.write(proc.stderr[-3000:])
    if proc.returncode != 0:
        raise SystemExit(f"pfl side failed (exit {proc.returncode})")
    side = json.loads(proc.stdout.strip().splitlines()[-1])
    pkg = subprocess.run([args.pfl_python, "-c", "import importlib.metadata as m; print(m.version('pfl'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    reps = []
    for rep in side["repeats"]:
        row = {}
        for name in ("plain", "pfl"):
            r = rep[name]
            wall, cpu = steady_state(r["t_start"], r["round_ends"]), steady_state(r["cpu_start"], r["round_end_cpu"])
            row[name] = {"per_round_s": wall["per_round_s"], "startup_s": wall["startup_s"],
                         "cpu_per_round_s": (r["round_end_cpu"][-1] - r["round_end_cpu"][0]) / (len(r["round_end_cpu"]) - 1),
                         "cpu_startup_s": cpu["startup_s"], "accuracy": r["accuracy"]}
        row["pfl/plain"] = row["pfl"]["per_round_s"] / row["plain"]["per_round_s"]
        row["pfl/plain cpu"] = row["pfl"]["cpu_per_round_s"] / row["plain"]["cpu_per_round_s"]
        row["loadavg_after"] = rep["loadavg_after"]
        reps.append(row)
        print(f"plain {row['plain']['per_round_s']:.4f}s pfl {row['pfl']['per_round_s']:.4f}s per round: "
              f"pfl/plain wall {row['pfl/plain']:.3f} cpu {row['pfl/plain cpu']:.3f} | final accuracy plain "
              f"{row['plain']['accuracy'][-1]:.3f} pfl {row['pfl']['accuracy'][-1] if row['pfl']['accuracy'] else None}",
              flush=True)
    out = {"machine": machine(), "args": vars(args), "job": job, "pfl_version": pkg, "pfl_torch": side["torch"],
           "pfl_import_s": side["pfl_import_s"], "repeats": reps}
    for clock, field in (("", "per_round_s"), (" cpu", "cpu_per_round_s")):
        out[f"pfl/plain{clock}"] = summary(paired_ratios([r["pfl"][field] for r in reps],
                                                         [r["plain"][field] for r in reps]))
    for name in ("plain", "pfl"):
        for field in ("per_round_s", "cpu_per_round_s", "startup_s", "cpu_startup_s"):
            out[f"{name}.{field}"] = summary([r[name][field] for r in reps])
    path = write_result(args.name or f"pfl_{args.dataset}", out)
    print(f"== pfl/plain per round: wall {out['pfl/plain']['median']:.3f} [{out['pfl/plain']['min']:.3f}, "
          f"{out['pfl/plain']['max']:.3f}], cpu {out['pfl/plain cpu']['median']:.3f}; wrote {path}")


if __name__ == "__main__":
    main()
