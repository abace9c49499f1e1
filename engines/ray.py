"""The Ray engine: Flower's Simulation Engine (``flwr.simulation.run_simulation``), in this process.

This is what ``flwr run . local`` runs underneath, minus the SuperLink process and the FAB round trip:
Ray actors run the ClientApp, an in-memory SuperLink queues the messages. Each virtual client's actor
asks for ``cpus_per_client`` CPUs and ``gpus_per_client`` GPUs (a fraction shares a GPU).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from flcore.config import RunConfig


def run_ray(values: Mapping[str, Any], num_nodes: int, cpus_per_client: float = 1.0, gpus_per_client: float = 0.0,
            total_cpus: int | None = None, quiet: bool = True, ray_address: str | None = None) -> None:
    """Run the federation described by the complete run config ``values`` on Ray; results go to out-dir.

    By default Ray starts on this machine with ``total_cpus`` CPUs (all of them). With ``ray_address``
    (``host:port`` of a running cluster's head, as printed by ``ray start --head``) the run attaches to
    that cluster instead and uses its CPUs/GPUs: Ray refuses a CPU count for a cluster it did not start,
    so ``total_cpus`` must then be left out (docs/SCALING.md).
    """
    from client_app.app import app as client_app
    from server_app.app import app as server_app

    if ray_address is not None and total_cpus is not None:
        raise ValueError("total_cpus cannot be combined with ray_address (an existing Ray cluster has its own "
                         "CPU count); leave total_cpus out")
    RunConfig.from_dict(dict(values))  # fail on bad config before Ray starts
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        # run_simulation gives the ServerApp an empty run config: call the real ServerApp with the real one
        server_app(grid, Context(run_id=context.run_id, node_id=context.node_id, node_config=context.node_config,
                                 state=context.state, run_config=dict(values)))

    init_args: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR,
                                 "log_to_driver": not quiet}
    if ray_address is None:
        init_args["num_cpus"] = total_cpus or os.cpu_count() or 1
    else:
        init_args["address"] = ray_address
    backend = {"client_resources": {"num_cpus": cpus_per_client, "num_gpus": gpus_per_client},
               "init_args": init_args}
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    run_simulation(server_app=server, client_app=client_app, num_supernodes=num_nodes,
                   backend_config=backend, verbose_logging=False)
