"""Run one configuration on this machine, in this process: what the experiment runner and the tests call.

The engine is the run config's ``engine`` (default ``inprocess``) unless ``engine=`` says otherwise:

- ``inprocess``: the real ServerApp drives the real ClientApp through an in-process Flower Grid
  (``engines.run_local``): sequentially, or with ``engine-workers`` worker processes;
- ``ray``: Flower's Simulation Engine, what ``flwr run . local`` runs underneath minus the SuperLink
  process and the FAB round trip (Ray actors of ``cpus_per_client`` CPUs / ``gpus_per_client`` GPUs).

Both give the same numbers for the same seed (tests/test_engine_equivalence.py).

    from experiments.simulate import simulate
    doc = simulate({"method": "fedbc", "num-server-rounds": 3}, num_supernodes=10)
    doc = simulate({...}, num_supernodes=10, engine="ray")
"""

from __future__ import annotations

from typing import Any, Mapping

from engines.local import parse_run_config, resolve_engine, run_local
from flcore.config import ConfigError, RunConfig


def simulate(overrides: RunConfig | Mapping[str, Any], num_supernodes: int, cpus_per_client: float = 1.0,
             gpus_per_client: float = 0.0, total_cpus: int | None = None, quiet: bool = True,
             ray_address: str | None = None, engine: str | None = None, workers: int | None = None
             ) -> dict[str, Any]:
    """Run a federation of ``num_supernodes`` clients; return the results.json document.

    ``overrides``: a parsed :class:`RunConfig` (the command line's), or run-config keys over the declared
    defaults, parsed here once. ``engine`` / ``workers`` default to the run config's ``engine`` / ``engine-workers``. The other
    arguments are Ray's: each virtual client's actor asks for ``cpus_per_client`` CPUs and
    ``gpus_per_client`` GPUs (a fraction shares a GPU); Ray starts here with ``total_cpus`` CPUs (all of
    them) or, with ``ray_address`` (``host:port`` of a running cluster's head, as printed by
    ``ray start --head``), attaches to that cluster and uses its CPUs/GPUs (then leave ``total_cpus`` out;
    docs/SCALING.md). On the in-process engine they must keep their defaults.
    """
    cfg = resolve_engine(parse_run_config(overrides), engine, workers)
    engine, workers = cfg.engine, cfg.engine_workers
    if engine == "ray":
        return run_local(cfg, num_supernodes, engine, workers, cpus_per_client=cpus_per_client,
                         gpus_per_client=gpus_per_client, total_cpus=total_cpus, quiet=quiet,
                         ray_address=ray_address)
    ray_only = {"cpus_per_client": (cpus_per_client, 1.0), "gpus_per_client": (gpus_per_client, 0.0),
                "total_cpus": (total_cpus, None), "ray_address": (ray_address, None)}
    used = [name for name, (value, default) in ray_only.items() if value != default]
    if used:
        raise ConfigError(f"simulate(): {', '.join(used)} apply to engine 'ray' only; this run uses engine "
                          f"'{engine}' (pass engine='ray' or set run-config engine='ray')")
    return run_local(cfg, num_supernodes, engine, workers)
