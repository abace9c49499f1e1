#!/usr/bin/env bash
# FedRANE's Fashion-MNIST table (Tables 1/2: Dir(0.1), Dir(0.5) and Dir(5), K = 20, full data; all 14 methods) at the full local budget on
# a GPU, in one command:
#
#     bash scripts/fmnist_table_gpu.sh [ROUNDS] [SEEDS...]      # defaults: 30 rounds, seed 0
#     DRY_RUN=1 bash scripts/fmnist_table_gpu.sh                # print the runs and the GPU configs, run nothing
#     DEADLINE_S=540 (default): every run stops after this many seconds from the start, so the command ends
#     within a GPU lease's 10-minute command limit; runs stopped early keep their rounds, and the tables then read
#     every run at the rounds where the stopped ones stopped (experiments.report --mark-stopped, report-rounds)
#
# Budget: the paper's local work per round (5 local epochs of batch 128, no step cap) for ROUNDS rounds, every
# client every round; everything else (methods, optimizer, split) as experiments/configs/fmnist-table-dir{01,05,5}.toml,
# the CPU-budget tables. Results go to results/fmnist-table-dir{01,05,5}-gpu/ (experiments.run's layout;
# python -m experiments.report tabulates them beside the paper's values).
# Every (setting, method) pair runs as its own process, all at once (the in-process engine trains a round's
# clients one after another, so one process leaves most of the GPU idle); RUN_PARALLEL=N limits that.
# Measured on one H200 (2026-11-27, 20 runs at once, one process each, 16 cores): 31-37 s per round for the methods
# without LRA, 114 s for fedrane / fedrane-no-gne, 300 s for fedrane-code; 480 s got 11-14 rounds of the former,
# 3 of FedRANE, 1 of fedrane-code (results/fmnist-table-dir0{1,5}-gpu). The paper's full budget (its rounds of 5
# local epochs) does not fit one 10-minute command at that speed: the deadline makes the command end in time and
# the report says how far each run got.
# Since issue 41 the three configs hold 17 runs each (every row of FedRANE's Tables 1-2): 51 processes at
# once by default, on 16 cores; the timings above are from the 20-run version and were not re-measured.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-30}"
shift || true
seeds=("${@:-0}")
py="${PYTHON:-.venv/bin/python}"
[ -x "$py" ] || py=python
[ -n "${DRY_RUN:-}" ] || "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: this script is for a GPU machine")'
[ -n "${DRY_RUN:-}" ] || "$py" -c 'from data_partitioning.datasets import system_copy; import sys; sys.exit(0 if system_copy("fmnist") else "Fashion-MNIST missing: apt-get install dataset-fashion-mnist (bash .ci/deps.sh)")'
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
jobs=()
for a in 01 05 5; do
  "$py" - "$a" "$rounds" "$tmp/fmnist-table-dir$a-gpu.toml" <<'EOF'
import re, sys
a, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
text = open(f"experiments/configs/fmnist-table-dir{a}.toml").read()
subs = {r'^name = ".*"$': f'name = "fmnist-table-dir{a}-gpu"',
        r"^num-server-rounds = .*$": f"num-server-rounds = {rounds}", r"^local-epochs = .*$": "local-epochs = 5",
        r"^max-local-steps = .*$": "max-local-steps = 0", r"^batch-size = .*$": "batch-size = 128",
        r'^"fedbabu.finetune-max-steps" = .*$': '"fedbabu.finetune-max-steps" = 0  # the paper\'s full 5 fine-tuning epochs',
        r"at a CPU budget": f"at the GPU budget ({rounds} rounds of 5 local epochs, B = 128)",
        r"\*\*CPU budget, stated for the whole table:\*\*.*?not the paper's converged ones\.":
            f"**GPU budget, stated for the whole table:** planned {rounds} rounds (a run stopped early: set report-rounds), every client every round, 5 local epochs "
            "of B = 128 per round, no step cap (the paper's local work per round; scripts/fmnist_table_gpu.sh)."}
for pattern, repl in subs.items():
    text, n = re.subn(pattern, repl, text, flags=re.M)
    if n != 1:
        sys.exit(f"fmnist-table-dir{a}.toml: expected one line matching {pattern!r}, found {n}")
open(out, "w").write(text)
EOF
  for label in $("$py" -c "import tomllib,sys; print(' '.join(tomllib.load(open(sys.argv[1],'rb'))['runs']))" "$tmp/fmnist-table-dir$a-gpu.toml"); do
    jobs+=("$tmp/fmnist-table-dir$a-gpu.toml $label")
  done
done
echo "fmnist table on the GPU: ${#jobs[@]} runs x seeds ${seeds[*]}, $rounds rounds each (5 local epochs, batch 128)"
if [ -n "${DRY_RUN:-}" ]; then
  printf '  %s\n' "${jobs[@]}"
  cat "$tmp"/*.toml
  exit 0
fi
start=$(date +%s)
deadline="${DEADLINE_S:-540}"
export END=$(( start + deadline ))
logs="${LOG_DIR:-$tmp}"  # LOG_DIR=dir keeps each run's log (dir/<config>.<label>.log); by default they go with $tmp
mkdir -p "$logs"
printf '%s\n' "${jobs[@]}" | LOGS="$logs" xargs -P "${RUN_PARALLEL:-${#jobs[@]}}" -L 1 sh -c \
  'left=$(( END - $(date +%s) )); [ "$left" -gt 0 ] || exit 0; OMP_NUM_THREADS=1 timeout "$left" '"$py"' -m experiments.run "$0" --only "$1" --seeds '"${seeds[*]}"' > "$LOGS/$(basename "$0" .toml).$1.log" 2>&1; rc=$?; [ "$rc" = 0 ] || [ "$rc" = 124 ] || { echo "failed: $0 $1 (log follows)"; tail -20 "$LOGS/$(basename "$0" .toml).$1.log"; exit 1; }' \
  || echo "some runs failed (their logs above); the others are reported"
"$py" -m experiments.report --mark-stopped fmnist-table-dir01-gpu fmnist-table-dir05-gpu fmnist-table-dir5-gpu --note "Stopped by the ${deadline} s deadline of scripts/fmnist_table_gpu.sh (planned: $rounds rounds); every run is read at the rounds where the stopped runs stopped."
echo "done in $(( $(date +%s) - start )) s; results/fmnist-table-dir{01,05,5}-gpu/ (docs/RESULTS.md regenerated)"
