#!/usr/bin/env bash
# Start a Flower SuperLink. flwr 1.42 serves the Fleet, Control and Runtime APIs on ONE HTTP port and
# authenticates only the Fleet API, so the SuperLink listens on loopback by default and deploy/proxy.sh
# publishes the Fleet API (and the Control API to operators with a client certificate).
# Configured by environment variables (defaults in brackets), extra arguments go to flower-superlink:
#   SUPERLINK_HOST [127.0.0.1] SUPERLINK_PORT [9091]; only a loopback IP literal (127.0.0.0/8, ::1) unless
#   EXPOSE_ALL_APIS=1  allows a non-loopback SUPERLINK_HOST (publishes Control and Runtime API too; only
#                  on a network where every peer is trusted)
#   CERTS_DIR      directory with ca.crt, server.crt, server.key (deploy/pki.sh) -> TLS; unset -> --insecure
#   NODE_AUTH=1    only SuperNodes whose public key was registered (`flwr supernode register`) may connect
#   DATABASE       SQLite file for runs/nodes/registered keys [in memory: lost on restart]; its folder is made
#                  0700 and the files 0600 (deploy/state_guard.py); the SuperLink runs with umask 077
#   TUNED=1        fork the ServerApp from a warm interpreter and poll for replies every POLL s [0.5]
#                  (deploy/tuned.py; runs the SuperLink with --isolation process + our SuperExec)
#   SUPEREXEC_SECRET_FILE  with TUNED=1: shared secret that the SuperLink demands from the SuperExec
#                  (without it any process reaching the Runtime API could acquire ServerApp tasks);
#                  required with TUNED=1 and TLS. Create with: head -c 32 /dev/urandom > superexec.secret
#   LOG_FILE       also write the SuperLink log to this file (rotated daily)
#   FLEET_MAX_REPLY_OBJECTS [65536]  FLEET_MAX_REPLY_BYTES [1073741824]  the most objects and object bytes one
#                  reply may store (deploy/link_guard.py, through which the SuperLink always starts);
#                  `python -m deploy.body_limits -c "<run config>"` prints the values derived for a model
# Runtime dependency installation is always disabled: runs use this environment, never `uv sync`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
host="${SUPERLINK_HOST:-127.0.0.1}"
port="${SUPERLINK_PORT:-9091}"
py="${PYTHON:-python}"
if ! "$py" "$here/state_guard.py" host "$host"; then
  if [ "${EXPOSE_ALL_APIS:-0}" != 1 ]; then
    echo "superlink.sh: SUPERLINK_HOST=$host is not a loopback IP literal (127.0.0.0/8, ::1) and would publish the Control API (unauthenticated: anyone reaching it can" \
         "register SuperNode keys and run code on every SuperNode) and the Runtime API, which share the Fleet API's" \
         "port in flwr 1.42. Keep the SuperLink on 127.0.0.1 and publish the Fleet API with deploy/proxy.sh, or set" \
         "EXPOSE_ALL_APIS=1 on a network where every peer is trusted." >&2
    exit 2
  fi
  echo "superlink.sh: WARNING: EXPOSE_ALL_APIS=1: Fleet, Control and Runtime API reachable on $host:$port" >&2
fi
# the state (task tokens, app packages, run configs, registered keys) is private: files 0600, folder 0700
umask 077
if [ -n "${DATABASE:-}" ] && [ "$DATABASE" != ":memory:" ]; then
  "$py" "$here/state_guard.py" state "$DATABASE" || exit 2
fi
args=(--host "$host" --port "$port" --disable-runtime-dependency-installation)
if [ -n "${CERTS_DIR:-}" ]; then
  for f in ca.crt server.crt server.key; do
    [ -f "$CERTS_DIR/$f" ] || { echo "superlink.sh: $CERTS_DIR/$f is missing (run deploy/pki.sh)" >&2; exit 2; }
  done
  args+=(--ssl-ca-certfile "$CERTS_DIR/ca.crt" --ssl-certfile "$CERTS_DIR/server.crt" --ssl-keyfile "$CERTS_DIR/server.key")
else
  [ "${NODE_AUTH:-0}" = 1 ] && { echo "superlink.sh: NODE_AUTH=1 needs TLS (set CERTS_DIR)" >&2; exit 2; }
  args+=(--insecure)
fi
[ "${NODE_AUTH:-0}" = 1 ] && args+=(--enable-supernode-auth)
[ -n "${DATABASE:-}" ] && args+=(--database "$DATABASE")
[ -n "${LOG_FILE:-}" ] && args+=(--log-file "$LOG_FILE")
export FLWR_TELEMETRY_ENABLED="${FLWR_TELEMETRY_ENABLED:-0}"
if [ "${TUNED:-0}" = 1 ] && [ -n "${CERTS_DIR:-}" ]; then
  if [ -z "${SUPEREXEC_SECRET_FILE:-}" ]; then
    echo "superlink.sh: TUNED=1 with TLS needs SUPEREXEC_SECRET_FILE: in process isolation the Runtime API would" \
         "otherwise hand ServerApp tasks to any process that reaches it. Create one with" \
         "'head -c 32 /dev/urandom > superexec.secret && chmod 600 superexec.secret'." >&2
    exit 2
  fi
  [ -s "$SUPEREXEC_SECRET_FILE" ] && [ -r "$SUPEREXEC_SECRET_FILE" ] || {
    echo "superlink.sh: SUPEREXEC_SECRET_FILE=$SUPEREXEC_SECRET_FILE is missing, empty or unreadable" >&2; exit 2; }
fi
if [ "${TUNED:-0}" = 1 ]; then
  connect="127.0.0.1"; case "$host" in 0.0.0.0|127.0.0.1) ;; *) connect="$host" ;; esac
  exec_args=(--runtime-api-address "$connect:$port" --parent-pid $$)
  if [ -n "${SUPEREXEC_SECRET_FILE:-}" ]; then
    exec_args+=(--superexec-auth-secret-file "$SUPEREXEC_SECRET_FILE")
    args+=(--superexec-auth-secret-file "$SUPEREXEC_SECRET_FILE")
  fi
  if [ -n "${CERTS_DIR:-}" ]; then exec_args+=(--root-certificates "$CERTS_DIR/ca.crt"); else exec_args+=(--insecure); fi
  # the SuperExec retries until the SuperLink (this PID after exec) listens, and exits with it
  "${PYTHON:-python}" "$here/tuned.py" --poll "${POLL:-0.5}" superexec "${exec_args[@]}" &
  args+=(--isolation process)
fi
for var in FLEET_MAX_REPLY_OBJECTS FLEET_MAX_REPLY_BYTES; do
  case "${!var:-1}" in ''|*[!0-9]*|0) echo "superlink.sh: $var must be a positive integer, got '${!var}'" >&2; exit 2 ;; esac
done
guard=(--max-reply-objects "${FLEET_MAX_REPLY_OBJECTS:-65536}" --max-reply-bytes "${FLEET_MAX_REPLY_BYTES:-1073741824}")
exec "$py" "$here/link_guard.py" "${guard[@]}" -- "${args[@]}" "$@"
