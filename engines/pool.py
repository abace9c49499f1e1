"""The in-process engine across cores: a Grid whose nodes live in a pool of worker processes.

Each worker process holds the Contexts of the nodes it owns and runs the real ClientApp on their
messages (:func:`engines.delivery.handle`, the same semantics as the sequential grid and as Flower's
engine). The driver process (the ServerApp) pushes pickled messages to the owners' task queues; one
collector thread receives the pickled replies, so workers never wait for the driver.

Balance: before each push the pool re-plans which worker owns which node of the exchange
(:func:`engines.balance.plan`, from each node's measured cost in its previous message of that type). A
node that changes owner has its Context shipped from the old worker to the new one before its message
runs (a migration), so state always lives in exactly one place and a node's messages run in push order.
An exchange with a node whose cost is not known yet (the first of its message type: registration, round
1, the first evaluation) is scheduled dynamically instead: the Contexts come back to the driver (the
workers are idle then) and each message goes, with its Context, to whichever worker is free. Contexts
start in the driver and go to a worker with their node's first message.

Failures:
- the ClientApp raises -> an error reply with code 2 (in the worker; the node keeps its old Context);
- a worker process dies (killed, segfault, out of memory) -> every message queued or running in it gets
  an error reply with code 8 (``CLIENT_APP_CRASHED``), and a new worker replaces it. The nodes it owned
  get fresh Contexts: their ``context.state`` is lost (as when a SuperNode restarts), unless the trainer
  persists it (run-config ``client-state-dir``), in which case the client reloads it from disk.
- a reply that does not come within the exchange's timeout is simply missing (the strategy records a
  timeout); the message keeps running in its worker and later messages to that worker queue behind it.

The driver's own compute (the ServerApp: aggregating, evaluating the global model) happens while every
worker waits for the next exchange, so between exchanges the driver runs torch with ``workers`` threads
(one while an exchange is in flight). For the models here its outputs are bit-identical to one thread
(tests/test_engine_equivalence.py compares 1, 2 and 3 workers); ``driver_threads=1`` turns it off.

Workers are started with ``fork`` when the driver has not initialised CUDA (a few milliseconds; they
inherit the imported ClientApp, cached data and :func:`warm_imports`), else with ``spawn``. Each worker runs torch with one
thread (what Ray gives a one-CPU client), so the numbers do not depend on the number of workers.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Iterable, Mapping, cast

from flwr.app import Context, Message, RecordDict
from flwr.app.metadata import Metadata
from flwr.common.constant import ErrorCode

from flcore import internals
from engines.balance import plan
from engines.copying import message_with_metadata
from engines.delivery import ClientAppFn, error_reply, new_message_id
from engines.grid import DEFAULT_CLIENT_APP, SERVER_NODE_ID, InProcessGrid, node_context
from engines.worker import pack_context, warm_imports, worker_main

if TYPE_CHECKING:
    from multiprocessing.context import ForkContext, ForkServerContext, SpawnContext

log = logging.getLogger("noniid_fl.engine")

PULL_WAIT = 0.5  # longest a pull blocks waiting for the rest of the requested replies (seconds)


# ============================================================================ the driver side
@dataclass
class _Worker:
    index: int
    process: Any
    tasks: Any
    results: Connection

    def put(self, *item: Any) -> None:
        self.tasks.put(item)


@dataclass
class _InFlight:
    node: int
    kind: str
    metadata: Metadata
    worker: int | None  # None while the node's Context is migrating (the message is held by the driver)


@dataclass
class _Migration:
    target: int | None  # None: back to the driver (an exchange scheduled dynamically)
    source: int
    held: list[tuple[str, bytes]] = field(default_factory=list)  # (msg_id, pickled message)


def _start_method() -> str:
    import torch

    methods = mp.get_all_start_methods()
    if "fork" in methods and not torch.cuda.is_initialized():
        return "fork"
    return "spawn"


class PoolGrid(InProcessGrid):
    """``workers`` processes, each owning a share of the nodes (see the module docstring)."""

    def __init__(self, num_nodes: int, workers: int, first_node_id: int | None = 1000, *,
                 run_config: Mapping[str, Any] | None = None, client_app: str | ClientAppFn = DEFAULT_CLIENT_APP,
                 run_id: int = 1, record_sent: bool = False, start_method: str | None = None,
                 torch_threads: int = 1, pull_wait: float = PULL_WAIT, driver_threads: int | None = None) -> None:
        if workers < 1:
            raise ValueError(f"engine-workers must be >= 1, got {workers}")
        self.start_method = start_method or _start_method()
        if self.start_method != "fork" and not isinstance(client_app, str):
            raise ValueError("with start method '%s' the client app must be given as 'module:attribute'"
                             % self.start_method)
        super().__init__(num_nodes, first_node_id, run_config=run_config, client_app=client_app, run_id=run_id,
                         record_sent=record_sent)
        self._app_ref = client_app
        self._torch_threads = torch_threads
        self.pull_wait = pull_wait
        self.num_workers = workers
        self.driver_threads = workers if driver_threads is None else driver_threads
        self._threads_now = 0
        import torch

        self._threads_before = torch.get_num_threads()
        # typeshed gives get_context(<a str>) the BaseContext type, which lacks the Process every start method's has
        self._mp = cast("ForkContext | SpawnContext | ForkServerContext", mp.get_context(self.start_method))
        self._lock = threading.Condition()
        self._replies_ready: dict[str, Message] = {}
        self._in_flight: dict[str, _InFlight] = {}
        self._migrations: dict[int, _Migration] = {}
        self.owner: dict[int, int] = {}
        self.costs: dict[tuple[int, str], float] = {}
        self.migrations = 0
        self.replaced = 0
        self._closed = False
        if self.start_method == "fork":
            warm_imports()  # once here instead of once per worker
        self._workers: list[_Worker] = [self._spawn(i) for i in range(workers)]
        # Contexts not owned by a worker (all of them until their node's first message) wait here, packed
        self._held: dict[int, bytes] = {nid: pack_context(c, self.run_config) for nid, c in self.contexts.items()}
        self.contexts = {}
        self._ready: list[tuple[float, str, bytes, int]] = []  # dynamic exchange: (cost, msg_id, message, node)
        self._outstanding = [0] * workers  # "run" tasks put to each worker and not answered yet
        self.dynamic_exchanges = 0
        self._collector = threading.Thread(target=self._collect, name="engine-collector", daemon=True)
        self._collector.start()

    # --- workers -------------------------------------------------------------------------------------
    def _spawn(self, index: int) -> _Worker:
        tasks = self._mp.Queue()
        recv, send = self._mp.Pipe(duplex=False)
        proc = self._mp.Process(target=worker_main, args=(index, tasks, send, self._app_ref, self._torch_threads,
                                                                  self.run_config),
                                name=f"engine-worker-{index}", daemon=True)
        proc.start()
        send.close()
        return _Worker(index, proc, tasks, recv)

    def _adopt(self, worker: int, node: int, context: Context | bytes) -> None:
        payload = context if isinstance(context, bytes) else pack_context(context, self.run_config)
        self._workers[worker].put("adopt", node, payload)
        self.owner[node] = worker

    def _fresh_context(self, node: int) -> Context:
        return node_context(self.node_ids, node, self.run_config, self.run_id)

    # --- Grid API -----------------------------------------------------------------------------------------
    def _dispatch_batch(self, batch: list[tuple[str, Message]]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the engine's worker pool is closed")
            costs = self._estimate([m for _, m in batch])
            idle = not self._in_flight and not self._migrations
            unknown = any((m.metadata.dst_node_id, m.metadata.message_type) not in self.costs for _, m in batch)
            if idle and unknown:
                self._dispatch_dynamic(batch, costs)
                return
            busy = {f.node for f in self._in_flight.values()} | set(self._migrations)
            assignment = plan(costs, self.owner, self.num_workers, fixed=frozenset(busy))
            for node, target in assignment.items():
                if node in self._held:  # first message of a node: its Context goes straight to the target
                    self._adopt(target, node, self._held.pop(node))
                    continue
                mig = self._migrations.get(node)
                if mig is not None:  # on its way (to the driver, after a timed-out dynamic exchange): redirect
                    if mig.target is None:
                        mig.target = self.owner[node] = target
                    continue
                source = self.owner[node]
                if target != source:
                    self._migrations[node] = _Migration(target, source)
                    self.owner[node] = target
                    self._workers[source].put("release", node)
                    self.migrations += 1
            for msg_id, msg in batch:
                node = msg.metadata.dst_node_id
                payload = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
                mig = self._migrations.get(node)
                self._in_flight[msg_id] = _InFlight(node, msg.metadata.message_type, msg.metadata, None)
                if mig is not None:
                    mig.held.append((msg_id, payload))
                else:
                    self._run(self.owner[node], msg_id, payload)

    def _dispatch_dynamic(self, batch: list[tuple[str, Message]], costs: dict[int, float]) -> None:
        """An exchange with nodes of unknown cost (the first of its message type): every Context comes back
        to the driver (the workers are idle, so at once) and each message goes to whichever worker is free,
        most expensive first (unknown costs: the mean of the known ones). Lock held."""
        self.dynamic_exchanges += 1
        for msg_id, msg in batch:
            node = msg.metadata.dst_node_id
            payload = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
            self._in_flight[msg_id] = _InFlight(node, msg.metadata.message_type, msg.metadata, None)
            item = (costs[node], msg_id, payload, node)
            if node in self._held:
                self._ready.append(item)
            elif node in self._migrations:
                self._migrations[node].held.append((msg_id, payload))
            else:
                self._migrations[node] = _Migration(None, self.owner.pop(node), [(msg_id, payload)])
                self._workers[self._migrations[node].source].put("release", node)
        self._ready.sort(key=lambda it: -it[0])
        self._feed()

    def _feed(self) -> None:
        """Give ready messages to free workers (one task each at a time). Lock held."""
        while self._ready:
            w = min(range(self.num_workers), key=lambda i: (self._outstanding[i], i))
            if self._outstanding[w] > 0:
                return
            _, msg_id, payload, node = self._ready.pop(0)
            if node in self._held:
                self._adopt(w, node, self._held.pop(node))
                self._run(w, msg_id, payload)
            else:  # another message for a node this exchange has placed already: after it, on its worker
                self._run(self.owner[node], msg_id, payload)

    def _run(self, worker: int, msg_id: str, payload: bytes) -> None:
        """Put one message to a worker (lock held)."""
        self._workers[worker].put("run", msg_id, payload)
        self._outstanding[worker] += 1
        if msg_id in self._in_flight:
            self._in_flight[msg_id].worker = worker

    def _estimate(self, msgs: list[Message]) -> dict[int, float]:
        """Each node's expected cost in this exchange: its last measured cost for the message type, else
        the mean of the known ones, else 1 (unknown costs are taken as equal)."""
        out: dict[int, float] = {}
        for m in msgs:
            node, kind = m.metadata.dst_node_id, m.metadata.message_type
            out[node] = out.get(node, 0.0) + self.costs.get((node, kind), float("nan"))
        known = [c for c in out.values() if c == c]
        default = sum(known) / len(known) if known else 1.0
        return {n: (c if c == c else default) for n, c in out.items()}

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        batch = []
        for msg in messages:
            self._check(msg)
            msg_id, msg = self._new_id(msg)
            batch.append((msg_id, msg))
        self._driver_threads(busy=True)
        self._dispatch_batch(batch)
        return [i for i, _ in batch]

    def _new_id(self, msg: Message) -> tuple[str, Message]:
        msg_id = new_message_id()
        msg = internals.stamp(msg, msg_id, SERVER_NODE_ID)
        self.messages += 1
        if self.record_sent:
            self.sent.append(msg)
        return msg_id, msg

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies among ``message_ids`` that have arrived; waits up to ``pull_wait`` s for all of them
        (so an exchange collects a complete set without a polling delay)."""
        ids = list(message_ids)
        deadline = time.monotonic() + self.pull_wait
        with self._lock:
            while True:
                waiting = [i for i in ids if i in self._in_flight]
                left = deadline - time.monotonic()
                if not waiting or left <= 0:
                    break
                self._lock.wait(left)
            replies = [self._replies_ready.pop(i) for i in ids if i in self._replies_ready]
            if not self._in_flight and not self._migrations:
                self._driver_threads(busy=False)
            return replies

    def _driver_threads(self, busy: bool) -> None:
        """The driver's torch threads: 1 while workers compute, ``driver_threads`` while they all wait (the
        ServerApp's own compute, e.g. evaluating the global model, then uses the idle cores)."""
        want = 1 if busy else self.driver_threads
        if self._threads_now != want:
            import torch

            torch.set_num_threads(want)
            self._threads_now = want

    # --- collector thread ---------------------------------------------------------------------------------
    def _collect(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                by_conn = {w.results: w for w in self._workers}
                by_sentinel = {w.process.sentinel: w for w in self._workers}
            ready = wait(list(by_conn) + list(by_sentinel), timeout=0.5)
            for obj in ready:
                if obj in by_conn:
                    worker = by_conn[obj]
                    try:
                        item = obj.recv()
                    except (EOFError, OSError):
                        continue  # the worker is gone; its sentinel reports it
                    self._on_item(worker, item)
            for obj in ready:
                if obj in by_sentinel:
                    self._on_death(by_sentinel[obj])

    def _on_item(self, worker: _Worker, item: tuple) -> None:
        kind = item[0]
        if kind == "reply":
            _, msg_id, payload, seconds = item
            reply = pickle.loads(payload)
            with self._lock:
                flight = self._in_flight.pop(msg_id, None)
                if flight is None:
                    return  # already answered with an error (its worker was declared dead)
                if flight.worker is not None:
                    self._outstanding[flight.worker] -= 1
                self.costs[(flight.node, flight.kind)] = seconds
                self._replies_ready[msg_id] = reply
                self._feed()
                self._lock.notify_all()
        elif kind == "released":
            _, node, payload = item
            with self._lock:
                mig = self._migrations.pop(node, None)
                if mig is not None:
                    self._forward(node, mig, payload)

    def _forward(self, node: int, mig: _Migration, context: Context | bytes) -> None:
        """Hand a migrating node's Context and its held messages to the new owner, or keep them in the driver
        for a dynamically scheduled exchange (lock held)."""
        if mig.target is None:
            self._held[node] = context if isinstance(context, bytes) else pack_context(context, self.run_config)
            flights = [(self._in_flight[i], i, p) for i, p in mig.held if i in self._in_flight]
            est = self._estimate_ids([f for f, _, _ in flights])
            self._ready += [(est.get(node, 1.0), i, p, node) for _, i, p in flights]
            self._ready.sort(key=lambda it: -it[0])
            self._feed()
            return
        self._adopt(mig.target, node, context)
        for msg_id, payload in mig.held:
            self._run(mig.target, msg_id, payload)

    def _estimate_ids(self, flights: list[_InFlight]) -> dict[int, float]:
        known = [c for c in self.costs.values()]
        default = sum(known) / len(known) if known else 1.0
        return {f.node: self.costs.get((f.node, f.kind), default) for f in flights}

    def _on_death(self, worker: _Worker) -> None:
        while True:  # replies it sent before dying still count
            try:
                if not worker.results.poll(0):
                    break
                self._on_item(worker, worker.results.recv())
            except (EOFError, OSError):
                break
        with self._lock:
            if self._closed or self._workers[worker.index] is not worker:
                return
            worker.process.join(timeout=1.0)
            code = worker.process.exitcode
            i = worker.index
            reason = (f"engine worker {i} (pid {worker.process.pid}) died with exit code {code} while this "
                      f"message was queued or running in it; the nodes it held lost their context.state")
            log.error(reason.replace("this message was", "messages were"))
            for msg_id, flight in list(self._in_flight.items()):
                if flight.worker == i:
                    del self._in_flight[msg_id]
                    stub = message_with_metadata(RecordDict(), metadata=flight.metadata)
                    self._replies_ready[msg_id] = error_reply(stub, ErrorCode.CLIENT_APP_CRASHED, reason)
            worker.tasks.cancel_join_thread()
            worker.tasks.close()
            worker.results.close()
            self._workers[i] = self._spawn(i)
            self._outstanding[i] = 0
            self.replaced += 1
            for node, owner in list(self.owner.items()):
                if owner == i and node not in self._migrations:
                    self._adopt(i, node, self._fresh_context(node))
            for node, mig in list(self._migrations.items()):
                if mig.source == i:  # its Context died with the worker before it could be shipped
                    del self._migrations[node]
                    self._forward(node, mig, self._fresh_context(node))
            self._feed()
            self._lock.notify_all()

    # --- shutdown -----------------------------------------------------------------------------------------
    def worker_pids(self) -> list[int]:
        with self._lock:
            return [w.process.pid for w in self._workers]

    def close(self, timeout: float = 10.0) -> None:
        """Stop the workers (politely, then by force) and the collector thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._workers)
            self._lock.notify_all()
        if self._threads_now:
            import torch

            torch.set_num_threads(self._threads_before)
        for w in workers:
            try:
                w.put("stop")
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + timeout
        for w in workers:
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(timeout=2.0)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.tasks.cancel_join_thread()
            w.tasks.close()
            w.results.close()
        self._collector.join(timeout=2.0)

    def __del__(self) -> None:
        try:
            self.close(timeout=1.0)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
