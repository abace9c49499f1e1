"""Scaling out (issue 22): a simulation on a multi-node Ray cluster, and GPU fractions per client.

Fast tests follow a client's resource request through the installed Flower: `flwr run`'s
``--federation-config`` (parsed, merged with the federation's defaults and sent as the SimulationConfig
protobuf, as the SuperLink receives it) and ``simulate(engine="ray")`` both end up as the options of every
``ClientAppActor`` Flower creates, and the number of actors per GPU follows from them (no GPU needed).
The slow tests start a 2-node Ray cluster on loopback with Ray's own ``ray.cluster_utils.Cluster``
(1 CPU per node, so one client actor fits on each node and both must be used). One runs 2 rounds through
``simulate(ray_address=...)`` with 1 logical GPU per node and half a GPU per client, records on which Ray
node each ClientApp call ran and what Ray assigned to it, and compares the results with a one-node run of
the same seed; the other runs ``flwr run . local`` with ``RAY_ADDRESS`` set and finds the run's client
actors on both nodes. docs/SCALING.md describes the same steps for real machines.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch

from experiments.simulate import simulate

FEDERATION_CONFIG = "num-supernodes=10 client-resources-num-cpus=1 client-resources-num-gpus=0.1"


def _flwr_run_backend_config(federation_config: str) -> tuple[int, dict[str, Any]]:
    """(num-supernodes, backend config) as the simulation process of `flwr run ... --federation-config` gets them:
    the CLI's parsing, the SuperLink's merge over the federation defaults, the protobuf on the wire and
    the simulation process's reading, all from the installed Flower."""
    from flwr.common.config import parse_config_args
    from flwr.proto.federation_config_pb2 import SimulationConfig
    from flwr.simulation.app import _run_simulation_settings
    from flwr.supercore.constant import DEFAULT_SIMULATION_CONFIG
    from flwr.supercore.utils import simulation_config_from_json

    parsed = parse_config_args([federation_config])
    override = simulation_config_from_json({k.replace("-", "_"): v for k, v in parsed.items()})
    resolved = SimulationConfig()
    resolved.CopyFrom(DEFAULT_SIMULATION_CONFIG)
    resolved.MergeFrom(override)
    on_the_wire = SimulationConfig.FromString(resolved.SerializeToString())
    num_supernodes, backend, config, _, _ = _run_simulation_settings(on_the_wire)
    assert backend == "ray"
    return num_supernodes, config


class _RecordingActorType:
    """Stands in for Flower's ClientAppActor: records the Ray options each actor is created with."""

    created: list[dict[str, Any]] = []

    @classmethod
    def options(cls, **options: Any) -> Any:
        cls.created.append(options)
        return cls

    @classmethod
    def remote(cls, **kwargs: Any) -> str:
        return f"actor-{len(cls.created)}"


def _actors_per_node(client_resources: dict[str, Any], node: dict[str, float],
                     monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[dict[str, Any]]]:
    """How many ClientApp actors Flower's pool puts on a node with ``node`` resources, and their options."""
    import flwr.simulation.ray_transport.ray_actor as ray_actor

    monkeypatch.setattr(ray_actor.ray, "nodes", lambda: [{"Resources": dict(node)}])
    _RecordingActorType.created = []
    pool = ray_actor.BasicActorPool(actor_type=_RecordingActorType, client_resources=client_resources,
                                    actor_kwargs={})
    pool.add_actors_to_pool(pool.actors_capacity)
    return pool.num_actors, list(_RecordingActorType.created)


def test_flwr_run_gpu_fraction_reaches_every_client_actor(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    num_supernodes, config = _flwr_run_backend_config(FEDERATION_CONFIG)
    assert num_supernodes == 10
    # the protobuf field is a float32: 0.1 arrives as 0.10000000149011612
    assert config["client_resources"] == {"num_cpus": 1, "num_gpus": float(np.float32(0.1))}
    assert config["client_resources"]["num_gpus"] > 0.1
    # no init-args-num-cpus: ray.init() gets no CPU count, so it can attach to a running cluster
    assert config["init_args"] == {"logging_level": "WARNING", "log_to_driver": True}
    backend = RayBackend.__new__(RayBackend)  # its __init__ would start Ray; only the validation is used
    backend.client_resources_key = "client_resources"
    resources = backend._validate_client_resources(config)
    n, options = _actors_per_node(resources, {"CPU": 16.0, "GPU": 1.0}, monkeypatch)
    assert options == [{"num_cpus": 1, "num_gpus": float(np.float32(0.1))}] * n
    # Flower sizes the pool as int(GPUs / fraction) per node: the float32 rounding makes that 9, not 10
    assert n == 9
    _, fixed = _flwr_run_backend_config("num-supernodes=10 client-resources-num-cpus=1 client-resources-num-gpus=0.0999")
    assert _actors_per_node(fixed["client_resources"], {"CPU": 16.0, "GPU": 1.0}, monkeypatch)[0] == 10
    # CPUs bound the pool too; a node without a GPU gets no actor that asks for one
    assert _actors_per_node(resources, {"CPU": 4.0, "GPU": 1.0}, monkeypatch)[0] == 4
    assert _actors_per_node(resources, {"CPU": 4.0, "GPU": 2.0}, monkeypatch)[0] == 4
    with pytest.raises(ValueError, match="ActorPool is empty"):
        _actors_per_node(resources, {"CPU": 16.0}, monkeypatch)


def test_flwr_run_federation_config_takes_whole_cpus_only() -> None:
    with pytest.raises(TypeError):  # client_resources_num_cpus is a uint32 in Flower's protobuf
        _flwr_run_backend_config("num-supernodes=2 client-resources-num-cpus=0.5")


class _Captured(Exception):
    pass


def test_simulate_hands_gpu_fraction_and_cluster_address_to_flower(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    import engines.ray

    seen: dict[str, Any] = {}

    def fake_run_simulation(**kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Captured

    monkeypatch.setattr(engines.ray, "run_simulation", fake_run_simulation)
    monkeypatch.setattr(engines.ray, "start_ray", lambda init_args: seen.update(started=dict(init_args)))
    cfg = {"dataset": "digits", "num-server-rounds": 1, "out-dir": str(tmp_path)}
    with pytest.raises(_Captured):
        simulate(cfg, num_supernodes=10, engine="ray", cpus_per_client=1, gpus_per_client=0.1,
                 ray_address="10.0.0.1:6379")
    backend = seen["backend_config"]
    assert seen["num_supernodes"] == 10
    assert backend["client_resources"] == {"num_cpus": 1, "num_gpus": 0.1,  # a Python float: exactly 0.1
                                           **engines.ray.ACTOR_FAULT_TOLERANCE}  # crashed actors restarted
    assert backend["init_args"]["address"] == "10.0.0.1:6379" and "num_cpus" not in backend["init_args"]
    assert seen["started"] == backend["init_args"]  # Ray is started (attached) with them before Flower runs
    # through simulate() the fraction is not rounded: 10 actors share one GPU
    assert _actors_per_node(backend["client_resources"], {"CPU": 16.0, "GPU": 1.0}, monkeypatch)[0] == 10
    with pytest.raises(_Captured):
        simulate(cfg, num_supernodes=3, engine="ray", total_cpus=2)
    assert seen["backend_config"]["init_args"]["num_cpus"] == 2 and "address" not in seen["backend_config"]["init_args"]
    with pytest.raises(ValueError, match="total_cpus cannot be combined with ray_address"):
        simulate(cfg, num_supernodes=3, engine="ray", total_cpus=2, ray_address="10.0.0.1:6379")


# ============================================================================ slow: a 2-node Ray cluster
class PlacementRecorder:
    """Wraps the ClientApp inside the Ray actors: appends (Ray node id, pid, assigned resources, client,
    message type) of every call to ``<log_dir>/<pid>.jsonl``, then runs the real ClientApp."""

    def __init__(self, inner: Any, log_dir: str) -> None:
        self.inner, self.log_dir = inner, log_dir

    def __call__(self, message: Any, context: Any) -> Any:
        import ray

        rt = ray.get_runtime_context()
        row = {"node": rt.get_node_id(), "pid": os.getpid(), "resources": rt.get_assigned_resources(),
               "cid": int(context.node_config["partition-id"]), "type": message.metadata.message_type}
        with open(os.path.join(self.log_dir, f"{os.getpid()}.jsonl"), "a") as fh:
            fh.write(json.dumps(row) + "\n")
        return self.inner(message=message, context=context)


def _without_times(value: Any) -> Any:
    """The results document minus wall-clock fields (the only part two runs of one seed may differ in)."""
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if "time" not in k}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


def _ray_processes_under(root: str) -> list[int]:
    """PIDs of live processes whose command line mentions ``root`` (the cluster's private temp dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if root in cmd:
                found.append(int(entry))
    return found


@contextlib.contextmanager
def loopback_cluster(monkeypatch: pytest.MonkeyPatch, gpus_per_node: int = 0) -> Iterator[tuple[Any, set[str], str]]:
    """A 2-node Ray cluster on loopback (ray.cluster_utils), 1 CPU per node: (cluster, node ids, temp dir).

    Head on 127.0.0.2, worker on 127.0.0.1: ``ray.init`` rewrites an address of 127.0.0.1 to the machine's
    outward IP, so the head listens on a second loopback address. A private, short Ray temp dir keeps the
    cluster's address file (``ray_current_cluster``) and sockets out of /tmp/ray, so no other Ray user on
    this machine attaches to it by accident. Shut down (and checked to leave no process) on exit."""
    from ray.cluster_utils import Cluster

    ray_tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "num_gpus": gpus_per_node, "node_ip_address": "127.0.0.2", "include_dashboard": False})
        try:
            cluster.add_node(num_cpus=1, num_gpus=gpus_per_node, node_ip_address="127.0.0.1")
            yield cluster, {cluster.head_node.node_id, *(n.node_id for n in cluster.worker_nodes)}, ray_tmp
        finally:
            cluster.shutdown()
        assert _ray_processes_under(ray_tmp) == []
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[tuple[Any, set[str], str]]:
    """One 2-node loopback cluster (1 CPU and 1 logical GPU per node) for both cluster tests of this module:
    started once, shut down (and checked to leave no process) after the last."""
    with pytest.MonkeyPatch.context() as mp, loopback_cluster(mp, gpus_per_node=1) as started:
        yield started


def _client_actors(address: str) -> dict[str, Any]:
    """Ray's actor table of the cluster at ``address``: actor id -> entry, for Flower's ClientApp actors (dead
    ones included: the table keeps the actors of finished jobs)."""
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        return {k: a for k, a in ray._private.state.actors().items() if a["ActorClassName"] == "ClientAppActor"}
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_two_node_ray_cluster_trains_on_both_nodes_like_one_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  gpu_cluster) -> None:
    import client_app.app

    cfg = {"dataset": "digits", "num-server-rounds": 2, "seed": 5, "device": "cpu", "federated-eval-every": 1,
           "local-test-fraction": 0.25}
    # the one-node reference on the in-process engine, which gives Ray's numbers bit for bit
    # (tests/test_engine_equivalence.py) without starting a Ray of its own
    one = simulate({**cfg, "out-dir": str(tmp_path / "one-node")}, num_supernodes=4)
    calls = tmp_path / "calls"
    calls.mkdir()
    # 1 CPU and 1 logical GPU per node, clients ask for 1 CPU and 0.5 GPU: one actor fits per node
    cluster, nodes, _ = gpu_cluster
    monkeypatch.setattr(client_app.app, "app", PlacementRecorder(client_app.app.app, str(calls)))
    two = simulate({**cfg, "out-dir": str(tmp_path / "cluster")}, num_supernodes=4, engine="ray",
                   cpus_per_client=1, gpus_per_client=0.5, ray_address=cluster.address)

    rows = [json.loads(line) for f in calls.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert len(nodes) == 2 and {r["node"] for r in rows} == nodes
    per_node = Counter((r["node"], r["type"]) for r in rows)
    for node in nodes:  # both nodes trained clients (and answered the other message types)
        assert per_node[(node, "train")] >= 1
    assert sum(n for (_, t), n in per_node.items() if t == "train") == 2 * 4
    # one actor per node (1 CPU each), and each asked for the configured share of its node's GPU
    assert len({(r["node"], r["pid"]) for r in rows}) == 2
    assert all(r["resources"] == {"CPU": 1.0, "GPU": 0.5} for r in rows)

    assert _without_times(two["rounds"]) == _without_times(one["rounds"])
    assert all(r["num_updates"] == 4 and r["failures"] == [] for r in two["rounds"])
    a = torch.load(tmp_path / "one-node" / "final_model.pt")  # {parameter name: tensor}
    b = torch.load(tmp_path / "cluster" / "final_model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_flwr_run_local_attaches_to_the_cluster_in_ray_address(tmp_path: Path, gpu_cluster) -> None:
    """`flwr run . local` with RAY_ADDRESS in the environment of the simulation SuperLink: the run's client
    actors live on the cluster's two nodes (Ray's actor table), not in a Ray of its own. `.` is a snapshot of the
    app's code (deploy.localfed.snapshot_app, as scripts/run_local.sh does): from the checkout, `flwr run` walks
    every file under it, .venv included (~68,000 files), before filtering them (measured: 5.7-7.7 s at load 6)."""
    from deploy.localfed import snapshot_app

    app = snapshot_app(tmp_path / "app")
    port = _free_port()
    out = tmp_path / "out"
    cluster, nodes, ray_tmp = gpu_cluster
    before = set(_client_actors(cluster.address))  # the cluster is shared: actors of earlier jobs are listed too
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "RAY_TMPDIR": ray_tmp,
           "FLWR_HOME": str(tmp_path / "flwr"), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    (tmp_path / "flwr").mkdir()
    # the simulation SuperLink `flwr run . local` would start, started here (and stopped) by pid
    link = subprocess.Popen(["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess",
                             "--host", "127.0.0.1", "--port", str(port), "--database", str(tmp_path / "link.db")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not _listening(port):
            assert time.time() < deadline and link.poll() is None, "the simulation SuperLink did not start"
            time.sleep(0.5)
        proc = subprocess.run(
            ["flwr", "run", ".", "local", "--stream", "--federation-config",
             "num-supernodes=4 client-resources-num-cpus=1",
             "-c", f"dataset='digits' num-server-rounds=2 seed=5 federated-eval-every=0 out-dir='{out}'"],
            cwd=app, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        actors = [a for k, a in _client_actors(cluster.address).items() if k not in before]
    finally:
        os.killpg(link.pid, signal.SIGTERM)
        try:
            link.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(link.pid, signal.SIGKILL)
            link.wait(timeout=30)
    doc = json.loads((out / "results.json").read_text())
    assert [r["num_updates"] for r in doc["rounds"]] == [4, 4]
    assert len(actors) == 2 and {a["Address"]["NodeID"] for a in actors} == nodes
