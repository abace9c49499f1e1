#!/usr/bin/env python
"""Render deploy/k8s (its kustomization) into what `podman kube play` (podman 4.3) runs on one host.

    python -m deploy.k8s_podman deploy/k8s --files /srv/noniid-fl > federation.yaml   # as root
    podman network create noniid-fl                       # a network with DNS (CNI dnsname)
    podman kube play --network noniid-fl federation.yaml

podman plays Pods, Deployments, PersistentVolumeClaims, Secrets and ConfigMaps but not what a Kubernetes
controller or kubelet does for the manifests, so this renders those parts the way Kubernetes would:

- the kustomization's ``secretGenerator`` is read from the files it names (for the secret volumes below);
- the StatefulSet becomes one Pod per ordinal, ``<name>-<i>``, labelled ``apps.kubernetes.io/pod-index``;
  each ordinal's ``volumeClaimTemplates`` become a PVC ``<claim>-<name>-<i>`` of its own;
- the Deployment (one replica) becomes a Pod named as the Deployment, so the pod's DNS name on the podman
  network is the name the Service gives it in Kubernetes (``superlink``);
- ``fieldRef`` env values and ``$(VAR)`` references in env values and commands are expanded (podman 4.3
  does neither);
- secret and ConfigMap volumes become ``hostPath`` directories of their files (``--files``): a secret
  volume's ``items`` under their paths, with its ``defaultMode``, owned by the pod's ``runAsUser``/``fsGroup``.
  podman 4.3's own secret volumes cannot carry them: it writes each ``data`` value into the volume still
  base64-encoded, ignores ``stringData``, ``items`` and ``defaultMode``, and crashes on a volume without
  ``optional``. A ConfigMap directory is left for the operator to fill (``node-bindings.json``), as
  ``kubectl create configmap`` does;
- a pod with init containers gets ``restartPolicy: OnFailure`` (podman 4.3 restarts init containers under
  ``Always``);
- ``emptyDir`` volumes become a PVC per pod, ``<pod>-<volume>`` (podman 4.3 makes a named volume of an
  emptyDir, shared by every pod that names it); remove them with the pods.

Not rendered, because podman does not implement them: Services (pods reach each other by pod name on
the network; podman publishes every containerPort on the host instead), NetworkPolicies, readiness
probes (liveness probes become podman health checks, which need systemd), ``fsGroup`` on volumes, and an
``emptyDir``'s ``medium``/``sizeLimit``. docs/DEPLOYMENT.md lists what the live test ran.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml

POD_INDEX = "apps.kubernetes.io/pod-index"
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def load_kustomization(k8s_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The resources a kustomization lists, in order, and the kustomization itself."""
    kust = yaml.safe_load((k8s_dir / "kustomization.yaml").read_text())
    docs = [d for f in kust["resources"] for d in yaml.safe_load_all((k8s_dir / f).read_text()) if d]
    return docs, kust


def generated_secrets(k8s_dir: Path, kust: dict[str, Any]) -> dict[str, dict[str, bytes]]:
    """``secretGenerator``: secret name -> {key: file content}; a missing file is an error naming it."""
    out: dict[str, dict[str, bytes]] = {}
    for gen in kust.get("secretGenerator", []):
        data = {}
        for entry in gen.get("files", []):
            key, _, rel = entry.partition("=")
            path = k8s_dir / (rel or key)
            if not path.is_file():
                raise FileNotFoundError(f"secretGenerator {gen['name']!r}: {path} does not exist "
                                        f"(run deploy/pki.sh {k8s_dir / 'certs'} ...)")
            data[Path(key).name if not rel else key] = path.read_bytes()
        out[gen["name"]] = data
    return out


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined variable is replaced, an undefined one kept as written."""
    return _REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def _field(pod: dict[str, Any], path: str) -> str:
    found = re.fullmatch(r"metadata\.(name|namespace)|metadata\.labels\['([^']+)'\]", path)
    if not found:
        raise ValueError(f"fieldRef {path!r} is not rendered (metadata.name, metadata.namespace, "
                         "metadata.labels['...'] are)")
    meta = pod["metadata"]
    if found.group(1):
        return str(meta.get(found.group(1), "default"))
    return str(meta.get("labels", {})[found.group(2)])


def _resolve_container(pod: dict[str, Any], container: dict[str, Any]) -> None:
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            ref = var.pop("valueFrom")
            if "fieldRef" not in ref:
                raise ValueError(f"env {var['name']}: only fieldRef is rendered, got {sorted(ref)}")
            var["value"] = _field(pod, ref["fieldRef"]["fieldPath"])
        else:
            var["value"] = expand(str(var.get("value", "")), env)
        env[var["name"]] = var["value"]
    for key in ("command", "args"):
        if key in container:
            container[key] = [expand(str(a), env) for a in container[key]]


def _podman_volumes(pod: dict[str, Any], secrets: dict[str, dict[str, bytes]], files: Path,
                    claims: dict[str, str]) -> None:
    name = pod["metadata"]["name"]
    uid = pod["spec"].get("securityContext", {}).get("runAsUser")
    gid = pod["spec"].get("securityContext", {}).get("fsGroup", uid)
    for vol in pod["spec"].get("volumes", []):
        if "secret" in vol or "configMap" in vol:
            where = files / name / vol["name"]
            where.mkdir(parents=True, exist_ok=True)
            if "secret" in vol:
                src = vol.pop("secret")
                data = secrets[src["secretName"]]
                items = src.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    path = where / item["path"]
                    path.write_bytes(data[item["key"]])
                    path.chmod(item.get("mode", src.get("defaultMode", 0o644)))
                    if uid is not None:
                        os.chown(path, uid, gid)
            else:
                vol.pop("configMap")   # the operator writes the ConfigMap's files here (kubectl create configmap)
            if uid is not None:
                os.chown(where, uid, gid)
            vol["hostPath"] = {"path": str(where), "type": "Directory"}
        elif "emptyDir" in vol:
            vol.pop("emptyDir")
            vol["persistentVolumeClaim"] = {"claimName": f"{name}-{vol['name']}"}
            claims[f"{name}-{vol['name']}"] = "1Gi"


def _pod(meta: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("initContainers"):
        # podman 4.3 applies the pod's restart policy to its init containers too: under Always an init
        # container that exits 0 is started again (about 3 times a second) and the play fails removing it
        # ("cannot remove container ... as it is running"). OnFailure still restarts a container that fails
        # (a SuperNode that gives up exits 75), not one that ends cleanly, as Kubernetes' Always would.
        spec["restartPolicy"] = "OnFailure"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    for c in spec.get("initContainers", []) + spec["containers"]:
        _resolve_container(pod, c)
    return pod


def render(k8s_dir: Path, files: Path) -> list[dict[str, Any]]:
    """The documents ``podman kube play`` runs (PVCs, then Pods); the secret and ConfigMap volumes' files
    under ``files`` (``<pod>/<volume>/``), owned by the pod's user (run as root: podman as root)."""
    if os.geteuid() != 0:
        raise PermissionError("the secret files are made for the pods' users (runAsUser): run as root, "
                              "for rootful podman")
    docs, kust = load_kustomization(k8s_dir)
    secrets = generated_secrets(k8s_dir, kust)
    claims: dict[str, str] = {}
    pods: list[dict[str, Any]] = []
    for doc in docs:
        kind = doc["kind"]
        if kind == "PersistentVolumeClaim":
            claims[doc["metadata"]["name"]] = doc["spec"]["resources"]["requests"]["storage"]
        elif kind == "Deployment":
            if doc["spec"].get("replicas", 1) != 1:
                raise ValueError(f"Deployment {doc['metadata']['name']}: only one replica is rendered")
            tmpl = copy.deepcopy(doc["spec"]["template"])
            pods.append(_pod({"name": doc["metadata"]["name"], "labels": tmpl["metadata"].get("labels", {})},
                             tmpl["spec"]))
        elif kind == "StatefulSet":
            name = doc["metadata"]["name"]
            for i in range(doc["spec"].get("replicas", 1)):
                tmpl = copy.deepcopy(doc["spec"]["template"])
                labels = {**tmpl["metadata"].get("labels", {}), POD_INDEX: str(i)}
                spec = tmpl["spec"]
                for claim in doc["spec"].get("volumeClaimTemplates", []):
                    own = f"{claim['metadata']['name']}-{name}-{i}"
                    claims[own] = claim["spec"]["resources"]["requests"]["storage"]
                    spec.setdefault("volumes", []).append({"name": claim["metadata"]["name"],
                                                           "persistentVolumeClaim": {"claimName": own}})
                pods.append(_pod({"name": f"{name}-{i}", "labels": labels}, spec))
        elif kind in ("Namespace", "Service", "NetworkPolicy"):
            continue             # podman: one host, one network; pods are reached by pod name
        else:
            raise ValueError(f"{kind} {doc['metadata'].get('name')!r} is not rendered for podman")
    for pod in pods:
        _podman_volumes(pod, secrets, files, claims)
    out: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": n},
         "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}
        for n, size in claims.items()]
    return out + pods


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("k8s_dir", type=Path, nargs="?", default=Path(__file__).resolve().parent / "k8s")
    parser.add_argument("--files", type=Path, required=True,
                        help="where the secret and ConfigMap volumes' files go (<pod>/<volume>/)")
    ns = parser.parse_args(argv)
    try:
        docs = render(ns.k8s_dir, ns.files.resolve())
    except (OSError, ValueError, KeyError) as err:
        sys.exit(f"k8s_podman: {err}")
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))


if __name__ == "__main__":
    main()
