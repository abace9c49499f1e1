"""Run one federation on this machine: ``run_local(run_config, num_nodes, engine, workers)``.

``engine="inprocess"``: the real ServerApp (``server_app.app:app``) is called in this process with a
Flower Context holding the run config, and drives the real ClientApp through an in-process Grid:
:class:`engines.grid.InProcessGrid` (``workers=1``: every message handled in this process, one after
another) or :class:`engines.pool.PoolGrid` (``workers>1``: worker processes, each owning a share of the
nodes' Contexts). Node ids are random 63-bit numbers fixed for the run, as in Flower.

``engine="ray"``: Flower's Simulation Engine (:func:`engines.ray.run_ray`), what ``flwr run . local``
uses; ``workers`` does not apply (Ray runs one actor per ``cpus_per_client`` CPUs).

Both write the run's files to ``out-dir`` and return its results.json document. The same seed gives
the same numbers on either engine and for any number of workers (tests/test_engine_equivalence.py).
"""

from __future__ import annotations

import contextlib
import gc
import json
import time
from typing import Any, Callable, Iterator, Mapping, cast

from flwr.app import Context, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from engines.grid import DEFAULT_CLIENT_APP, SERVER_NODE_ID, InProcessGrid, load_reference
from flcore.config import ENGINES, ConfigError, RunConfig, resolve_run_config

DEFAULT_SERVER_APP = "server_app.app:app"
ServerAppFn = Callable[[Grid, Context], None]  # a ServerApp called as Flower calls it


def parse_run_config(run_config: RunConfig | Mapping[str, Any]) -> RunConfig:
    """The parsed run config of an entry point: ``run_config`` itself when parsed already, else the declared
    defaults updated with these keys (unknown keys are an error naming the closest one), parsed once."""
    if isinstance(run_config, RunConfig):
        return run_config
    return RunConfig.from_dict(resolve_run_config(run_config))


def resolve_engine(cfg: RunConfig, engine: str | None, workers: int | None) -> RunConfig:
    """``cfg`` with the engine and worker count to use (arguments override the run config), so results.json
    records what ran."""
    engine = cfg.engine if engine is None else engine
    workers = cfg.engine_workers if workers is None else workers
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"engine-workers must be an integer >= 1, got {workers!r}")
    if (engine, workers) == (cfg.engine, cfg.engine_workers):
        return cfg
    return cfg.replace(engine=engine, engine_workers=workers)


def make_grid(num_nodes: int, workers: int, run_config: Mapping[str, Any],
              client_app: str = DEFAULT_CLIENT_APP) -> InProcessGrid:
    """The in-process engine's Grid: sequential for one worker, a process pool for more."""
    if workers == 1:
        return InProcessGrid(num_nodes, None, run_config=run_config, client_app=client_app)
    from engines.pool import PoolGrid

    return PoolGrid(num_nodes, workers, None, run_config=run_config, client_app=client_app)


@contextlib.contextmanager
def server_identity(run_id: int) -> Iterator[None]:
    """Flower's ServerApp process identity (instruction messages take their run id from it), restored after."""
    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = run_id, 1, SERVER_NODE_ID
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved


def run_inprocess(values: RunConfig | Mapping[str, Any], num_nodes: int, workers: int = 1,
                  client_app: str = DEFAULT_CLIENT_APP, server_app: str = DEFAULT_SERVER_APP) -> None:
    """Call the ServerApp with a Context holding the run config (a parsed one, or its complete flat ``values``)
    and an in-process grid."""
    if isinstance(values, RunConfig):
        values = values.to_dict()  # Flower's run config (the Context's, the nodes'): flat, as `flwr run` sends it
    app = cast(ServerAppFn, load_reference(server_app))  # the reference names the ServerApp (unchecked)
    grid = make_grid(num_nodes, workers, values, client_app)
    try:
        context = Context(run_id=grid.run_id, node_id=SERVER_NODE_ID, node_config={}, state=RecordDict(),
                          run_config=dict(values))
        with server_identity(grid.run_id), frozen_heap():
            app(grid, context)
    finally:
        grid.close()


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Keep the objects that exist when the run starts (imported modules, data, models: ~10^6 of them) out
    of Python's cyclic garbage collector until it ends (``gc.freeze``): a full collection during the run then
    walks only the run's own objects (measured on the digits job: 150 ms -> 50 ms each). ``gc.unfreeze``
    hands them back to the collector afterwards.

    Before that, the run's own cyclic garbage is collected (walking only the run's objects: ~1 ms on the
    digits job). It is mostly the results plot's matplotlib figure, ~3,000 objects in reference cycles that
    hold its ~1 MB image buffer: left to the collector's rare full collections of the whole heap, a sweep's
    process grew by 1.8 MiB per run (100 runs: +186 MiB; benchmarks/bench_sweep.py)."""
    if gc.get_freeze_count():  # frozen already (a caller's choice, or a run inside a run): leave it so
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.collect()
        gc.unfreeze()


def run_local(run_config: RunConfig | Mapping[str, Any], num_nodes: int, engine: str | None = None,
              workers: int | None = None, **ray_options: Any) -> dict[str, Any]:
    """Run a federation of ``num_nodes`` clients on this machine; return the results.json document.

    ``run_config``: a parsed :class:`RunConfig`, or run-config keys (all of them, or overrides of the declared
    defaults; unknown keys are an error), parsed here once. ``engine`` / ``workers`` default to the run config's ``engine`` / ``engine-workers``.
    ``ray_options`` (engine 'ray' only): ``cpus_per_client``, ``gpus_per_client``, ``total_cpus``,
    ``quiet``, ``ray_address`` of :func:`engines.ray.run_ray`.
    """
    cfg = resolve_engine(parse_run_config(run_config), engine, workers)  # every key checked before anything starts
    cfg = cfg.with_out_dir()  # out-dir '' -> runs/<method>-<time>: the ServerApp and this function read the same
    engine, workers = cfg.engine, cfg.engine_workers
    started = time.time()
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ConfigError(f"the number of nodes must be an integer >= 1, got {num_nodes!r}")
    if engine == "ray":
        from engines.ray import run_ray

        with frozen_heap():  # (the ServerApp runs in a thread of this process)
            run_ray(cfg, num_nodes, **ray_options)
    else:
        if ray_options:
            raise ConfigError(f"options {sorted(ray_options)} apply to engine 'ray' only, not '{engine}'")
        run_inprocess(cfg, num_nodes, workers)
    path = cfg.out_path / "results.json"
    if not path.exists() or path.stat().st_mtime < started - 1.0:
        raise RuntimeError(f"the run ended without writing {path}; see the log above for the error")
    return json.loads(path.read_text())
