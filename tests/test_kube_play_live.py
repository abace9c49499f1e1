"""deploy/k8s played for real with `podman kube play` (issue ops-live item 2).

deploy/k8s_podman.py renders the kustomization the way Kubernetes' controllers would (the StatefulSet's pods
and claims, the Deployment's pod under the Service's name, fieldRef and $(VAR) expansion, secret volumes as
files with their items and modes); podman 4.3 plays the result on a network with DNS: the SuperLink pod with
its proxy sidecar and three SuperNode pods, each running its init container, TLS and node keys on. The
operator registers the three keys through the tunnel, writes the node-bindings ConfigMap's file, and a FedAvg
run trains on all three pods. Services and NetworkPolicies are not played (podman implements neither);
tests/test_deploy_security.py checks them against the Kubernetes schema."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploy.localfed import snapshot_app  # noqa: E402
from deploy.make_node_data import write_node_files  # noqa: E402
from tests._operator import FLWR, start_operator  # noqa: E402
from tests.test_compose_live import CONTAINERS_CONF, IMAGES, _ports_free, _wait  # noqa: E402

NETWORK = "noniid-fl-kube-test"
RECORD = ROOT / "benchmarks" / "results" / "kube_play_live.json"   # KUBE_PLAY_RECORD=1 writes it


@pytest.mark.slow
@pytest.mark.image
def test_kube_play_runs_the_rendered_manifests_and_a_round_trains_on_every_pod(tmp_path: Path) -> None:
    for tool in ("podman", "runc", "mmdebstrap", "catatonit"):
        if shutil.which(tool) is None:
            pytest.fail(f"'{tool}' is not installed: run .ci/deps.sh")
    assert os.geteuid() == 0, "rootful podman: the rendered secret files belong to the pods' uid 10001"
    assert _ports_free(9093, 9443), "ports 9093 and 9443 (podman publishes the proxy's containerPorts) are taken"
    build = subprocess.run(["bash", str(ROOT / "deploy" / "docker" / "build_local.sh")], capture_output=True,
                           text=True, timeout=3600, env={**os.environ, "TAG": "test"})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    for target, name in IMAGES.items():
        subprocess.run(["podman", "tag", f"noniid-fl/{target}:test", name], check=True, timeout=60)

    k8s = tmp_path / "k8s"
    shutil.copytree(ROOT / "deploy" / "k8s", k8s)               # the shipped manifests
    certs = k8s / "certs"
    subprocess.run(["bash", str(ROOT / "deploy" / "pki.sh"), str(certs), "3", "DNS:superlink"], check=True,
                   capture_output=True, timeout=120)
    files = tmp_path / "files"
    render = subprocess.run([sys.executable, "-m", "deploy.k8s_podman", str(k8s), "--files", str(files)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert render.returncode == 0, render.stderr
    play_file = tmp_path / "federation.yaml"
    play_file.write_text(render.stdout)
    (tmp_path / "containers.conf").write_text(CONTAINERS_CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(tmp_path / "containers.conf")}

    def podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout)

    def logs(container: str) -> str:
        out = podman("logs", container)
        return out.stdout + out.stderr

    pods = ["superlink", "supernode-0", "supernode-1", "supernode-2"]
    claims = [d.split("name: ", 1)[1].split("\n")[0] for d in render.stdout.split("---")
              if "kind: PersistentVolumeClaim" in d]
    operator = None
    try:
        assert podman("network", "create", NETWORK).returncode == 0
        # the data PVC the StatefulSet mounts read-only (client-<i>.npz), created before the pods as in a cluster
        assert podman("volume", "create", "supernode-data").returncode == 0
        data = Path(podman("volume", "inspect", "supernode-data", "--format", "{{.Mountpoint}}").stdout.strip())
        for path in write_node_files(data, 3, {"dataset": "digits"}):
            path.chmod(0o644)
        play = podman("kube", "play", "--network", NETWORK, str(play_file), timeout=600)
        assert play.returncode == 0, play.stdout[-3000:] + play.stderr[-3000:]
        running = {p: podman("pod", "inspect", p, "--format", "{{.State}}").stdout.strip() for p in pods}
        assert set(running.values()) == {"Running"}, running
        _wait("the proxy's /healthz answered 200", lambda: podman(
            "exec", "superlink-proxy", "curl", "-fsS", "http://127.0.0.1:9080/healthz").returncode == 0,
            180, lambda: logs("superlink-superlink")[-2000:] + logs("superlink-proxy")[-2000:])
        # each SuperNode container holds only its own key (the init container's copy), 0400
        for i in range(3):
            key = podman("exec", f"supernode-{i}-supernode", "sh", "-c", "stat -c %a /key/supernode.key && ls /key")
            assert key.stdout.split() == ["400", "supernode.key"], key.stdout + key.stderr

        operator = start_operator(certs, tmp_path, "kube")
        bindings = files / "superlink" / "bindings" / "node-bindings.json"   # the ConfigMap's file
        operator.register(certs, 3, bindings)
        os.chown(bindings, 10001, 10001)
        _wait("all three SuperNode pods online", lambda: operator.online() == 3, 240,
              lambda: "\n".join(logs(f"supernode-{i}-supernode")[-1500:] for i in range(3)))
        app = snapshot_app(tmp_path / "app")
        config = ("method='fedavg' dataset='digits' num-server-rounds=2 min-train-nodes=3 federated-eval-every=0 "
                  "round-timeout=90.0 out-dir='/runs/kube'")
        log = tmp_path / "run.out"
        with log.open("w") as fh:
            run = subprocess.run([FLWR, "run", str(app), "kube", "--stream", "-c", config], env=operator.env,
                                 stdout=fh, stderr=subprocess.STDOUT, timeout=900)
        out = podman("exec", "superlink-superlink", "cat", "/runs/kube/results.json")
        assert run.returncode == 0 and out.returncode == 0, log.read_text()[-3000:]
        doc = json.loads(out.stdout)
    finally:
        if operator is not None:
            operator.stop()
        down = podman("kube", "play", "--down", str(play_file), timeout=300)
        for volume in [*claims, "supernode-data"]:
            podman("volume", "rm", "-f", volume)
        podman("network", "rm", "-f", NETWORK)
    assert down.returncode == 0, down.stderr[-2000:]
    rows = doc["rounds"]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["sampled"] == [0, 1, 2] and r["num_updates"] == 3 and r["failures"] == [] for r in rows), rows
    figures = {"pods": pods, "rounds": 2, "updates_per_round": [r["num_updates"] for r in rows],
               "final_accuracy": round(rows[-1]["global_accuracy"], 4),
               "round_s": [round(r["wall_time_s"], 1) for r in rows]}
    if os.environ.get("KUBE_PLAY_RECORD") == "1":
        RECORD.write_text(json.dumps({"recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                      "podman": podman("--version").stdout.strip(), **figures}, indent=1) + "\n")
    print(f"\n[kube play] pods {pods}: rounds {[r['round'] for r in rows]} on {figures['updates_per_round']} nodes, "
          f"G-FL accuracy {figures['final_accuracy']}")
