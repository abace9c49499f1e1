#!/usr/bin/env bash
# Start the reverse proxy (nginx) that publishes a loopback SuperLink's Fleet API, and its Control API
# to operators holding a client certificate of the operator CA. Three nginx instances, one per listener
# (templates deploy/proxy/{fleet,control,health}.conf.template), each with its own connections and its
# own budget of connections to the SuperLink, so a flood of the public Fleet port cannot starve Control
# or the health probe. This script supervises them: when one exits, it stops the others and exits too
# (the container / pod restarts the proxy).
# Configured by environment variables (defaults in brackets):
#   CERTS_DIR      directory with server.crt, server.key, ca.crt, operator-ca.crt (deploy/pki.sh) [required]
#   PROXY_HOST     address the public listeners bind to [0.0.0.0]
#   FLEET_PORT     Fleet API for SuperNodes [9093]
#   CONTROL_PORT   Control API for operators, mTLS [9443]
#   HEALTH_PORT    GET /healthz on 127.0.0.1 only (the SuperLink's /health) [9080]
#   FLEET_STATUS_PORT [9081], CONTROL_STATUS_PORT [9082]  nginx stub_status of the Fleet / Control instance on
#                  127.0.0.1 only; every answer >= 400 is also logged (its status) to <PROXY_RUN_DIR>/{fleet,control}-refused.log:
#                  deploy/proxy_exporter.py turns both into Prometheus series
#   SUPERLINK_UPSTREAM  the SuperLink (TLS, on loopback: deploy/superlink.sh) [127.0.0.1:9091]
#   FLEET_OBJECT_MAX_BODY  largest push-object body [5137k: a full 5 MiB array chunk, any model]
#   FLEET_MAX_BODY         largest body of every other Fleet route [64k]
#   FLEET_OBJECT_BUFFERING [file]  how push-object bodies reach the SuperLink: file (read whole first, past
#                  16k into a temporary file under PROXY_RUN_DIR, as root in TMPDIR (below): a slow uploader holds
#                  no upstream slot, each upload costs up to FLEET_OBJECT_MAX_BODY of disk, tmpfs in the images),
#                  memory (read whole into a buffer of FLEET_OBJECT_MAX_BODY), stream (sent on as they arrive: no
#                  copy, but each slow upload holds one of the FLEET_UPSTREAM_CONNS slots the nodes need)
#   PROXY_WORKER_USER [nobody]  run as root, nginx's workers drop to this user (and its primary group), and
#                  the bodies they buffer go to a directory of theirs (0700) in TMPDIR, removed when the proxy stops
#   CONTROL_MAX_BODY       largest Control body (start-run carries the app, <= 10 MiB) [11264k]
#                  `python -m deploy.body_limits -c "<run config>"` prints all three for a model
#   FLEET_CONNECTIONS      connections of the Fleet instance [4096]
#   FLEET_UPSTREAM_CONNS   Fleet requests in flight to the SuperLink [24]; CONTROL_UPSTREAM_CONNS [8]
#                  (with health's 2 below the SuperLink's 40 request threads, so Control keeps some)
#   FLEET_CONN_PER_IP [64]  FLEET_REQ_RATE [20] r/s  FLEET_REQ_BURST [400]   per client address
#   FLEET_OBJECT_CONN_PER_IP [8]  FLEET_OBJECT_CONNS [32]  push-object requests in flight per client address
#                  (a SuperNode pushes 2 at once) and in all; beyond: 503, retried by the SuperNodes. The bodies
#                  being read whole take at most FLEET_OBJECT_CONNS x FLEET_OBJECT_MAX_BODY of file (or memory)
#   CLIENT_HEADER_TIMEOUT  TLS handshake + request header [5s]; CLIENT_BODY_TIMEOUT between body reads [10s]
#   PROXY_RUN_DIR  where the rendered configs, pids and temp files go [a new directory under TMPDIR]
#   NGINX          the nginx binary [nginx]
# PROXY_CHECK=1 only renders the configurations and tests them (nginx -t).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nginx_bin="${NGINX:-nginx}"
unset NGINX   # nginx itself reads $NGINX as sockets inherited from a binary upgrade ("[emerg] invalid socket number")
if ! command -v "$nginx_bin" >/dev/null; then
  echo "proxy.sh: '$nginx_bin' not found; install nginx (Debian/Ubuntu: apt-get install -y nginx-light)" >&2
  exit 2
fi
: "${CERTS_DIR:?proxy.sh: set CERTS_DIR to the directory deploy/pki.sh wrote (TLS is mandatory for the proxy)}"
for f in server.crt server.key ca.crt operator-ca.crt; do
  [ -r "$CERTS_DIR/$f" ] || { echo "proxy.sh: $CERTS_DIR/$f is missing or unreadable (run deploy/pki.sh)" >&2; exit 2; }
done
certs="$(cd "$CERTS_DIR" && pwd)"
host="${PROXY_HOST:-0.0.0.0}"
case "$host" in *:*) host="[$host]" ;; esac
number() {  # VAR DEFAULT: a positive integer
  local val="${!1:-$2}"
  case "$val" in ''|*[!0-9]*|0) echo "proxy.sh: $1 must be a positive integer, got '$val'" >&2; exit 2 ;; esac
  printf '%s' "$val"
}
size() {  # VAR DEFAULT: an nginx size (digits + optional k/m/g)
  local val="${!1:-$2}"
  [[ "$val" =~ ^[1-9][0-9]*[kKmMgG]?$ ]] || { echo "proxy.sh: bad $1 '$val' (e.g. 512k, 5m)" >&2; exit 2; }
  printf '%s' "$val"
}
seconds() {
  local val="${!1:-$2}"
  [[ "$val" =~ ^[1-9][0-9]*s$ ]] || { echo "proxy.sh: bad $1 '$val' (e.g. 5s)" >&2; exit 2; }
  printf '%s' "$val"
}
fleet_port="$(number FLEET_PORT 9093)"; control_port="$(number CONTROL_PORT 9443)"
health_port="$(number HEALTH_PORT 9080)"
fleet_status_port="$(number FLEET_STATUS_PORT 9081)"; control_status_port="$(number CONTROL_STATUS_PORT 9082)"
upstream="${SUPERLINK_UPSTREAM:-127.0.0.1:9091}"
case "$upstream" in *[!A-Za-z0-9.:_\[\]-]*|'') echo "proxy.sh: bad SUPERLINK_UPSTREAM '$upstream' (host:port)" >&2; exit 2 ;; esac
[ -z "${MAX_BODY:-}" ] || { echo "proxy.sh: MAX_BODY is gone: set FLEET_OBJECT_MAX_BODY, FLEET_MAX_BODY and" \
  "CONTROL_MAX_BODY (python -m deploy.body_limits prints them for a model)" >&2; exit 2; }
fleet_conns="$(number FLEET_CONNECTIONS 4096)"
object_body="$(size FLEET_OBJECT_MAX_BODY 5137k)"; fleet_body="$(size FLEET_MAX_BODY 64k)"
control_body="$(size CONTROL_MAX_BODY 11264k)"
case "${FLEET_OBJECT_BUFFERING:-file}" in
  file) object_buffer=16k; object_request_buffering=on ;;
  memory) object_buffer="$object_body"; object_request_buffering=on ;;
  stream) object_buffer=16k; object_request_buffering=off ;;
  *) echo "proxy.sh: FLEET_OBJECT_BUFFERING must be file, memory or stream, got '${FLEET_OBJECT_BUFFERING}'" >&2
     exit 2 ;;
esac
fleet_upstream="$(number FLEET_UPSTREAM_CONNS 24)"; control_upstream="$(number CONTROL_UPSTREAM_CONNS 8)"
object_per_ip="$(number FLEET_OBJECT_CONN_PER_IP 8)"; object_conns="$(number FLEET_OBJECT_CONNS 32)"
per_ip="$(number FLEET_CONN_PER_IP 64)"; rate="$(number FLEET_REQ_RATE 20)"; burst="$(number FLEET_REQ_BURST 400)"
header_timeout="$(seconds CLIENT_HEADER_TIMEOUT 5s)"; body_timeout="$(seconds CLIENT_BODY_TIMEOUT 10s)"
subst=(
  -e "s|@CERTS_DIR@|$certs|g" -e "s|@UPSTREAM@|$upstream|g" -e "s|@HEALTH_PORT@|$health_port|g"
  -e "s|@FLEET_STATUS_PORT@|$fleet_status_port|g" -e "s|@CONTROL_STATUS_PORT@|$control_status_port|g"
  -e "s|@FLEET_LISTEN@|$host:$fleet_port|g" -e "s|@CONTROL_LISTEN@|$host:$control_port|g"
  -e "s|@FLEET_OBJECT_MAX_BODY@|$object_body|g" -e "s|@FLEET_MAX_BODY@|$fleet_body|g"
  -e "s|@FLEET_OBJECT_BUFFER@|$object_buffer|g" -e "s|@FLEET_OBJECT_REQUEST_BUFFERING@|$object_request_buffering|g"
  -e "s|@CONTROL_MAX_BODY@|$control_body|g"
  -e "s|@FLEET_CONNECTIONS@|$fleet_conns|g" -e "s|@FLEET_NOFILE@|$((2 * fleet_conns + 64))|g"
  -e "s|@FLEET_UPSTREAM_CONNS@|$fleet_upstream|g" -e "s|@CONTROL_UPSTREAM_CONNS@|$control_upstream|g"
  -e "s|@FLEET_OBJECT_CONN_PER_IP@|$object_per_ip|g" -e "s|@FLEET_OBJECT_CONNS@|$object_conns|g"
  -e "s|@FLEET_CONN_PER_IP@|$per_ip|g" -e "s|@FLEET_REQ_RATE@|$rate|g" -e "s|@FLEET_REQ_BURST@|$burst|g"
  -e "s|@CLIENT_HEADER_TIMEOUT@|$header_timeout|g" -e "s|@CLIENT_BODY_TIMEOUT@|$body_timeout|g"
)
umask 077   # rendered configs, pids, logs and body files: the proxy's own
run_dir="${PROXY_RUN_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/flower-proxy.XXXXXX")}"
mkdir -p "$run_dir"
run_dir="$(cd "$run_dir" && pwd)"
user_directive="# workers run as the proxy's own user (not root)"
body_dir="$run_dir/fleet-client_body"
if [ "$(id -u)" = 0 ]; then
  # nginx started as root runs its workers as an unprivileged user, and they write the push-object bodies
  # they buffer (FLEET_OBJECT_BUFFERING=file) into a directory of their own, 0700, in TMPDIR (the run
  # directory, and the directories above it, may not be searchable by them)
  worker_user="${PROXY_WORKER_USER:-nobody}"
  worker_group="$(id -gn "$worker_user" 2>/dev/null)" || {
    echo "proxy.sh: PROXY_WORKER_USER '$worker_user' is not a user of this host" >&2; exit 2; }
  [ "$worker_user" != root ] || { echo "proxy.sh: PROXY_WORKER_USER must not be root" >&2; exit 2; }
  user_directive="user $worker_user $worker_group;"
  body_dir="$(mktemp -d "${TMPDIR:-/tmp}/flower-proxy-body.XXXXXX")"
  trap 'rm -rf "$body_dir"' EXIT   # every way out, the TERM/INT trap's exit included
  chown "$worker_user:$worker_group" "$body_dir"
  if command -v runuser >/dev/null && ! runuser -u "$worker_user" -- test -w "$body_dir"; then
    echo "proxy.sh: nginx's workers (user '$worker_user') cannot write $body_dir: a directory above it is" \
         "not searchable by them; set TMPDIR to one that is (e.g. /tmp)" >&2
    exit 2
  fi
fi
subst+=(-e "s|@USER_DIRECTIVE@|$user_directive|g" -e "s|@BODY_DIR@|$body_dir|g")
instances=(fleet control health)
for name in "${instances[@]}"; do
  conf="$run_dir/$name.conf"
  sed "${subst[@]}" -e "s|@RUN_DIR@|$run_dir|g" "$here/proxy/$name.conf.template" > "$conf"
  if grep -q '@[A-Z_]*@' "$conf"; then
    echo "proxy.sh: unrendered placeholder in $conf" >&2; exit 2
  fi
done
if [ "${PROXY_CHECK:-0}" = 1 ]; then
  for name in "${instances[@]}"; do
    "$nginx_bin" -e stderr -p "$run_dir" -c "$run_dir/$name.conf" -t
  done
  exit 0
fi
echo "proxy.sh: Fleet API on $host:$fleet_port, Control API (operator certificate) on $host:$control_port," \
     "health on 127.0.0.1:$health_port -> $upstream; configs in $run_dir" >&2
pids=()
stop_all() { kill -TERM "${pids[@]}" 2>/dev/null || true; }
trap 'stop_all; wait; exit 143' TERM INT
for name in "${instances[@]}"; do
  "$nginx_bin" -e stderr -p "$run_dir" -c "$run_dir/$name.conf" -g "daemon off;" &
  pids+=($!)
done
status=0
wait -n "${pids[@]}" || status=$?
echo "proxy.sh: an nginx instance exited (status $status); stopping the others" >&2
stop_all
wait || true
exit $(( status == 0 ? 1 : status ))
