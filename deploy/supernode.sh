#!/usr/bin/env bash
# Start a Flower SuperNode that runs this project's ClientApp.
# Configured by environment variables (defaults in brackets), extra arguments go to flower-supernode:
#   SUPERLINK      the Fleet API address host:port: the proxy (deploy/proxy.sh) [127.0.0.1:9093]
#   NODE_CONFIG    this node's identity and data, e.g. "client-id=3 data-path='/data/node.npz'"
#                  or "partition-id=3 num-partitions=10" (demo: a slice of a named dataset);
#                  optional state-dir='/state' persists client state across restarts   [required]
#   RUNTIME_PORT   local port of the SuperNode's Runtime API (one per SuperNode on a host) [9094]
#   CA_CERT        CA certificate that signed the SuperLink's certificate -> TLS; unset -> --insecure
#   AUTH_KEY       this node's private key (deploy/pki.sh) -> SuperNode authentication (needs CA_CERT)
#   TUNED=1        poll for messages every POLL s [0.5] and fork ClientApps from a warm interpreter
#                  (deploy/tuned.py; runs the SuperNode with --isolation process + our SuperExec)
#   SUPEREXEC_SECRET_FILE  shared secret between this SuperNode and its SuperExec (required with TUNED=1 and
#                  TLS: without it any local process reaching the Runtime API port could acquire this node's
#                  ClientApp tasks); stock mode with TLS runs Flower's SuperExec in process isolation with it,
#                  or with a fresh secret per start in the node's private directory when it is unset
#   MAX_WAIT       give up connecting to the SuperLink after this many seconds [retry forever]
#   POLL_STAMP     file the node stamps at every poll, read by deploy/healthcheck.py supernode
#                  [$TMPDIR/flower-supernode-$UID/supernode-$RUNTIME_PORT.poll: a 0700 directory of this
#                  user's, refused if another user made it]; POLL_STALE (health check) [120]; BUSY_STALE:
#                  one message processed longer than this is unhealthy [900]
#   ACTIVATION_PATIENCE  seconds to keep retrying when the SuperLink refuses to activate this node's key
#                  because its previous session (a killed or cut-off node) is still online [75: flwr's 60 s
#                  heartbeat window + 15; 0: exit at once] (deploy/node_guard.py)
#   HEARTBEAT_INTERVAL  the heartbeat interval the node declares, 10..1800 s [10: flwr's minimum; the
#                  SuperLink then notices a dead node within 20 s and lets its restart in as soon]
# The ClientApp runs in this environment: runtime dependency installation stays off (flwr default).
# umask 077: every file the node writes (its FLWR_HOME copies, client state, stamps) is private to its user.
set -euo pipefail
umask 077
here="$(cd "$(dirname "$0")" && pwd)"
superlink="${SUPERLINK:-127.0.0.1:9093}"
runtime_port="${RUNTIME_PORT:-9094}"
: "${NODE_CONFIG:?supernode.sh: set NODE_CONFIG, e.g. \"client-id=0 data-path='/data/node.npz'\"}"
args=(--superlink "$superlink" --port "$runtime_port" --node-config "$NODE_CONFIG")
if [ -n "${CA_CERT:-}" ]; then
  [ -f "$CA_CERT" ] || { echo "supernode.sh: CA_CERT=$CA_CERT does not exist" >&2; exit 2; }
  args+=(--root-certificates "$CA_CERT")
else
  [ -n "${AUTH_KEY:-}" ] && { echo "supernode.sh: AUTH_KEY needs TLS (set CA_CERT)" >&2; exit 2; }
  args+=(--insecure)
fi
if [ -n "${AUTH_KEY:-}" ]; then
  [ -f "$AUTH_KEY" ] || { echo "supernode.sh: AUTH_KEY=$AUTH_KEY does not exist" >&2; exit 2; }
  args+=(--auth-supernode-private-key "$AUTH_KEY")
fi
[ -n "${MAX_WAIT:-}" ] && args+=(--max-wait-time "$MAX_WAIT")
export FLWR_TELEMETRY_ENABLED="${FLWR_TELEMETRY_ENABLED:-0}"
if [ "${TUNED:-0}" = 1 ] && [ -n "${CA_CERT:-}" ]; then
  if [ -z "${SUPEREXEC_SECRET_FILE:-}" ]; then
    echo "supernode.sh: TUNED=1 with TLS needs SUPEREXEC_SECRET_FILE: in process isolation the Runtime API would" \
         "otherwise hand this node's ClientApp tasks to any local process. Create one with" \
         "'head -c 32 /dev/urandom > superexec.secret && chmod 600 superexec.secret'." >&2
    exit 2
  fi
  [ -s "$SUPEREXEC_SECRET_FILE" ] && [ -r "$SUPEREXEC_SECRET_FILE" ] || {
    echo "supernode.sh: SUPEREXEC_SECRET_FILE=$SUPEREXEC_SECRET_FILE is missing, empty or unreadable" >&2; exit 2; }
fi
if [ "${TUNED:-0}" = 1 ]; then
  exec_args=(--runtime-api-address "127.0.0.1:$runtime_port" --insecure --parent-pid $$)
  if [ -n "${SUPEREXEC_SECRET_FILE:-}" ]; then
    exec_args+=(--superexec-auth-secret-file "$SUPEREXEC_SECRET_FILE")
    args+=(--superexec-auth-secret-file "$SUPEREXEC_SECRET_FILE")
  fi
  "${PYTHON:-python}" "$here/tuned.py" --poll "${POLL:-0.5}" superexec "${exec_args[@]}" &
  exec "${PYTHON:-python}" "$here/tuned.py" --poll "${POLL:-0.5}" supernode "${args[@]}" --isolation process "$@"
fi
# deploy/node_guard.py: flower-supernode that retries transient TLS/connection errors instead of giving up
# and stamps every poll for deploy/healthcheck.py (TUNED mode installs the same guards in tuned.py)
if [ -n "${CA_CERT:-}" ]; then
  # Stock mode with TLS (a real deployment): Flower's default subprocess isolation gives the Runtime API no
  # secret, so any local process reaching 127.0.0.1:$RUNTIME_PORT could take this node's tasks. Run Flower's own
  # SuperExec beside the node in process isolation instead, both holding a secret: SUPEREXEC_SECRET_FILE, or a
  # fresh one per start in the node's private directory (node_guard.py --make-runtime-secret).
  secret="${SUPEREXEC_SECRET_FILE:-}"
  if [ -z "$secret" ]; then
    secret="$("${PYTHON:-python}" "$here/node_guard.py" --make-runtime-secret)" || exit 2
  fi
  [ -s "$secret" ] && [ -r "$secret" ] || {
    echo "supernode.sh: SUPEREXEC_SECRET_FILE=$secret is missing, empty or unreadable" >&2; exit 2; }
  "${PYTHON:-python}" -c 'import sys; from flwr.supercore.cli.flower_superexec import flower_superexec as m; sys.argv[0] = "flower-superexec"; m()' \
    --runtime-api-address "127.0.0.1:$runtime_port" --insecure --parent-pid $$ --superexec-auth-secret-file "$secret" &
  exec "${PYTHON:-python}" "$here/node_guard.py" "${args[@]}" --isolation process --superexec-auth-secret-file "$secret" "$@"
fi
# no TLS: a loopback demo or test; Flower's subprocess isolation (its Runtime API has no secret)
exec "${PYTHON:-python}" "$here/node_guard.py" "${args[@]}" "$@"
