"""The Ray engine: Flower's Simulation Engine (``flwr.simulation.run_simulation``), in this process.

This is what ``flwr run . local`` runs underneath, minus the SuperLink process and the FAB round trip:
Ray actors run the ClientApp, an in-memory SuperLink queues the messages. Each virtual client's actor
asks for ``cpus_per_client`` CPUs and ``gpus_per_client`` GPUs (a fraction shares a GPU).

Reliability (tests/test_reliability_ray.py):

- a ClientApp actor whose process dies (``os._exit``, segfault, OOM kill) is restarted by Ray and the message
  it was running is tried once more; the client fails that round only if that fails too, and every other
  client goes on as before (:mod:`engines.ray_faults`, which also says which exit code such a run ends with);
- the Ray processes a run starts are stopped when it ends, also on SIGINT/SIGTERM (the run stops at its next
  message exchange: :class:`StoppableGrid`), and the ones a SIGKILLed run left behind are reported at the
  next start (:mod:`engines.ray_session`). A run attached to a cluster (``ray_address``) starts no Ray
  processes of its own and leaves the cluster's alone.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, Iterable, Mapping, cast

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from engines.grid import DEFAULT_CLIENT_APP, load_client_app
from engines.ray_faults import ACTOR_FAULT_TOLERANCE
from engines.ray_session import RaySession, RunStopped, StopSignals
from flcore.config import RunConfig
from server_app.worker_watch import DelegatingGrid


class RunInterrupted(Exception):
    """Raised in the ServerApp's thread at its next grid call once a stop was asked for."""


class StoppableGrid(DelegatingGrid):
    """Flower's grid, refusing every call once ``stop`` is set: the ServerApp (in Flower's server thread) then
    ends with :class:`RunInterrupted` within one reply poll, which ends the simulation."""

    def __init__(self, inner: Grid, stop: threading.Event) -> None:
        super().__init__(inner)
        self.stop = stop

    def _check(self) -> None:
        if self.stop.is_set():
            raise RunInterrupted("the run was asked to stop (signal)")

    def get_node_ids(self) -> Iterable[int]:
        self._check()
        return self.inner.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        self._check()
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self._check()
        return self.inner.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        self._check()
        return self.inner.send_and_receive(messages, timeout=timeout)


def backend_config(cpus_per_client: float, gpus_per_client: float, init_args: Mapping[str, Any]) -> dict[str, Any]:
    """Flower's backend config: client resources plus the actor fault tolerance, and Ray's init arguments."""
    return {"client_resources": {"num_cpus": cpus_per_client, "num_gpus": gpus_per_client, **ACTOR_FAULT_TOLERANCE},
            "init_args": dict(init_args)}


def start_ray(init_args: Mapping[str, Any]) -> None:
    """Start Ray (or attach to a cluster) here, in the main thread, with what Flower's ``RayBackend.init_ray``
    would pass (the driver's ``sys.path`` as the workers' PYTHONPATH); Flower's backend then uses this Ray.

    Started here rather than by Flower so that the run's SIGINT/SIGTERM handlers can be put back after
    ``ray.init`` has replaced them with its own (a SIGTERM handler that calls ``sys.exit`` in whatever the main
    thread is doing, and Ray's C++ failure-signal handler, which aborts the process)."""
    import ray

    if ray.is_initialized():  # this process's Ray (started by its caller): Flower uses it as it is
        return
    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **init_args)


def run_ray(values: RunConfig | Mapping[str, Any], num_nodes: int, cpus_per_client: float = 1.0, gpus_per_client: float = 0.0,
            total_cpus: int | None = None, quiet: bool = True, ray_address: str | None = None,
            client_app: str | ClientApp | None = None) -> None:
    """Run the federation described by the run config (parsed, or its complete flat ``values``) on Ray; results go
    to out-dir.

    By default Ray starts on this machine with ``total_cpus`` CPUs (all of them), in a :class:`RaySession`
    (its processes stopped at the end, leftovers of killed runs reported first). With ``ray_address``
    (``host:port`` of a running cluster's head, as printed by ``ray start --head``) the run attaches to
    that cluster instead and uses its CPUs/GPUs: Ray refuses a CPU count for a cluster it did not start,
    so ``total_cpus`` must then be left out (docs/SCALING.md). ``client_app``: the ClientApp (object or
    ``'module:attribute'``; default ``client_app.app:app``; tests pass fault-injecting ones).

    SIGINT/SIGTERM (when called from the main thread): the run stops at its next message exchange, Ray is
    shut down, and :class:`engines.ray_session.RunStopped` (a KeyboardInterrupt) is raised.
    """
    from server_app.app import app as server_app

    if ray_address is not None and total_cpus is not None:
        raise ValueError("total_cpus cannot be combined with ray_address (an existing Ray cluster has its own "
                         "CPU count); leave total_cpus out")
    if isinstance(values, RunConfig):
        values = values.to_dict()  # Flower's run config (the ServerApp's Context): flat, as `flwr run` sends it
    else:
        RunConfig.from_dict(dict(values))  # fail on bad config before Ray starts
    app = load_client_app(client_app if client_app is not None else DEFAULT_CLIENT_APP)
    session = RaySession(str(values.get("out-dir", ""))) if ray_address is None else None
    signals = StopSignals(on_timeout=session.terminate if session else lambda: None)
    server = ServerApp()
    failed: list[Exception] = []

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        # run_simulation gives the ServerApp an empty run config: call the real ServerApp with the real one
        try:
            server_app(StoppableGrid(grid, signals.event),
                       Context(run_id=context.run_id, node_id=context.node_id, node_config=context.node_config,
                               state=context.state, run_config=dict(values)))
        except Exception as exc:  # raised below once Flower has stopped: when its ServerApp thread raises,
            failed.append(exc)  # Flower's run_simulation waits 3 s for a Context that never comes (measured)

    init_args: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR,
                                 "log_to_driver": not quiet}
    if ray_address is None:
        init_args["num_cpus"] = total_cpus or os.cpu_count() or 1
    else:
        init_args["address"] = ray_address
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    with signals:
        try:
            if session is not None:
                session.open()
                init_args.update(session.init_args)
            start_ray(init_args)
            signals.install()  # again: ray.init put its own handlers in place
            # Flower types the app as a ClientApp but only calls it: any callable of that signature serves
            run_simulation(server_app=server, client_app=cast(ClientApp, app), num_supernodes=num_nodes,
                           backend_config=backend_config(cpus_per_client, gpus_per_client, init_args),
                           verbose_logging=False)
            if failed:
                raise failed[0]
        except Exception as exc:
            if signals.signum is None:
                raise
            raise RunStopped(signals.signum) from exc  # RunInterrupted, or what stopping Ray caused
        finally:
            signals.done.set()
            if session is not None:
                session.close()
        if signals.signum is not None:  # the signal came after the last exchange
            raise RunStopped(signals.signum)
