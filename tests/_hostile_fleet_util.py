"""The hostile-fleet suite's federation and the helpers both of its files use (tests/test_hostile_fleet.py:
bodies, outages, slow clients and uploads from outside; tests/test_hostile_fleet_nodes.py: participants with
registered keys, local users of a node host, and nodes that exit). Each file starts its own federation, so the
two run side by side on two pytest-xdist workers.

HOSTILE_FLEET_RECORD=<file>: the slow tests' measured figures are merged into that file when a file's federation
stops (docs/DEPLOYMENT.md quotes benchmarks/results/hostile_fleet.json, written so).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploy.body_limits import limits_for_run_config  # noqa: E402
from deploy.localfed import LocalFederation, snapshot_app  # noqa: E402

FIGURES: dict[str, dict] = {}
RUN = {"method": "scaffold", "dataset": "digits", "partition": "dirichlet", "seed": 1}  # 2 model-sized records
NODES = 3           # clients 0, 1, 2 train; key 3 belongs to client 3 (a registered node that steals ids);
                    # key 4 to client 4, used only by the reply-bloating participant (no SuperNode of its own)


def require_nginx() -> None:
    if shutil.which("nginx", path=f"{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin") is None:
        pytest.fail("'nginx' is not installed, this test needs the real proxy: run `bash .ci/deps.sh` "
                    "(apt-get install -y nginx-light)")


def merge_figures(record: Path, figures: dict[str, dict]) -> None:
    """Merge ``figures`` into the JSON file ``record`` (created if absent), under an exclusive lock: the two files'
    federations may stop at the same time on two workers. ``recorded`` and the load are the last writer's."""
    with open(record.with_name(record.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        doc = json.loads(record.read_text()) if record.exists() else {}
        doc.update({"recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "load_average_at_end": list(os.getloadavg()), "cpus": os.cpu_count(), **figures})
        record.write_text(json.dumps(doc, indent=1) + "\n")


def start_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalFederation, Path, Any]]:
    """SuperLink + proxy (body limits of RUN's model) + SuperNodes 0..2 (partition i of 4; keys registered with
    deploy/register_node.py and bound to client i, NODE_BINDINGS on the SuperLink); key 3 is registered and
    bound to client 3, and its node (started by the identity test) claims partition 0; key 4 is registered and
    bound to client 4 (the bloating participant speaks Flower's Fleet client itself). The SuperLink bounds replies
    as derived for RUN's model (deploy/link_guard.py). In-memory SuperLink state (no DATABASE), as in
    tests/test_deploy_security.py. Each hostile-fleet test file starts its own (a module fixture), so
    that pytest-xdist's loadfile runs the two files on two workers."""
    require_nginx()
    tmp = tmp_path_factory.mktemp("hostile-fleet")
    limits = limits_for_run_config(RUN)
    configs = [f"partition-id={i} num-partitions=4" for i in range(NODES)] + ["partition-id=0 num-partitions=4"] * 2
    fed = LocalFederation(tmp / "fed", 5, tls=True, node_auth=True, tuned=True, proxy=True,
                          bind_clients=[0, 1, 2, 3, 4], node_configs=configs, register=[0, 1, 2, 3, 4],
                          start_nodes=[0, 1], app_dir=snapshot_app(tmp / "app"), database=False,
                          proxy_settings=limits.nginx(), superlink_settings=limits.superlink())
    try:
        fed.start()
        fed.start_node(2, tuned=False)   # node 2 runs stock flower-supernode through deploy/node_guard.py
        fed.wait_connected([0, 1], superexec=True)
        fed.wait_connected([2])
        yield fed, tmp, limits
    finally:
        fed.stop()
        record = os.environ.get("HOSTILE_FLEET_RECORD")
        if record and FIGURES:
            merge_figures(Path(record), FIGURES)
        assert not any(p.alive() for p in [fed.superlink, fed.proxy_proc, *fed.nodes.values()] if p is not None)


def vm(pid: int, key: str) -> int:
    """VmRSS / VmHWM (peak RSS) of a process in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def restart_proxy(fed: LocalFederation, settings: dict[str, str]) -> None:
    fed.proxy_proc.stop(grace=5)
    fed.proxy_settings = settings
    fed.start_proxy()


def node_stamp(fed: LocalFederation, i: int) -> Path:
    from deploy.node_guard import stamp_path

    return stamp_path({"RUNTIME_PORT": str(fed.runtime_ports[i]), "TMPDIR": os.environ.get("TMPDIR", "/tmp")})


def train_round(fed: LocalFederation, tmp: Path, name: str, timeout: float = 240) -> dict:
    """One SCAFFOLD round on clients 0..2 (every node must train), through the proxy; the results document."""
    res = fed.run({**RUN, "num-server-rounds": 1, "min-train-nodes": NODES, "round-timeout": 60.0,
                   "fraction-train": 1.0, "out-dir": str(tmp / name)}, timeout=timeout, name=name)
    assert res.status == "finished:completed", res.output[-3000:]
    return res.doc


class SlowClients:
    """``n`` attacker threads from 127.0.0.2 that each hold one TLS connection to the Fleet port with half a
    request header, reopening it whenever the proxy drops it, until ``seconds`` have passed."""

    HALF_HEADER = b"POST /v1/fleet/pull-messages HTTP/1.1\r\nHost: localhost\r\nContent-Ty"

    def __init__(self, port: int, ca: Path, n: int, seconds: float) -> None:
        self.port, self.n, self.until = port, n, time.time() + seconds
        self.ctx = ssl.create_default_context(cafile=str(ca))
        self.lock = threading.Lock()
        self.open = self.peak = self.opened = self.dropped = self.failed = 0
        self.held: list[float] = []
        self.threads = [threading.Thread(target=self._hold, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def _hold(self) -> None:
        while time.time() < self.until:
            try:
                raw = socket.create_connection(("127.0.0.1", self.port), timeout=10, source_address=("127.0.0.2", 0))
                conn = self.ctx.wrap_socket(raw, server_hostname="localhost")
                conn.sendall(self.HALF_HEADER)
            except OSError:
                with self.lock:
                    self.failed += 1
                time.sleep(0.2)
                continue
            start = time.time()
            with self.lock:
                self.open += 1
                self.opened += 1
                self.peak = max(self.peak, self.open)
            dropped = False
            try:
                conn.settimeout(max(0.1, self.until - time.time()))
                dropped = conn.recv(1) == b"" or True     # anything or EOF: the proxy ended it
            except socket.timeout:
                pass
            except OSError:
                dropped = True                             # reset (reset_timedout_connection)
            with self.lock:
                self.open -= 1
                if dropped:
                    self.dropped += 1
                    self.held.append(time.time() - start)
            conn.close()

    def join(self) -> None:
        for t in self.threads:
            t.join(30)
