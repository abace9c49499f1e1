#!/usr/bin/env bash
# Run the app in Flower's local simulation (`flwr run . local`) on a SuperLink of its own, stopped afterwards.
#   scripts/run_local.sh [NUM_SUPERNODES] [run-config overrides...]
#   scripts/run_local.sh 10 "method='fedbc' num-server-rounds=5"
# Exit code: 0 when the run finished every round; 2 when the run config is refused (checked first by
# `noniid-fl run --check`, in a second, before any engine starts); 1 when the run failed (`flwr run` itself
# exits 0 then, so the streamed log is checked for the ServerApp's "noniid-fl: run complete" line).
# Only the SuperLink this script starts (and its children: its process group) is stopped, by pid.
# Uses the already-installed environment: runtime dependency installation is disabled (otherwise the
# SuperLink would `uv sync` the locked stack into a fresh environment for every run; set
# FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=0 to have it do so: [tool.uv] pins it to requirements.lock).
# The FAB is built from a snapshot of the app's code (pyproject.toml + its packages, deploy/localfed.py's
# snapshot_app) in a temporary directory: `flwr run .` walks every file under the checkout before
# filtering, .venv and .git included (~70k files: 3-7 s per run), and the snapshot cannot change while the
# run is submitted. The ServerApp's working directory is still this checkout (relative out-dir as before).
set -uo pipefail
cd "$(dirname "$0")/.."
n="${1:-10}"; shift || true
overrides=(); if [ $# -gt 0 ]; then overrides=(-c "$*"); fi
flwr_bin="$(command -v flwr)" || { echo "run_local.sh: flwr not found; activate the venv (README: Install)" >&2; exit 2; }
py="$(dirname "$flwr_bin")/python"

"$py" -m cli run --check --nodes "$n" "${overrides[@]}" || exit $?

export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="${FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION:-1}"  # set 0 to let Flower `uv sync` per run
export FLWR_HOME="${FLWR_HOME:-$PWD/.flwr}"
mkdir -p "$FLWR_HOME"
read -r http_port control_port < <("$py" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT="$http_port" FLWR_LOCAL_CONTROL_API_PORT="$control_port"
work="$(mktemp -d "${TMPDIR:-/tmp}/run_local.XXXXXX")"

# The SuperLink `flwr run . local` would start itself, started here so that its pid is known.
setsid "$(dirname "$flwr_bin")/flower-superlink" --insecure --simulation --isolation subprocess \
  --control-api-address "127.0.0.1:$control_port" --host 127.0.0.1 --port "$http_port" \
  --database "$work/state.db" >"$work/superlink.log" 2>&1 &
link=$!
echo "run_local.sh: SuperLink pid $link on 127.0.0.1:$http_port (stopped when this script ends)"
stop_superlink() {
  kill -TERM -- "-$link" 2>/dev/null || true
  for _ in $(seq 1 200); do kill -0 "$link" 2>/dev/null || break; sleep 0.1; done  # it stops in ~0.6 s
  kill -KILL -- "-$link" 2>/dev/null || true
  rm -rf "$work"
}
trap stop_superlink EXIT
trap 'exit 130' INT TERM
# (while the SuperLink starts)
"$py" -c 'import sys; from pathlib import Path; from deploy.localfed import snapshot_app; snapshot_app(Path(sys.argv[1]))' \
  "$work/app" || { echo "run_local.sh: could not copy the app to $work/app" >&2; exit 1; }

for _ in $(seq 1 600); do  # Flower itself waits only 15 s, which a loaded machine can exceed
  if ! kill -0 "$link" 2>/dev/null; then
    echo "run_local.sh: flower-superlink exited at start:" >&2; tail -20 "$work/superlink.log" >&2; exit 1
  fi
  "$py" -c "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:$http_port/health', timeout=1)" \
    2>/dev/null && break
  sleep 0.2
done

flwr run "$work/app" local --stream --federation-config "num-supernodes=$n client-resources-num-cpus=1" "${overrides[@]}" \
  2>&1 | tee "$work/stream.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  echo "run_local.sh: flwr run exited with $rc" >&2; exit "$rc"
fi
if ! grep -q "noniid-fl: run complete" "$work/stream.log"; then
  echo "run_local.sh: the run did not complete (no 'noniid-fl: run complete' line in the log above)" >&2
  exit 1
fi
