"""A real Flower federation on one machine: a SuperLink and N SuperNodes as separate processes on
loopback, started through ``deploy/superlink.sh`` / ``deploy/supernode.sh`` (the scripts an operator
runs), driven with the ``flwr`` CLI. With ``proxy=True`` (TLS) the SuperLink sits behind the reverse proxy
(``deploy/proxy.sh``, nginx) as in a real deployment: SuperNodes reach only its Fleet listener and the
``flwr`` CLI goes through ``deploy/operator_tunnel.py`` to its Control listener with an operator
certificate (mTLS); connection ``localfed`` still reaches the SuperLink's loopback port directly, as an
operator logged in on the SuperLink host would. Used by tests/test_deployment.py and benchmarks/bench_deployment.py;
also a command for trying a deployment by hand:

    python -m deploy.localfed --nodes 3 --tuned -c "method='fedbc' dataset='digits' num-server-rounds=3"

Every process is started in its own session (process group), so :meth:`LocalFederation.stop` and
:meth:`LocalFederation.kill_node` take down the SuperNode/SuperLink together with the SuperExec and the
ClientApp/ServerApp processes it started. Ports are picked free at start; ``FLWR_HOME`` (connection
config, installed FABs) lives under the work directory, one per process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from deploy.connection import toml_value, write_connection

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CONNECTION = "localfed"          # the SuperLink's own loopback port (an operator on the SuperLink host)
OPERATOR = "operator"            # through the proxy's Control listener with an operator certificate


class FederationError(RuntimeError):
    """A process did not come up, or a run did not finish, within its time limit."""


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None, what: str = "") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise FederationError(f"{what} exited with code {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise FederationError(f"{what} did not listen on port {port} within {timeout:.0f}s")


def snapshot_app(dst: Path, src: Path = ROOT) -> Path:
    """Copy the app (pyproject.toml + the Python packages it declares) to ``dst`` for ``flwr run``.

    ``flwr run <dir>`` packs every .py/.toml/.md/.json/.yaml file under ``<dir>`` into the FAB, results
    and docs included; a snapshot keeps the FAB small and immune to files that change while a run is
    being submitted (e.g. experiments writing results/ in the same working tree)."""
    import tomllib

    config = tomllib.loads((src / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["packages"]["find"]["include"]
    dst.mkdir(parents=True, exist_ok=True)
    # The snapshot holds only code, so the repository's `fab-exclude` patterns would match nothing (which
    # flwr rejects): drop that key from the copied pyproject.toml.
    text = re.sub(r"(?ms)^fab-exclude\s*=\s*\[.*?\]\s*\n", "", (src / "pyproject.toml").read_text())
    (dst / "pyproject.toml").write_text(text)
    ignore = shutil.ignore_patterns("__pycache__", "results", "*.pt", "*.npz", "*.png", "*.csv", "*.pyc")
    for pkg in sorted({p.rstrip("*") for p in patterns}):
        if (src / pkg / "__init__.py").exists():
            shutil.copytree(src / pkg, dst / pkg, ignore=ignore, dirs_exist_ok=True)
    return dst


def run_config_toml(overrides: Mapping[str, Any]) -> str:
    return "".join(f"{k} = {toml_value(v)}\n" for k, v in overrides.items())


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group; SIGKILL what is left after ``grace`` seconds."""
        self.signal_group(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        self.signal_group(signal.SIGKILL)  # also stragglers of the group (SuperExec, app processes)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class RunResult:
    run_id: int | None
    output: str
    status: str
    doc: dict[str, Any] | None
    wall_s: float


@dataclass
class LocalFederation:
    """SuperLink + SuperNodes on loopback. Use as a context manager (stops everything on exit)."""

    workdir: Path
    num_nodes: int = 3
    tls: bool = False
    node_auth: bool = False
    tuned: bool = False
    proxy: bool = False                       # nginx in front (needs tls); nodes + CLI go through it
    poll: float = 0.5
    node_configs: list[str] | None = None     # default: partition-id=i num-partitions=num_nodes
    register: list[int] | None = None         # with node_auth: nodes whose keys get registered (default all)
    start_nodes: list[int] | None = None      # nodes that start() launches (default all; others: start_node)
    app_dir: Path = ROOT                      # what `flwr run` packs (see snapshot_app)
    database: bool = True                     # SuperLink state in <workdir>/state/superlink.db (SQLite, as DATABASE
                                              # in production); False: Flower's in-memory state (the
                                              # SuperLink's default; measured ~half its CPU per request)
    proxy_settings: Mapping[str, str] | None = None  # extra deploy/proxy.sh settings (body limits, budgets)
    superlink_settings: Mapping[str, str] | None = None  # extra deploy/superlink.sh settings (reply bounds)
    bind_clients: list[int] | None = None     # with node_auth: node i's key is bound to client id bind_clients[i]
                                              # at registration (deploy/register_node.py; NODE_BINDINGS)
    python: str = sys.executable
    startup_timeout: float = 90.0
    superlink: Proc | None = field(default=None, init=False)
    proxy_proc: Proc | None = field(default=None, init=False)
    tunnel: Proc | None = field(default=None, init=False)
    nodes: dict[int, Proc] = field(default_factory=dict, init=False)
    restarts: list[tuple[int, int, float]] = field(default_factory=list, init=False)  # (node, exit code, time)
    node_modes: dict[int, tuple[bool | None, dict[str, str]]] = field(default_factory=dict, init=False)
    # ^ start_node's `tuned` and extra settings per node, for restarts
    port: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        if self.node_auth and not self.tls:
            raise ValueError("SuperNode authentication needs TLS (tls=True)")
        if self.proxy and not self.tls:
            raise ValueError("the proxy needs TLS (tls=True)")
        if self.node_configs is not None and len(self.node_configs) != self.num_nodes:
            raise ValueError(f"{len(self.node_configs)} node configs for {self.num_nodes} nodes")
        self.home = self.workdir / "flwr-home"
        self.certs = self.workdir / "certs"
        self.logs = self.workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.secret: Path | None = None
        ports = free_ports(7 + self.num_nodes)
        self.port, self.runtime_ports = ports[0], ports[7:]
        # proxy listeners (Fleet, Control, health) and the operator tunnel, used when proxy=True
        self.fleet_port, self.control_port, self.health_port, self.tunnel_port = ports[1:5]
        self.fleet_status_port, self.control_status_port = ports[5:7]   # the proxy's stub_status (loopback)
        self.connection = OPERATOR if self.proxy else CONNECTION
        self.fleet_address = f"127.0.0.1:{self.fleet_port if self.proxy else self.port}"
        self.bindings = self.workdir / "bindings" / "node-bindings.json" if self.bind_clients is not None else None
        if self.bind_clients is not None and (not self.node_auth or len(self.bind_clients) != self.num_nodes):
            raise ValueError("bind_clients needs node_auth and one client id per node")

    # ------------------------------------------------------------------------------ environment
    def env(self, home: Path) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{Path(self.python).parent}{os.pathsep}{env.get('PATH', '')}"
        env.update(FLWR_HOME=str(home), PYTHON=self.python, FLWR_TELEMETRY_ENABLED="0",
                   OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"), PYTHONUNBUFFERED="1",
                   TUNED="1" if self.tuned else "0", POLL=str(self.poll))
        for key in ("CERTS_DIR", "NODE_AUTH", "CA_CERT", "AUTH_KEY", "DATABASE", "LOG_FILE", "SUPEREXEC_SECRET_FILE",
                    "SUPERLINK_HOST", "EXPOSE_ALL_APIS", "PROXY_HOST", "FLEET_PORT", "CONTROL_PORT", "HEALTH_PORT",
                    "FLEET_STATUS_PORT", "CONTROL_STATUS_PORT",
                    "SUPERLINK_UPSTREAM", "PROXY_RUN_DIR", "MAX_BODY", "FLEET_OBJECT_MAX_BODY", "FLEET_MAX_BODY",
                    "CONTROL_MAX_BODY", "FLEET_CONNECTIONS", "FLEET_UPSTREAM_CONNS", "CONTROL_UPSTREAM_CONNS",
                    "FLEET_CONN_PER_IP", "FLEET_OBJECT_CONN_PER_IP", "FLEET_OBJECT_CONNS", "FLEET_REQ_RATE", "FLEET_REQ_BURST", "CLIENT_HEADER_TIMEOUT",
                    "CLIENT_BODY_TIMEOUT", "NODE_BINDINGS", "POLL_STAMP", "POLL_STALE", "FLEET_MAX_REPLY_OBJECTS",
                    "FLEET_OBJECT_BUFFERING", "FLEET_MAX_REPLY_BYTES", "ACTIVATION_PATIENCE",
                    "HEARTBEAT_INTERVAL"):
            env.pop(key, None)
        return env

    def flwr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run the ``flwr`` CLI against this federation."""
        return subprocess.run([str(Path(self.python).parent / "flwr"), *args], env=self.env(self.home),
                              cwd=self.workdir, capture_output=True, text=True, timeout=timeout)

    def run_rogue_node(self, name: str, node_config: str, timeout: float = 120.0, **extra: str) -> tuple[int, str]:
        """Start a SuperNode outside the federation's own (``extra``: env such as AUTH_KEY or MAX_WAIT) against
        the Fleet address with the CA, wait for it to end, and return (exit code, its log)."""
        env = self.env(self.workdir / f"{name}-home")
        env.update(SUPERLINK=self.fleet_address, RUNTIME_PORT=str(free_ports(1)[0]), TUNED="0",
                   NODE_CONFIG=node_config, CA_CERT=str(self.certs / "ca.crt"), **extra)
        proc = self._spawn(name, "supernode.sh", env)
        try:
            proc.popen.wait(timeout=timeout)
        finally:
            proc.stop(grace=2)
        return proc.popen.returncode, proc.log.read_text(errors="replace")

    def _spawn(self, name: str, script: str, env: dict[str, str]) -> Proc:
        return self._spawn_cmd(name, ["bash", str(DEPLOY / script)], env)

    def _spawn_cmd(self, name: str, cmd: list[str], env: dict[str, str]) -> Proc:
        log = self.logs / f"{name}.log"
        fh = open(log, "ab")
        popen = subprocess.Popen(cmd, env=env, cwd=self.workdir, stdout=fh,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        fh.close()
        return Proc(name, popen, log)

    # ------------------------------------------------------------------------------ lifecycle
    def start(self) -> "LocalFederation":
        try:
            if self.tls:
                subprocess.run(["bash", str(DEPLOY / "pki.sh"), str(self.certs), str(self.num_nodes)],
                               check=True, capture_output=True, text=True)
                if self.tuned:  # the SuperExecs must authenticate to the Runtime APIs
                    self.secret = self.certs / "superexec.secret"
                    self.secret.write_bytes(os.urandom(32))
                    self.secret.chmod(0o600)
            self.start_superlink()
            write_connection(CONNECTION, f"127.0.0.1:{self.port}",
                             self.certs / "ca.crt" if self.tls else None, make_default=True, home=self.home)
            if self.proxy:
                self.start_proxy()
                self.start_tunnel()
                write_connection(OPERATOR, f"127.0.0.1:{self.tunnel_port}", make_default=True, home=self.home)
            if self.node_auth:
                for i in (range(self.num_nodes) if self.register is None else self.register):
                    self.register_node(i)
            for i in (range(self.num_nodes) if self.start_nodes is None else self.start_nodes):
                self.start_node(i)
            return self
        except BaseException:
            self.stop()
            raise

    def start_superlink(self) -> None:
        env = self.env(self.workdir / "superlink-home")
        env.update(SUPERLINK_HOST="127.0.0.1", SUPERLINK_PORT=str(self.port))
        if self.database:
            env["DATABASE"] = str(self.workdir / "state" / "superlink.db")
        if self.tls:
            env["CERTS_DIR"] = str(self.certs)
        if self.secret is not None:
            env["SUPEREXEC_SECRET_FILE"] = str(self.secret)
        if self.node_auth:
            env["NODE_AUTH"] = "1"
        if self.bindings is not None:
            env["NODE_BINDINGS"] = str(self.bindings)
        env.update(self.superlink_settings or {})
        self.superlink = self._spawn("superlink", "superlink.sh", env)
        wait_port(self.port, self.startup_timeout, self.superlink.popen, "the SuperLink")

    def start_proxy(self) -> None:
        """nginx in front of the SuperLink (deploy/proxy.sh), all listeners on loopback."""
        env = self.env(self.workdir / "proxy-home")
        env.update(CERTS_DIR=str(self.certs), PROXY_HOST="127.0.0.1", FLEET_PORT=str(self.fleet_port),
                   CONTROL_PORT=str(self.control_port), HEALTH_PORT=str(self.health_port),
                   FLEET_STATUS_PORT=str(self.fleet_status_port), CONTROL_STATUS_PORT=str(self.control_status_port),
                   SUPERLINK_UPSTREAM=f"127.0.0.1:{self.port}", PROXY_RUN_DIR=str(self.workdir / "proxy"))
        env.update(self.proxy_settings or {})
        if self.proxy_proc is not None and self.proxy_proc.alive():
            raise FederationError("the proxy is already running")
        self.proxy_proc = self._spawn("proxy", "proxy.sh", env)
        for port in (self.fleet_port, self.control_port, self.health_port):
            wait_port(port, self.startup_timeout, self.proxy_proc.popen, "the proxy (deploy/proxy.sh)")

    def start_tunnel(self) -> None:
        """deploy/operator_tunnel.py: loopback port -> the proxy's Control listener, operator certificate."""
        ops = self.certs / "operators"
        cmd = [self.python, str(DEPLOY / "operator_tunnel.py"), "--listen", f"127.0.0.1:{self.tunnel_port}",
               "--connect", f"127.0.0.1:{self.control_port}", "--ca", str(self.certs / "ca.crt"),
               "--cert", str(ops / "operator.crt"), "--key", str(ops / "operator.key"), "--server-name", "localhost"]
        self.tunnel = self._spawn_cmd("operator-tunnel", cmd, self.env(self.home))
        wait_port(self.tunnel_port, self.startup_timeout, self.tunnel.popen, "the operator tunnel")

    def node_config(self, i: int) -> str:
        if self.node_configs is not None:
            return self.node_configs[i]
        return f"partition-id={i} num-partitions={self.num_nodes}"

    def register_node(self, i: int) -> str:
        key = str(self.certs / "keys" / f"supernode-{i}.pub")
        if self.bindings is not None:
            assert self.bind_clients is not None  # bindings are made only with bind_clients (__post_init__)
            self.bindings.parent.mkdir(mode=0o700, exist_ok=True)
            res = subprocess.run([self.python, str(DEPLOY / "register_node.py"), key, str(self.bind_clients[i]),
                                  self.connection, "--bindings", str(self.bindings),
                                  "--flwr", str(Path(self.python).parent / "flwr")],
                                 env=self.env(self.home), cwd=self.workdir, capture_output=True, text=True, timeout=180)
        else:
            res = self.flwr("supernode", "register", key, self.connection)
        if res.returncode != 0:
            raise FederationError(f"registering supernode-{i} failed:\n{res.stdout}\n{res.stderr}")
        return res.stdout

    def start_node(self, i: int, tuned: bool | None = None, **extra: str) -> Proc:
        """Start SuperNode ``i``; ``tuned`` overrides the federation's mode for this node (e.g. False for a
        node that is only meant to be refused: a stock SuperNode does not preload torch in a SuperExec);
        ``extra``: more supernode.sh settings (e.g. ACTIVATION_PATIENCE="0" for a node meant to be refused at
        activation, which would otherwise retry for 75 s), kept for its restarts by :meth:`restart_policy`."""
        env = self.env(self.workdir / f"node-{i}")
        env.update(SUPERLINK=self.fleet_address, RUNTIME_PORT=str(self.runtime_ports[i]),
                   NODE_CONFIG=self.node_config(i))
        if tuned is not None:
            env["TUNED"] = "1" if tuned else "0"
        if self.tls:
            env["CA_CERT"] = str(self.certs / "ca.crt")
        if self.secret is not None:
            env["SUPEREXEC_SECRET_FILE"] = str(self.secret)
        if self.node_auth:
            env["AUTH_KEY"] = str(self.certs / "keys" / f"supernode-{i}")
        env.update(extra)
        if i in self.nodes and self.nodes[i].alive():
            raise FederationError(f"supernode-{i} is already running")
        self.nodes[i] = self._spawn(f"supernode-{i}", "supernode.sh", env)
        self.node_modes[i] = (tuned, dict(extra))
        return self.nodes[i]

    def wait_connected(self, nodes: list[int] | None = None, timeout: float | None = None,
                       superexec: bool = False) -> None:
        """Wait until the given SuperNodes logged their SuperLink-assigned node id; with ``superexec`` also
        until their SuperExec started (TUNED: after preloading torch, seconds after the node connected; a
        message that arrives earlier waits for it)."""
        nodes = list(self.nodes) if nodes is None else nodes
        marks = ("SuperNode ID:", "Starting Flower SuperExec") if superexec else ("SuperNode ID:",)
        deadline = time.time() + (timeout or self.startup_timeout)
        while True:
            logs = {i: self.nodes[i].log.read_text(errors="replace") for i in nodes}
            missing = [i for i in nodes if not all(m in logs[i] for m in marks)]
            if not missing:
                return
            dead = [i for i in missing if not self.nodes[i].alive()]
            if dead or time.time() > deadline:
                detail = "\n".join(f"--- supernode-{i}:\n{self.nodes[i].tail()}" for i in missing)
                raise FederationError(f"supernode(s) {missing} did not connect "
                                      f"({'exited' if dead else 'timeout'}):\n{detail}")
            time.sleep(0.3)

    def kill_node(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Kill SuperNode ``i`` and everything it started (SuperExec, a running ClientApp)."""
        self.nodes[i].signal_group(sig)
        try:
            self.nodes[i].popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.nodes[i].signal_group(signal.SIGKILL)

    def restart_policy(self, nodes: list[int], delay: float = 1.0) -> Callable[[], None]:
        """Restart each of ``nodes`` whenever its SuperNode exits, as compose's ``restart: unless-stopped`` and a
        Kubernetes pod do (a node whose Fleet connection gave up exits 75: deploy/node_guard.py). Each restart is
        recorded in :attr:`restarts` and appended to the node's log. Returns the function that ends the policy."""
        done = threading.Event()

        def watch() -> None:
            while not done.wait(0.2):
                for i in nodes:
                    proc = self.nodes.get(i)
                    if proc is not None and not proc.alive() and not done.is_set():
                        self.restarts.append((i, int(proc.popen.returncode), time.time()))
                        done.wait(delay)
                        if not done.is_set():
                            tuned, extra = self.node_modes.get(i, (None, {}))
                            self.start_node(i, tuned, **extra)   # as it was started

        thread = threading.Thread(target=watch, name="restart-policy", daemon=True)
        thread.start()

        def end() -> None:
            done.set()
            thread.join(timeout=10)

        return end

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every process group at once, SIGKILL what is left after ``grace`` seconds."""
        procs = list(self.nodes.values()) + [p for p in (self.tunnel, self.proxy_proc, self.superlink) if p]
        for proc in procs:
            proc.signal_group(signal.SIGTERM)
        deadline = time.time() + grace
        for proc in procs:
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        for proc in procs:
            proc.stop(grace=0.0)  # SIGKILL the group: stragglers (SuperExec, app processes) included

    def __enter__(self) -> "LocalFederation":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------ runs
    def submit(self, overrides: Mapping[str, Any], name: str = "run") -> subprocess.Popen:
        """Start ``flwr run <project> <connection> --stream -c <overrides.toml>`` in the background."""
        cfg = self.workdir / f"{name}.toml"
        cfg.write_text(run_config_toml(overrides))
        out = open(self.logs / f"{name}.out", "wb")
        popen = subprocess.Popen([str(Path(self.python).parent / "flwr"), "run", str(self.app_dir), self.connection,
                                  "--stream", "-c", str(cfg)], env=self.env(self.home), cwd=self.workdir,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        return popen

    def finish(self, popen: subprocess.Popen, overrides: Mapping[str, Any], name: str, started: float,
               timeout: float) -> RunResult:
        try:
            popen.wait(timeout=max(1.0, started + timeout - time.time()))
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()
        wall = time.time() - started
        output = (self.logs / f"{name}.out").read_text(errors="replace")
        run_id = None
        for line in output.splitlines():
            if "Successfully started run" in line:
                run_id = int(line.rsplit(" ", 1)[-1])
        status = self.run_status(run_id) if run_id is not None else "not started"
        if run_id is not None and not status.startswith("finished"):
            self.flwr("stop", str(run_id), self.connection)
        doc = None
        path = Path(str(overrides.get("out-dir", ""))) / "results.json"
        if overrides.get("out-dir") and path.exists():
            doc = json.loads(path.read_text())
        return RunResult(run_id, output, status, doc, wall)

    def run(self, overrides: Mapping[str, Any], timeout: float = 600.0, name: str = "run") -> RunResult:
        """Submit a run, stream it to ``logs/<name>.out``, wait; the results.json is read from ``out-dir``
        (make it absolute: the ServerApp's working directory is the SuperLink's)."""
        started = time.time()
        return self.finish(self.submit(overrides, name), overrides, name, started, timeout)

    def run_status(self, run_id: int) -> str:
        res = self.flwr("list", "--run-id", str(run_id), self.connection, "--format", "json")
        try:
            runs = json.loads(res.stdout)["runs"]
            return str(runs[0]["status"])
        except (ValueError, KeyError, IndexError):
            return f"unknown ({res.stdout.strip()[:200]} {res.stderr.strip()[:200]})"


def _parse_overrides(text: str) -> dict[str, Any]:
    """``"method='fedprox' fedprox.mu=0.1"`` -> ``{"method": "fedprox", "fedprox.mu": 0.1}``: TOML pairs,
    with dotted (sectioned) keys kept flat, as ``flwr run -c`` hands them to the ServerApp."""
    import tomllib

    from flwr.common.config import flatten_dict

    return flatten_dict(tomllib.loads("\n".join(text.split()))) if text else {}


def federation_from_args(ns: argparse.Namespace, workdir: Path) -> LocalFederation:
    """The federation the command line asks for. With ``--auth`` every node's key is bound to its client id
    (node i to partition i, NODE_BINDINGS) at registration, as production registers nodes
    (deploy/register_node.py): a node can then claim no other id."""
    return LocalFederation(workdir, ns.nodes, tls=ns.tls or ns.auth or ns.proxy, node_auth=ns.auth, tuned=ns.tuned,
                           proxy=ns.proxy, poll=ns.poll, bind_clients=list(range(ns.nodes)) if ns.auth else None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Start a loopback federation, run once, stop it.")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--auth", action="store_true", help="SuperNode authentication (implies --tls)")
    parser.add_argument("--tuned", action="store_true", help="warm ClientApps + fast polls (deploy/tuned.py)")
    parser.add_argument("--proxy", action="store_true", help="nginx in front of the SuperLink (implies --tls)")
    parser.add_argument("--poll", type=float, default=0.5)
    parser.add_argument("-c", "--run-config", default="", help="run-config overrides, TOML key=value pairs")
    parser.add_argument("--workdir", default="")
    ns = parser.parse_args(argv)
    workdir = Path(ns.workdir or tempfile.mkdtemp(prefix="localfed-"))
    overrides = {"out-dir": str(workdir / "out"), **_parse_overrides(ns.run_config)}
    with federation_from_args(ns, workdir) as fed:
        fed.wait_connected()
        res = fed.run(overrides)
        print(res.output)
        print(f"run {res.run_id}: {res.status} in {res.wall_s:.1f}s; logs in {fed.logs}")


if __name__ == "__main__":
    main()
