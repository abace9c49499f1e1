#!/usr/bin/env bash
# FedRANE's and fedrane-code's local-step time / FedAvg's on one GPU, with the per-step host synchronisations of the
# code before and without them (this code), in one process: benchmarks/bench_lra_gpu.py (its docstring says what
# is timed). Random Fashion-MNIST-shaped data made on the device: no dataset, no network.
#
#     bash scripts/lra_gpu_bench.sh                       # on a GPU machine: writes benchmarks/results/lra_gpu.json
#     DEVICE=cpu bash scripts/lra_gpu_bench.sh --steps 4 --warmup 1 --repeats 1 --out lra_gpu-cpu-check
#                                                         # a CPU check that it runs (no timing claim)
# Extra arguments go to the benchmark (--steps, --warmup, --repeats, --methods, --out). Where $OUT is a folder
# (the device machine's hand-back folder), the result file is copied there too.
# Expected on one H100/H200: well under 2 minutes (imports ~15 s; 3 methods x 2 modes x 3 repeats of 200 steps).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
[ -x "$py" ] || py=python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
device="${DEVICE:-cuda}"
if [ "$device" = cuda ]; then
  "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: this script times a GPU (DEVICE=cpu checks that it runs)")'
fi
"$py" -m benchmarks.bench_lra_gpu --device "$device" "$@"
# on a lent device machine, hand the result file back too ($OUT: the folder whose files come back)
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp benchmarks/results/lra_gpu*.json "$OUT"/; fi
