"""The operator's side of a containerised federation for the live deployment tests: the Control API through
deploy/operator_tunnel.py (operator certificate), the flwr CLI on it, and node keys registered and bound to
client ids with deploy/register_node.py, as compose.yaml's header and the Kubernetes notes tell an operator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from deploy.connection import write_connection
from deploy.localfed import free_ports

ROOT = Path(__file__).resolve().parents[1]
FLWR = str(Path(sys.executable).parent / "flwr")


@dataclass
class Operator:
    tunnel: subprocess.Popen
    env: dict[str, str]
    connection: str

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([FLWR, *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def register(self, certs: Path, num_nodes: int, bindings: Path) -> None:
        """Register supernode-<i>.pub bound to client id i (the bindings table the SuperLink reads)."""
        for i in range(num_nodes):
            reg = subprocess.run([sys.executable, "-m", "deploy.register_node",
                                  str(certs / "keys" / f"supernode-{i}.pub"), str(i), self.connection,
                                  "--bindings", str(bindings), "--flwr", FLWR],
                                 cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=180)
            assert reg.returncode == 0, reg.stdout[-2000:] + reg.stderr[-2000:]

    def online(self) -> int:
        res = self.flwr("supernode", "list", self.connection, "--format", "json")
        try:
            return sum(n["status"] == "online" for n in json.loads(res.stdout)["nodes"])
        except (ValueError, KeyError):
            return 0

    def stop(self) -> None:
        self.tunnel.terminate()


def start_operator(certs: Path, workdir: Path, connection: str, control: str = "127.0.0.1:9443") -> Operator:
    """A tunnel to the proxy's Control listener at ``control`` and a FLWR_HOME whose default connection uses it."""
    port = free_ports(1)[0]
    tunnel = subprocess.Popen(
        [sys.executable, str(ROOT / "deploy" / "operator_tunnel.py"), "--listen", f"127.0.0.1:{port}",
         "--connect", control, "--server-name", "localhost", "--ca", str(certs / "ca.crt"),
         "--cert", str(certs / "operators" / "operator.crt"), "--key", str(certs / "operators" / "operator.key")],
        stdout=subprocess.DEVNULL, stderr=(workdir / "tunnel.log").open("w"))
    home = workdir / "flwr-home"
    write_connection(connection, f"127.0.0.1:{port}", None, home=home, make_default=True)
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0"}
    return Operator(tunnel, env, connection)
