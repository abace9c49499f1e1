"""deploy/k8s_podman.py: the shipped kustomization rendered for `podman kube play` as Kubernetes' controllers
and kubelet would run it (the live play is tests/test_kube_play_live.py)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploy.k8s_podman import POD_INDEX, expand, render  # noqa: E402



def _k8s(tmp_path: Path) -> Path:
    """The shipped manifests and a fresh PKI; as a non-root user, rendering is refused (the files are made
    for the pods' uid 10001), which the caller's test then ends on."""
    k8s = tmp_path / "k8s"
    shutil.copytree(ROOT / "deploy" / "k8s", k8s)
    subprocess.run(["bash", str(ROOT / "deploy" / "pki.sh"), str(k8s / "certs"), "3", "DNS:superlink"],
                   check=True, capture_output=True, timeout=120)
    if os.geteuid() != 0:
        with pytest.raises(PermissionError, match="run as root"):
            render(k8s, tmp_path / "files")
    return k8s


def test_expand_replaces_defined_variables_and_keeps_the_rest() -> None:
    assert expand("client-id=$(I) x=$(NOPE) $$(I)", {"I": "2"}) == "client-id=2 x=$(NOPE) $2"
    assert expand("plain", {}) == "plain"


def test_the_shipped_manifests_render_to_one_pod_per_replica_with_everything_expanded(tmp_path: Path) -> None:
    k8s = _k8s(tmp_path)
    if os.geteuid() != 0:
        return
    docs = render(k8s, tmp_path / "files")
    kinds = [d["kind"] for d in docs]
    assert set(kinds) == {"PersistentVolumeClaim", "Pod"}          # no Service, NetworkPolicy, Namespace
    pods = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Pod"}
    assert list(pods) == ["superlink", "supernode-0", "supernode-1", "supernode-2"]
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    assert {"superlink-state", "state-supernode-0", "state-supernode-1", "state-supernode-2"} <= claims
    for i in range(3):
        pod = pods[f"supernode-{i}"]
        assert pod["metadata"]["labels"][POD_INDEX] == str(i)
        assert pod["spec"]["restartPolicy"] == "OnFailure"          # podman restarts init containers under Always
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert env["NODE_CONFIG"] == f"client-id={i} data-path='/data/client-{i}.npz' state-dir='/state'"
        assert env["POD_INDEX"] == str(i)
        [init] = pod["spec"]["initContainers"]
        assert init["command"] == ["install", "-m", "0400", f"/all-keys/supernode-{i}", "/key/supernode.key"]
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["state"]["persistentVolumeClaim"]["claimName"] == f"state-supernode-{i}"
        assert volumes["own-key"]["persistentVolumeClaim"]["claimName"] == f"supernode-{i}-own-key"  # not shared
        keys = Path(volumes["keys"]["hostPath"]["path"])
        assert sorted(p.name for p in keys.iterdir()) == ["supernode-0", "supernode-1", "supernode-2"]
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o400 and p.stat().st_uid == 10001 for p in keys.iterdir())
    assert "valueFrom" not in yaml.safe_dump(docs)
    link = pods["superlink"]
    assert "restartPolicy" not in link["spec"]                       # no init containers: as written
    volumes = {v["name"]: v for v in link["spec"]["volumes"]}
    # a secret volume with items holds exactly those items, under their paths, with the volume's mode
    tls_link = Path(volumes["tls-link"]["hostPath"]["path"])
    assert sorted(p.name for p in tls_link.iterdir()) == ["ca.crt", "server.crt", "server.key"]
    assert (tls_link / "server.key").read_bytes() == (k8s / "certs" / "server.key").read_bytes()
    assert stat.S_IMODE((tls_link / "server.key").stat().st_mode) == 0o440
    tls = Path(volumes["tls"]["hostPath"]["path"])
    assert sorted(p.name for p in tls.iterdir()) == ["ca.crt", "operator-ca.crt", "server.crt", "server.key"]
    assert Path(volumes["bindings"]["hostPath"]["path"]).is_dir()   # the ConfigMap's directory, for the operator


def test_what_cannot_be_rendered_is_refused_by_name(tmp_path: Path) -> None:
    k8s = _k8s(tmp_path)
    if os.geteuid() != 0:
        return
    (k8s / "certs" / "server.key").unlink()
    with pytest.raises(FileNotFoundError, match="superlink-tls.*server.key"):
        render(k8s, tmp_path / "files")
    k8s = _k8s(tmp_path / "again")
    sts = (k8s / "supernodes.yaml").read_text().replace("metadata.labels['apps.kubernetes.io/pod-index']",
                                                        "spec.nodeName")
    (k8s / "supernodes.yaml").write_text(sts)
    with pytest.raises(ValueError, match="fieldRef 'spec.nodeName' is not rendered"):
        render(k8s, tmp_path / "files2")
    out = subprocess.run([sys.executable, "-m", "deploy.k8s_podman", str(k8s), "--files", str(tmp_path / "f3")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "k8s_podman: fieldRef 'spec.nodeName' is not rendered" in out.stderr
