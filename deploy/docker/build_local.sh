#!/usr/bin/env bash
# Build the images with podman on a machine that cannot pull from a container registry (as the
# development machines of this project): the base images are replaced by a Debian bookworm root file
# system made from Debian packages (mmdebstrap: minbase + python3 + python3-venv), imported as
# localhost/noniid-fl-base:bookworm. Python is then Debian's 3.11 instead of python:3.11-slim's.
#
#   deploy/docker/build_local.sh [TARGET ...]        # default: proxy supernode superlink; tag :local
#
# Environment: TAG [local], PODMAN_RUNTIME [runc] (crun fails on hybrid cgroups here), HOST_CA_BUNDLE
# [/etc/ssl/certs/ca-certificates.crt]: mounted into RUN steps and given to pip (TLS-intercepting proxy).
# Needs podman, runc and mmdebstrap (Debian packages). Prints one line per image: "built <name> <id>".
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "build_local.sh: '$tool' is required (apt-get install -y podman runc mmdebstrap)" >&2; exit 2; }
done
runtime="${PODMAN_RUNTIME:-runc}"
tag="${TAG:-local}"
base=localhost/noniid-fl-base:bookworm
pod=(podman --runtime "$runtime")
if ! "${pod[@]}" image exists "$base"; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$tmp/base.tar"
  "${pod[@]}" import --quiet "$tmp/base.tar" "$base" >/dev/null
fi
args=(--format docker --network host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024
      --ignorefile "$here/Dockerfile.dockerignore" -f "$here/Dockerfile"
      --build-arg "BASE_IMAGE=$base" --build-arg "PROXY_BASE_IMAGE=$base")
bundle="${HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
if [ -f "$bundle" ]; then
  args+=(-v "$bundle:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
fi
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(proxy supernode superlink)
for target in "${targets[@]}"; do
  case "$target" in proxy) name="noniid-fl/proxy:$tag" ;; superlink|supernode) name="noniid-fl/$target:$tag" ;;
    *) echo "build_local.sh: unknown target '$target' (proxy, supernode, superlink)" >&2; exit 2 ;; esac
  "${pod[@]}" build --quiet "${args[@]}" --target "$target" -t "$name" "$root" >/dev/null
  echo "built $name $("${pod[@]}" image inspect --format '{{.Id}}' "$name" | cut -c1-12)"
done
