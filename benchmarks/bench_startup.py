"""Start-up to the first round, in a fresh Python process (what a user waits for before round 1 ends).

For each engine configuration a new interpreter is started that imports the engine, runs the
bench_overhead workload (FedAvg, 10 clients, 6 rounds) and reports, per round, the wall clock and the
CPU time of its whole process tree (worker processes and Ray included). Start-up = end of round 1
minus one steady round (the median interval between later round ends), counted

- from the process start (interpreter, imports of torch / Flower / this project, data loading, nodes,
  registration, round 1's first-call costs), and
- from the call (``engines.run_local`` / ``simulate(engine="ray")``: everything but the imports).

    python -m benchmarks.bench_startup [--datasets mnist-5k digits] [--configs inprocess:1 inprocess:2 ray:2]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, sys, time
t_main = time.time()
os.environ.setdefault("OMP_NUM_THREADS", "1")
from benchmarks.harness import loadavg, parser, round_clock, tree_cpu_seconds
engine, workers, dataset, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
if engine == "ray":
    from experiments.simulate import simulate
else:
    from engines.local import run_local
import server_app.app, client_app.app  # what a run imports anyway, counted in the imports
from benchmarks.bench_overhead import workload
t_imported, c_imported = time.time(), tree_cpu_seconds()
cfg = workload(6, out, dataset, 0)
with round_clock() as lines:
    t_call, c_call = time.time(), tree_cpu_seconds()
    if engine == "ray":
        simulate(cfg, num_supernodes=10, total_cpus=workers, engine="ray")
    else:
        run_local(cfg, 10, engine="inprocess", workers=workers)
rounds = [(t, c) for t, c, text in lines if text.startswith("[round ")]
print(json.dumps({"t_main": t_main, "t_imported": t_imported, "c_imported": c_imported, "t_call": t_call,
                  "c_call": c_call, "round_ends": [t for t, _ in rounds], "round_end_cpu": [c for _, c in rounds]}))
"""


def measure(engine: str, workers: int, dataset: str) -> dict:
    from benchmarks.harness import loadavg
    from benchmarks.stats import steady_state

    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        t_spawn = time.time()
        proc = subprocess.run([sys.executable, "-c", CHILD, engine, str(workers), dataset, tmp], capture_output=True,
                              text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{engine}:{workers} on {dataset} failed:\n{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    wall = steady_state(t_spawn, r["round_ends"])
    cpu = steady_state(0.0, r["round_end_cpu"])  # the child's tree CPU counts from its own start
    return {"engine": engine, "workers": workers, "dataset": dataset,
            "startup_from_start_s": wall["startup_s"],
            "startup_from_call_s": wall["startup_s"] - (r["t_call"] - t_spawn),
            "cpu_startup_from_start_s": cpu["startup_s"],
            "cpu_startup_from_call_s": cpu["startup_s"] - r["c_call"],
            "interpreter_s": r["t_main"] - t_spawn, "imports_s": r["t_imported"] - r["t_main"],
            "cpu_imports_s": r["c_imported"], "per_round_s": wall["per_round_s"],
            "loadavg_after": loadavg()}


def main() -> None:
    from benchmarks.harness import machine, parser, write_result
    from benchmarks.stats import summary

    ap = parser(__doc__)
    ap.add_argument("--datasets", nargs="+", default=["mnist-5k", "digits"])
    ap.add_argument("--configs", nargs="+", default=["inprocess:1", "inprocess:2", "ray:2"],
                    help="engine:workers (for ray: its CPUs)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default="startup")
    args = ap.parse_args()
    runs = []
    for k in range(args.repeats):
        for dataset in args.datasets:
            for spec in args.configs:
                engine, _, w = spec.partition(":")
                r = measure(engine, int(w or 1), dataset)
                r["repeat"] = k
                runs.append(r)
                print(f"[{k + 1}/{args.repeats}] {dataset} {spec}: start-up {r['startup_from_start_s']:.2f}s wall "
                      f"({r['cpu_startup_from_start_s']:.2f}s CPU) from the process start, "
                      f"{r['startup_from_call_s']:.2f}s wall ({r['cpu_startup_from_call_s']:.2f}s CPU) from the call; "
                      f"imports {r['imports_s']:.2f}s | load {r['loadavg_after'][0]:.1f}", flush=True)
    table = {}
    for dataset in args.datasets:
        for spec in args.configs:
            engine, _, w = spec.partition(":")
            sel = [r for r in runs if r["dataset"] == dataset and r["engine"] == engine and r["workers"] == int(w or 1)]
            table[f"{dataset} {spec}"] = {key: summary([r[key] for r in sel]) for key in (
                "startup_from_start_s", "startup_from_call_s", "cpu_startup_from_start_s", "cpu_startup_from_call_s",
                "imports_s", "cpu_imports_s", "interpreter_s")}
    path = write_result(args.name, {"machine": machine(), "args": vars(args), "runs": runs, "summary": table})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
