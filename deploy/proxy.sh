#!/usr/bin/env bash
# Start the reverse proxy (nginx) that publishes a loopback SuperLink's Fleet API, and its Control API
# to operators holding a client certificate of the operator CA. Template: deploy/proxy/nginx.conf.template.
# Configured by environment variables (defaults in brackets):
#   CERTS_DIR      directory with server.crt, server.key, ca.crt, operator-ca.crt (deploy/pki.sh) [required]
#   PROXY_HOST     address the public listeners bind to [0.0.0.0]
#   FLEET_PORT     Fleet API for SuperNodes [9093]
#   CONTROL_PORT   Control API for operators, mTLS [9443]
#   HEALTH_PORT    GET /healthz on 127.0.0.1 only (the SuperLink's /health) [9080]
#   SUPERLINK_UPSTREAM  the SuperLink (TLS, on loopback: deploy/superlink.sh) [127.0.0.1:9091]
#   MAX_BODY       largest request body, nginx syntax [1g]
#   PROXY_RUN_DIR  where the rendered config, pid and temp files go [a new directory under TMPDIR]
#   NGINX          the nginx binary [nginx]
# PROXY_CHECK=1 only renders the configuration and tests it (nginx -t).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nginx_bin="${NGINX:-nginx}"
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
for var in FLEET_PORT CONTROL_PORT HEALTH_PORT; do
  val="${!var:-}"
  case "$val" in ''|*[!0-9]*) [ -z "$val" ] || { echo "proxy.sh: $var must be a port number, got '$val'" >&2; exit 2; } ;; esac
done
upstream="${SUPERLINK_UPSTREAM:-127.0.0.1:9091}"
case "$upstream" in *[!A-Za-z0-9.:_\[\]-]*|'') echo "proxy.sh: bad SUPERLINK_UPSTREAM '$upstream' (host:port)" >&2; exit 2 ;; esac
max_body="${MAX_BODY:-1g}"
case "$max_body" in *[!0-9kKmMgG]*|'') echo "proxy.sh: bad MAX_BODY '$max_body' (e.g. 512m)" >&2; exit 2 ;; esac
run_dir="${PROXY_RUN_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/flower-proxy.XXXXXX")}"
mkdir -p "$run_dir"
run_dir="$(cd "$run_dir" && pwd)"
conf="$run_dir/nginx.conf"
sed -e "s|@RUN_DIR@|$run_dir|g" -e "s|@CERTS_DIR@|$certs|g" -e "s|@UPSTREAM@|$upstream|g" \
    -e "s|@MAX_BODY@|$max_body|g" -e "s|@HEALTH_PORT@|${HEALTH_PORT:-9080}|g" \
    -e "s|@FLEET_LISTEN@|$host:${FLEET_PORT:-9093}|g" -e "s|@CONTROL_LISTEN@|$host:${CONTROL_PORT:-9443}|g" \
    "$here/proxy/nginx.conf.template" > "$conf"
if grep -q '@[A-Z_]*@' "$conf"; then
  echo "proxy.sh: unrendered placeholder in $conf" >&2; exit 2
fi
if [ "${PROXY_CHECK:-0}" = 1 ]; then
  exec "$nginx_bin" -e stderr -p "$run_dir" -c "$conf" -t
fi
echo "proxy.sh: Fleet API on $host:${FLEET_PORT:-9093}, Control API (operator certificate) on $host:${CONTROL_PORT:-9443} -> $upstream; config $conf" >&2
exec "$nginx_bin" -e stderr -p "$run_dir" -c "$conf" -g "daemon off;"
