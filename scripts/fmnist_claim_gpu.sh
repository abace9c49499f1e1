#!/usr/bin/env bash
# FedRANE's Fashion-MNIST ledger rows on a GPU (issue 43 item 6): experiments/configs/claim-fedrane-fmnist-dir01-gpu.toml,
# the GPU twin of the CPU-budget claim experiment (same budget, grid and protocol, 5 seeds), tuned and then run in
# one command, every tuning trial and every reported run in a process of its own, side by side on the one GPU
# (experiments.tune / experiments.run --workers):
#
#     bash scripts/fmnist_claim_gpu.sh            # DEADLINE_S=540 (default): stop starting work after that
#     WORKERS=16 bash scripts/fmnist_claim_gpu.sh  # processes at once (default: 16 for tuning, 20 for the runs)
#
# Resumable like both commands: what finished before the deadline is kept and a second call does the rest.
# PACK=out.tgz packs the result files alone at the end: the whole folder holds every run's model and plots
# (over 16 MiB for 36 runs), which a lease's file return refuses; the first lease's results were lost that way
# (2026-12-04: its log is results/claim-fedrane-fmnist-dir01/gpu-twin-log.txt).
# Results: results/claim-fedrane-fmnist-dir01-gpu/ (python -m experiments.report tabulates them).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
[ -x "$py" ] || py=python3
cfg=experiments/configs/claim-fedrane-fmnist-dir01-gpu.toml
[ -n "${DRY_RUN:-}" ] || "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: this script is for a GPU machine")'
[ -n "${DRY_RUN:-}" ] || "$py" -c 'from data_partitioning.datasets import system_copy; import sys; sys.exit(0 if system_copy("fmnist") else "Fashion-MNIST missing: apt-get install dataset-fashion-mnist (bash .ci/deps.sh)")'
if [ -n "${DRY_RUN:-}" ]; then
  echo "$py -m experiments.tune $cfg --workers ${WORKERS:-16}; $py -m experiments.run $cfg --workers ${WORKERS:-20}"
  exit 0
fi
export OMP_NUM_THREADS=1
end=$(( $(date +%s) + ${DEADLINE_S:-540} ))
left() { echo $(( end - $(date +%s) )); }
t0=$(date +%s)
timeout "$(left)" "$py" -m experiments.tune "$cfg" --workers "${WORKERS:-16}" || echo "tuning stopped (deadline or a failed trial) after $(( $(date +%s) - t0 )) s"
if [ "$(left)" -gt 30 ] && [ -f results/claim-fedrane-fmnist-dir01-gpu/tuning.json ]; then
  t1=$(date +%s)
  timeout "$(left)" "$py" -m experiments.run "$cfg" --workers "${WORKERS:-20}" || echo "runs stopped (deadline or a failed run) after $(( $(date +%s) - t1 )) s"
fi
echo "done in $(( $(date +%s) - t0 )) s"
# PACK=<file.tgz>: the result files alone (no models or plots), small enough to come back from a lease
if [ -n "${PACK:-}" ]; then
  find results/claim-fedrane-fmnist-dir01-gpu \( -name results.json -o -name metrics.csv -o -name client_split.json \
    -o -name '*.toml' -o -name tuning.json -o -name test_split.json \) | tar czf "$PACK" -T -
  echo "packed $(du -h "$PACK" | cut -f1) into $PACK"
fi
