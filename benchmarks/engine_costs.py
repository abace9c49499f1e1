"""Deterministic, in-process measurements behind the scale benchmark (no Ray, CPU time only).

``server_exchange_cost``: what the ServerApp allocates and spends to build the messages of one exchange
with all N registered clients (the federated evaluation) and with the K sampled ones (a training round).
A capturing grid takes the messages and answers nothing, so the peak traced memory is exactly the
messages the strategy built (parameters + run config + per-client config).

``engine_poll_cost``: one polling cycle of Flower's simulation engine. Its message extractor
(flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue) asks the in-memory SuperLink state for
each of the N nodes, every 0.1 s, whether a message waits; each such query scans every stored message
(InMemoryLinkState.get_message_ins), so one cycle costs O(N x pending messages). This runs Flower's own
state and grid classes with N registered nodes and ``pending`` small messages.
"""

from __future__ import annotations

import contextlib
import time
import tracemalloc
from collections import OrderedDict
from typing import Any, Iterable, Iterator

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from engines.grid import InProcessGrid


class CaptureGrid(InProcessGrid):
    """Keeps the messages of the last push and answers none of them."""

    def __init__(self, num_nodes: int) -> None:
        super().__init__(num_nodes)
        self.last: list[Message] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        self.last = list(messages)
        return [f"captured-{i}" for i in range(len(self.last))]

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return []


def server_exchange_cost(num_clients: int, sampled: int, overrides: dict, shared_records: bool = True) -> dict[str, float]:
    """Peak traced MiB and CPU ms of building one all-client evaluation exchange and one training exchange.

    ``shared_records=False`` restores the behaviour before the fix in strategies/base.py (one serialized
    copy of the parameters and of the run config per message), so both are measured in the same run.
    """
    from data_partitioning.datasets import dataset_shape
    from flcore.config import RunConfig, resolve_run_config
    from flcore.records import config_to_record, model_params, params_to_record
    from models import build_model
    from server_app.runner import build_strategy
    from strategies.base import ClientInfo

    cfg = RunConfig.from_dict(resolve_run_config({**overrides, "round-timeout": 1.0, "round-retries": 0}))
    strategy = build_strategy(cfg)
    if not shared_records:
        strategy.messages.params_record = params_to_record
        strategy.messages.base_records = lambda: {"run_config": config_to_record(cfg.to_dict())}
    for cid in range(num_clients):
        strategy.clients[cid] = ClientInfo(cid, 1000 + cid, 10, [1] * 10)
    params = model_params(build_model(cfg, *dataset_shape(cfg.dataset)))
    grid = CaptureGrid(num_clients)
    out: dict[str, float] = {"model_mib": sum(v.nbytes for v in params.values()) / 2**20}
    for name, fn in (("evaluate_all", lambda p: strategy.federated_evaluate(grid, 1, p)),
                     ("train_sampled", lambda p: _train_sends(strategy, grid, p, sampled))):
        fresh = OrderedDict((k, v.copy()) for k, v in params.items())  # new round, new global model
        tracemalloc.start()
        c = time.process_time()
        fn(fresh)
        cpu = time.process_time() - c
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        grid.last = []
        out[f"{name}_peak_mib"] = peak / 2**20
        out[f"{name}_cpu_ms"] = cpu * 1e3
    return out


def registry_cost(num_clients: int, num_classes: int = 10) -> dict[str, float]:
    """Traced MiB of the strategy's client registry (ClientInfo per registered client) and CPU ms of one
    refresh_clients() when every node is already known (what every round pays)."""
    from flcore.config import RunConfig
    from strategies.base import ClientInfo, FLStrategy

    strategy = FLStrategy(RunConfig())
    grid = CaptureGrid(num_clients)
    tracemalloc.start()
    for cid in range(num_clients):
        strategy.clients[cid] = ClientInfo(cid, 1000 + cid, 40, [4] * num_classes)
        strategy.client_accuracy[cid] = 0.5
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    c = time.process_time()
    for _ in range(10):
        strategy.refresh_clients(grid, wait=False)
    return {"clients": num_clients, "registry_mib": size / 2**20,
            "refresh_known_cpu_ms": (time.process_time() - c) / 10 * 1e3}


def _train_sends(strategy, grid: CaptureGrid, params, sampled: int) -> None:
    from strategies.exchange import exchange

    sends = {cid: (strategy.clients[cid].node_id, strategy.train_content(1, cid, params)) for cid in range(sampled)}
    exchange(grid, sends, "train", 0.0, 1)


@contextlib.contextmanager
def flower_run_state() -> Iterator[tuple[Any, Any, Any]]:
    """(state factory, in-memory SuperLink state, run) for one empty run, as Flower's simulation sets them
    up, with the task identity of the SuperLink (node 1) set while inside."""
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord, Task
    from flwr.simulation.run_simulation import NOOP_FEDERATION_ID
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run

    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 7, 1  # 1 = the SuperLink's node id
    try:
        factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
        run = Run.create_empty(run_id=1)
        run.primary_task_id, run.federation_id = 7, NOOP_FEDERATION_ID
        state = factory.state()
        state.run_ids[1] = RunRecord(run=run)
        state.task_store[7] = Task(task_id=7, run_id=1)
        yield factory, state, run
    finally:
        TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved


def engine_poll_cost(num_nodes: int, pending: int) -> dict[str, float]:
    """CPU ms of one extractor cycle of Flower's simulation engine (first: delivers; later: nothing new)."""
    from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    with flower_run_state() as (factory, state, run):
        nodes = list(_register_nodes(num_nodes, factory))
        grid = InMemoryGrid(state_factory=factory)
        grid.set_run(run)
        grid.push_messages([Message(RecordDict({"c": ConfigRecord({"x": 1})}), dst_node_id=nodes[i % num_nodes],
                                    message_type="evaluate", group_id="1") for i in range(pending)])
        cycles = []
        for _ in range(2):
            c = time.process_time()
            for node in nodes:  # what add_messages_to_queue does every 0.1 s
                state.get_message_ins(node_id=node, limit=1)
            cycles.append((time.process_time() - c) * 1e3)
    return {"nodes": num_nodes, "pending": pending, "first_cycle_cpu_ms": cycles[0], "later_cycle_cpu_ms": cycles[1]}


def flower_node_state_cost(num_nodes: int, run_config: dict | None = None) -> dict[str, float]:
    """Traced KiB per node of what Flower's simulation keeps for every registered node for the whole run:
    the node record in the in-memory SuperLink state (``_register_nodes``, as the engine calls it) and the
    node's ``Context`` (node config, state, run config) that the engine holds for it."""
    from flwr.app import Context
    from flwr.server.superlink.fleet.vce.vce_api import _register_nodes

    with flower_run_state() as (factory, _, _):
        tracemalloc.start()
        nodes = list(_register_nodes(num_nodes, factory))
        linkstate = tracemalloc.get_traced_memory()[0]
        contexts = [Context(run_id=1, node_id=n, node_config={"partition-id": i, "num-partitions": num_nodes},
                            state=RecordDict(), run_config=dict(run_config or {})) for i, n in enumerate(nodes)]
        total = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del contexts
    return {"nodes": num_nodes, "linkstate_kib_per_node": linkstate / num_nodes / 1024,
            "context_kib_per_node": (total - linkstate) / num_nodes / 1024}


def ray_idle_cpu(seconds: float = 20.0, num_cpus: int = 2) -> dict[str, float]:
    """CPU seconds per wall second that a started, idle Ray (as the simulation starts it: no dashboard,
    no log forwarding) burns in its daemons (GCS, raylet, monitors): a cost paid for every second a
    simulation runs, whatever the clients do."""
    import logging

    import ray

    from benchmarks.harness import tree_cpu_seconds

    ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        time.sleep(5.0)  # let start-up finish
        c0, t0 = tree_cpu_seconds(), time.time()
        time.sleep(seconds)
        used, wall = tree_cpu_seconds() - c0, time.time() - t0
    finally:
        ray.shutdown()
    return {"seconds": wall, "cpu_s": used, "cpu_per_wall_s": used / wall}
