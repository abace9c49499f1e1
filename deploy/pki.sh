#!/usr/bin/env bash
# Create the TLS material and SuperNode authentication keys for a Flower federation.
#
#   deploy/pki.sh OUT_DIR [NUM_NODES] [SAN ...]
#   deploy/pki.sh certs 3 DNS:superlink.example.org IP:10.0.0.5
#
# Writes (existing files are kept, so re-running only adds what is missing):
#   OUT_DIR/ca.crt, ca.key            self-signed CA (ECDSA P-384, 10 years); keep ca.key offline
#   OUT_DIR/server.crt, server.key    SuperLink certificate (ECDSA P-256, 1 year) signed by the CA, with
#                                     subjectAltName DNS:localhost, IP:127.0.0.1 and every SAN given
#   OUT_DIR/keys/supernode-<i>        SuperNode i's private key (ECDSA P-384, OpenSSH format, no passphrase)
#   OUT_DIR/keys/supernode-<i>.pub    its public key: register it with `flwr supernode register`
#   OUT_DIR/operator-ca.crt, .key     CA of the operators (ECDSA P-384, 10 years); keep operator-ca.key offline
#   OUT_DIR/operators/<name>.crt,.key client certificate of operator <name> (ECDSA P-256, 1 year, clientAuth)
#                                     for each name in OPERATORS [operator]; the proxy (deploy/proxy.sh)
#                                     passes the Control API only to clients presenting one of these
#   OUT_DIR/.gitignore                "*": nothing in OUT_DIR is ever committed
# SuperNodes verify the SuperLink with ca.crt (`--root-certificates`); the SuperLink knows SuperNodes by
# their registered public keys (`--enable-supernode-auth`). Private keys are written mode 0600, certificates
# and public keys 0644. Needs openssl and ssh-keygen.
set -euo pipefail
out="${1:?usage: deploy/pki.sh OUT_DIR [NUM_NODES] [SAN ...]}"
n="${2:-0}"
shift $(( $# >= 2 ? 2 : $# ))
case "$n" in ''|*[!0-9]*) echo "pki.sh: NUM_NODES must be a non-negative integer, got '$n'" >&2; exit 2 ;; esac
for tool in openssl ssh-keygen; do
  command -v "$tool" >/dev/null || { echo "pki.sh: '$tool' is required" >&2; exit 2; }
done
operators="${OPERATORS-operator}"
for name in $operators; do
  case "$name" in *[!A-Za-z0-9_.-]*|.*) echo "pki.sh: operator name '$name' must be letters, digits, '_', '.', '-'" >&2; exit 2 ;; esac
done
umask 077
mkdir -p "$out/keys" "$out/operators"
[ -f "$out/.gitignore" ] || printf '# written by deploy/pki.sh: private keys live here, never commit this directory\n*\n' > "$out/.gitignore"
san="DNS:localhost,IP:127.0.0.1"
for extra in "$@"; do
  case "$extra" in DNS:*|IP:*) san="$san,$extra" ;; *) echo "pki.sh: SAN '$extra' must start with DNS: or IP:" >&2; exit 2 ;; esac
done

if [ ! -f "$out/ca.crt" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-384 -sha384 -days 3650 -nodes -keyout "$out/ca.key" -out "$out/ca.crt" \
    -subj "/CN=noniid-fl federation CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
made="kept existing server.crt"
if [ ! -f "$out/server.crt" ]; then
  made="server.crt for $san"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -sha256 -nodes -keyout "$out/server.key" -out "$out/server.csr" \
    -subj "/CN=flower-superlink" 2>/dev/null
  ext="$(mktemp)"
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' \
    "$san" > "$ext"
  openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
    -out "$out/server.crt" -days 365 -sha384 -extfile "$ext" 2>/dev/null
  rm -f "$ext" "$out/server.csr" "$out/ca.srl"
fi
for ((i = 0; i < n; i++)); do
  key="$out/keys/supernode-$i"
  [ -f "$key" ] || ssh-keygen -q -t ecdsa -b 384 -N "" -C "supernode-$i" -f "$key"
done
if [ ! -f "$out/operator-ca.crt" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-384 -sha384 -days 3650 -nodes \
    -keyout "$out/operator-ca.key" -out "$out/operator-ca.crt" -subj "/CN=noniid-fl operator CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
for name in $operators; do
  crt="$out/operators/$name.crt"
  [ -f "$crt" ] && continue
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -sha256 -nodes -keyout "$out/operators/$name.key" \
    -out "$out/operators/$name.csr" -subj "/CN=$name" 2>/dev/null
  ext="$(mktemp)"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n' > "$ext"
  openssl x509 -req -in "$out/operators/$name.csr" -CA "$out/operator-ca.crt" -CAkey "$out/operator-ca.key" \
    -CAcreateserial -out "$crt" -days 365 -sha384 -extfile "$ext" 2>/dev/null
  rm -f "$ext" "$out/operators/$name.csr" "$out/operator-ca.srl"
done
# whatever the caller's umask or an earlier version left: private keys 0600, public material 0644
for key in "$out/ca.key" "$out/server.key" "$out/operator-ca.key" "$out"/operators/*.key; do
  [ -f "$key" ] && chmod 600 "$key"
done
for ((i = 0; i < n; i++)); do chmod 600 "$out/keys/supernode-$i"; done
chmod 644 "$out/ca.crt" "$out/server.crt" "$out/operator-ca.crt" "$out"/operators/*.crt "$out"/keys/*.pub 2>/dev/null || true
echo "PKI in $out: ca.crt, $made, $n SuperNode key pair(s) in keys/, operator CA + certificate(s) for: ${operators:-none}"
