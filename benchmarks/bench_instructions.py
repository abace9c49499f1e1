"""Engine overhead in executed instructions: the in-process engine vs the plain loop, independent of load.

On a shared 2-core machine, time ratios of millisecond rounds move with everyone else's load. The number
of instructions a round executes does not: this benchmark runs the digits job (or any dataset) under
valgrind's callgrind with instrumentation switched on only for rounds 3 .. R+2 of a run (after the first
rounds' one-off costs, before the end-of-run writes), once for the plain loop and once for the in-process
engine, and reports instructions per round, their ratio, and the C-level functions whose counts differ
most (``memcpy``, the Python interpreter loop, ...). Time-based writes (results.json, checkpoints every
second) are switched off in both: under valgrind a round lasts seconds, so they would fire every round.

Instructions are not time (a BLAS kernel retires more instructions per cycle than the interpreter), so
this complements the timed ratios of bench_overhead; it is the figure to watch while cutting overhead.

    python -m benchmarks.bench_instructions [--dataset digits] [--rounds 10]   # ~5-10 min (valgrind)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _toggle(on: bool) -> None:
    """Switch callgrind's instrumentation of this process; keep executing while callgrind_control waits
    (callgrind serves the request between basic blocks, not while the process sleeps in a syscall)."""
    proc = subprocess.Popen(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while proc.poll() is None:
        sum(range(100))


def child(variant: str, dataset: str, rounds: int, clients: int) -> None:
    """Runs inside valgrind: a warm-up run, then ``rounds`` instrumented rounds of the measured run."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    import server_app.results as results
    import server_app.runner as runner
    from benchmarks.bench_overhead import workload
    from benchmarks.plain_loop import plain_fedavg
    from engines.local import run_local

    runner.WRITE_INTERVAL_S = 1e9
    results.ResultsWriter.__init__.__defaults__ = (1e9,)
    ends = {"n": 0}

    def tick() -> None:  # after round 2: on; after round rounds + 2: off
        ends["n"] += 1
        if ends["n"] == 2:
            _toggle(True)
        elif ends["n"] == rounds + 2:
            _toggle(False)

    with tempfile.TemporaryDirectory(prefix="bench_instr_") as tmp:
        if variant == "plain":
            plain_fedavg(workload(2, tmp, dataset, 0), clients)
            plain_fedavg(workload(rounds + 3, tmp, dataset, 0), clients, on_round=lambda r, t: tick())
        else:
            run_local({**workload(2, tmp, dataset, 0), "overwrite": True}, clients)
            with runner.observe_lines(lambda text: tick() if text.startswith("[round ") else None, echo=False):
                run_local({**workload(rounds + 3, tmp, dataset, 0), "overwrite": True}, clients)


def functions(out_file: Path) -> dict[str, int]:
    """callgrind_annotate's per-function instruction counts (file:function -> Ir)."""
    return parse_annotate(subprocess.run(["callgrind_annotate", "--threshold=100", str(out_file)],
                                         capture_output=True, text=True, check=True).stdout)


def parse_annotate(text: str) -> dict[str, int]:
    """``callgrind_annotate`` output -> {file:function: Ir} (the binary in brackets and Python's build path
    dropped, counts of the same name summed; the PROGRAM TOTALS line skipped)."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(.*)", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        name = re.sub(r"\s*\[.*\]$", "", re.sub(r"/tmp/python-build[^:]*/", "", m.group(2))).strip()
        counts[name] = counts.get(name, 0) + int(m.group(1).replace(",", ""))
    return counts


def measure(variant: str, args: argparse.Namespace, tmp: Path) -> dict:
    out = tmp / f"callgrind.{variant}.out"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}", sys.executable,
           "-m", "benchmarks.bench_instructions", "--child", variant, "--dataset", args.dataset,
           "--rounds", str(args.rounds), "--clients", str(args.clients)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    total = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or total is None:
        raise RuntimeError(f"callgrind run of '{variant}' failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"instructions": int(total.group(1)), "per_round": int(total.group(1)) / args.rounds,
            "functions": functions(out)}


def main() -> None:
    from benchmarks.harness import machine, parser, write_result

    ap = parser(__doc__)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--rounds", type=int, default=10, help="instrumented rounds (after 2 uninstrumented ones)")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--name", default="instructions")
    ap.add_argument("--child", choices=("plain", "inprocess"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.dataset, args.rounds, args.clients)
        return
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench_instructions needs '{tool}' (valgrind) on PATH")
    with tempfile.TemporaryDirectory(prefix="bench_instr_") as tmp:
        runs = {v: measure(v, args, Path(tmp)) for v in ("plain", "inprocess")}
    plain, engine = runs["plain"], runs["inprocess"]
    names = set(plain["functions"]) | set(engine["functions"])
    diff = sorted(((engine["functions"].get(k, 0) - plain["functions"].get(k, 0)) / args.rounds, k) for k in names)
    top = [{"function": k, "extra_per_round": d} for d, k in reversed(diff[-12:])]
    out = {"machine": machine(), "args": {k: v for k, v in vars(args).items() if k != "child"},
           "plain_per_round": plain["per_round"], "inprocess_per_round": engine["per_round"],
           "ratio": engine["per_round"] / plain["per_round"], "top_extra": top}
    print(f"{args.dataset}, {args.clients} clients, {args.rounds} instrumented rounds: instructions per round "
          f"plain {plain['per_round'] / 1e6:.1f} M, in-process engine {engine['per_round'] / 1e6:.1f} M: "
          f"ratio {out['ratio']:.3f}")
    for row in top:
        print(f"  {row['extra_per_round'] / 1e6:+7.2f} M per round  {row['function'][:110]}")
    print(f"wrote {write_result(args.name, out)}")


if __name__ == "__main__":
    main()
