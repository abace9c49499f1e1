"""deploy/docker/compose.yaml started for real (issue ops-live item 1).

podman-compose (PyPI's, pinned in .ci/deps.sh) starts the shipped compose file unchanged: the SuperLink, the
proxy in its network namespace and three SuperNodes, with TLS, node keys bound to client ids, read-only roots, no capabilities and
restart policies. An operator reaches the Control API through deploy/operator_tunnel.py (operator
certificate), registers the three keys as the compose file's header says and submits a run; results.json is
read from the SuperLink's `runs` volume. One SuperNode container is then killed from the host (SIGKILL to its
init, as an OOM kill or a crash would): its restart policy brings it back, and it trains in a later round.

Debian 12's podman-compose (1.0.3) cannot start this file: it passes `network_mode: service:superlink` to podman
as is ("unknown bridge network option: superlink") and adds the default network to a service that has a
network_mode ("cannot set multiple networks without bridge network mode"), so the proxy is never created while
it exits 0. What this box needs beyond the compose file: the images from deploy/docker/build_local.sh (tagged with the
compose file's names), and a containers.conf for podman here (runc, and file-descriptor limits the sandbox
permits); neither changes the manifest. podman runs no health checks without systemd, so the images' health
check commands are run by hand."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploy.localfed import snapshot_app  # noqa: E402
from tests._operator import FLWR, start_operator  # noqa: E402

DOCKER = ROOT / "deploy" / "docker"
IMAGES = {"proxy": "noniid-fl/proxy:nginx", "supernode": "noniid-fl/supernode:cpu",
          "superlink": "noniid-fl/superlink:cpu"}
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
"""
ROUNDS = 4


# .ci/deps.sh installs it, hash-pinned, in a venv of its own (a tool, not part of the locked stack)
PODMAN_COMPOSE = Path(os.environ.get("PODMAN_COMPOSE_VENV", Path(os.environ.get("TMPDIR", "/tmp"))
                                     / "noniid-fl-podman-compose")) / "bin" / "podman-compose"
RECORD = ROOT / "benchmarks" / "results" / "compose_live.json"   # COMPOSE_LIVE_RECORD=1 writes it


def _require_tools() -> None:
    for tool in ("podman", "runc", "mmdebstrap"):
        if shutil.which(tool) is None:
            pytest.fail(f"'{tool}' is not installed: run .ci/deps.sh")
    if not PODMAN_COMPOSE.exists():
        pytest.fail(f"{PODMAN_COMPOSE} is missing: run .ci/deps.sh (it installs podman-compose there)")
    if not Path("/usr/lib/cni/dnsname").exists():
        pytest.fail("podman's dnsname CNI plugin is missing (service names would not resolve): "
                    "apt-get install golang-github-containernetworking-plugin-dnsname (.ci/deps.sh)")


def _ports_free(*ports: int) -> bool:
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                return False
    return True


class Compose:
    """podman-compose on a copy of the shipped compose file, as project ``name``."""

    def __init__(self, workdir: Path, name: str) -> None:
        self.dir, self.name = workdir, name
        (workdir / "containers.conf").write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(workdir / "containers.conf")}

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(PODMAN_COMPOSE), "-f", str(self.dir / "compose.yaml"), "-p", self.name, *args],
                              cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=timeout)

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def container(self, service: str) -> str:
        return f"{self.name}_{service}_1"

    def inspect(self, service: str) -> dict:
        out = self.podman("inspect", self.container(service))
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)[0]

    def logs(self, service: str) -> str:
        out = self.podman("logs", self.container(service))
        return out.stdout + out.stderr


def _wait(what: str, check, timeout: float, diagnose=lambda: "") -> None:
    deadline = time.time() + timeout
    while not check():
        if time.time() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s\n{diagnose()}")
        time.sleep(1.0)


@pytest.mark.slow
@pytest.mark.image
def test_compose_federation_trains_and_a_killed_supernode_is_restarted_and_trains(tmp_path: Path) -> None:
    _require_tools()
    assert _ports_free(9093, 9443), "ports 9093 and 9443 (published by compose.yaml) are taken on this host"
    build = subprocess.run(["bash", str(DOCKER / "build_local.sh")], capture_output=True, text=True, timeout=3600,
                           env={**os.environ, "TAG": "test"})
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    for target, name in IMAGES.items():      # the compose file's image names, as a registry would serve them
        subprocess.run(["podman", "tag", f"noniid-fl/{target}:test", name], check=True, timeout=60)

    work = tmp_path / "compose"
    work.mkdir()
    shutil.copy(DOCKER / "compose.yaml", work / "compose.yaml")      # the shipped file, unchanged
    services = yaml.safe_load((work / "compose.yaml").read_text())["services"]
    nodes = sorted(s for s in services if s.startswith("supernode-"))
    assert nodes == ["supernode-0", "supernode-1", "supernode-2"]
    certs = work / "certs"
    subprocess.run(["bash", str(ROOT / "deploy" / "pki.sh"), str(certs), str(len(nodes)), "DNS:superlink"],
                   check=True, capture_output=True, timeout=120)
    for key in [certs / "server.key", *(p for p in (certs / "keys").iterdir() if p.suffix != ".pub")]:
        os.chown(key, 10001, 10001)          # only the private keys a container reads (compose.yaml's header)
    (work / "bindings").mkdir()
    compose = Compose(work, f"nfl{os.getpid()}")
    operator = None
    try:
        up = compose("up", "-d", "--no-build")
        # podman-compose exits 0 even when a container could not be created: every service must run
        running = {s: compose.podman("inspect", "--format", "{{.State.Running}}", compose.container(s)).stdout.strip()
                   for s in services}
        assert up.returncode == 0 and set(running.values()) == {"true"}, (running, up.stdout[-4000:])
        # the SuperLink answers its health route through the proxy's loopback health listener
        _wait("the proxy's /healthz answered 200", lambda: compose.podman(
            "exec", compose.container("proxy"), "curl", "-fsS", "http://127.0.0.1:9080/healthz").returncode == 0,
            180, lambda: compose.logs("superlink")[-2000:] + compose.logs("proxy")[-2000:])
        # the operator's side: a tunnel presenting the operator certificate, and the flwr CLI on it
        operator = start_operator(certs, tmp_path, "docker")
        operator.register(certs, len(nodes), work / "bindings" / "node-bindings.json")  # compose.yaml's header
        _wait("all three SuperNodes online", lambda: operator.online() == len(nodes), 240,
              lambda: "\n".join(compose.logs(n)[-1500:] for n in nodes))
        health = compose.podman("exec", compose.container("supernode-0"), "python", "/app/deploy/healthcheck.py",
                                "supernode")
        assert health.returncode == 0 and health.stdout.startswith("healthy: supernode"), health.stdout

        app = snapshot_app(tmp_path / "app")
        config = (f"method='fedavg' dataset='digits' num-server-rounds={ROUNDS} min-train-nodes=3 "
                  "federated-eval-every=0 round-timeout=90.0 out-dir='/runs/compose'")
        log = tmp_path / "run.out"
        run = subprocess.Popen([FLWR, "run", str(app), "docker", "--stream", "-c", config], env=operator.env,
                               stdout=log.open("w"), stderr=subprocess.STDOUT)

        def results() -> dict | None:
            out = compose.podman("exec", compose.container("superlink"), "cat", "/runs/compose/results.json")
            try:
                return json.loads(out.stdout) if out.returncode == 0 else None
            except ValueError:
                return None

        def rounds_done() -> int:
            doc = results()
            return len(doc["rounds"]) if doc else 0

        _wait("round 1 recorded", lambda: rounds_done() >= 1, 300,
              lambda: log.read_text()[-3000:] + compose.logs("superlink")[-2000:])
        victim = "supernode-1"
        before = compose.inspect(victim)
        os.kill(before["State"]["Pid"], signal.SIGKILL)      # its init, from the host: a crash, not a stop
        killed_at, killed_after = time.time(), rounds_done()
        _wait(f"{victim} restarted by its restart policy", lambda: (
            (s := compose.inspect(victim))["State"]["Running"] and s["State"]["Pid"] != before["State"]["Pid"]),
            120, lambda: compose.logs(victim)[-2000:])
        restarted_s = time.time() - killed_at
        restarts = compose.inspect(victim)["RestartCount"]
        run.wait(timeout=900)
        doc = results()
        assert doc is not None, log.read_text()[-3000:]
    finally:
        if operator is not None:
            operator.stop()
        states = {n: compose.logs(n)[-1500:] for n in ("superlink", "proxy", *nodes)}
        down = compose("down", "-v", "-t", "5")
    assert run.returncode == 0, log.read_text()[-3000:]
    assert down.returncode == 0, down.stderr[-2000:]
    rows = doc["rounds"]
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1)), [r["round"] for r in rows]
    assert rows[0]["sampled"] == [0, 1, 2] and rows[0]["num_updates"] == 3, rows[0]
    # the killed node (client 1) trains again in a later round; the others never stopped
    def trained(r: dict) -> set[int]:
        return set(r["sampled"]) - {f["cid"] for f in r["failures"]}
    later = [r for r in rows[killed_after + 1:] if 1 in trained(r)]
    assert later, ([(r["round"], r["sampled"], r["failures"]) for r in rows], states[victim])
    assert restarts >= 1
    assert rows[-1]["num_updates"] == 3, rows[-1]
    figures = {"nodes": len(nodes), "rounds": ROUNDS, "killed_after_round": killed_after,
               "restarted_after_s": round(restarted_s, 1), "restart_count": restarts,
               "trained_again_in_round": later[0]["round"], "updates_per_round": [r["num_updates"] for r in rows],
               "failures": [[f["cid"], r["round"], f["kind"]] for r in rows for f in r["failures"]],
               "final_accuracy": round(rows[-1]["global_accuracy"], 4)}
    if os.environ.get("COMPOSE_LIVE_RECORD") == "1":
        RECORD.write_text(json.dumps({"recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                      "podman": compose.podman("--version").stdout.strip(), **figures}, indent=1)
                          + "\n")
    print(f"\n[compose] {len(nodes)} SuperNodes, SuperLink and proxy from compose.yaml; round 1 on "
          f"{rows[0]['num_updates']} nodes; {victim} SIGKILLed after round {killed_after}, restarted by its policy "
          f"{restarted_s:.1f} s later (RestartCount {restarts}), trained again in round {later[0]['round']}; "
          f"per round updates {[r['num_updates'] for r in rows]}")


def test_deployment_md_quotes_the_recorded_compose_run() -> None:
    """What DEPLOYMENT.md says the live compose run showed is benchmarks/results/compose_live.json."""
    rec = json.loads(RECORD.read_text())
    doc = " ".join((ROOT / "docs" / "DEPLOYMENT.md").read_text().split())      # wrapped lines joined
    quoted = (f"SIGKILLed after round {rec['killed_after_round']}, its restart policy started it again "
              f"{rec['restarted_after_s']} s later and it trained again in round {rec['trained_again_in_round']}; "
              f"updates per round {', '.join(map(str, rec['updates_per_round']))}")
    assert quoted in doc, quoted
    assert rec["restart_count"] >= 1 and rec["updates_per_round"][0] == rec["nodes"] == 3
