"""Engines that run a federation on one machine, speaking Flower's Grid / Message / Context.

    from engines import run_local
    doc = run_local({"method": "fedbc", "num-server-rounds": 3}, num_nodes=10)               # in-process
    doc = run_local({...}, num_nodes=10, engine="inprocess", workers=2)                      # 2 processes
    doc = run_local({...}, num_nodes=10, engine="ray")                                       # Flower's Ray

- :mod:`engines.grid`     ``InProcessGrid``: the nodes' Contexts in this process, messages handled one
                          after another (engine-workers = 1);
- :mod:`engines.pool`     ``PoolGrid``: worker processes, each owning a share of the nodes' Contexts
                          (engine-workers > 1), balanced per exchange, dead workers replaced;
- :mod:`engines.worker`   the worker process's side of the pool;
- :mod:`engines.balance`  which worker owns which node in an exchange (sticky LPT plan);
- :mod:`engines.delivery` what happens to one message at a node (Flower's engine semantics);
- :mod:`engines.copying`  copies of messages, records and Contexts at the boundary;
- :mod:`engines.ray`      Flower's Simulation Engine (what ``flwr run . local`` uses);
- :mod:`engines.ray_faults`  crashed Ray workers: restarted (engine 'ray'); the ServerApp stops a run whose
                          worker stays dead (``flwr run``: :mod:`server_app.worker_watch`);
- :mod:`engines.ray_session` the Ray processes of a run: stopped at its end and on SIGINT/SIGTERM, leftovers
                          of a killed run reported at the next start;
- :mod:`engines.local`    ``run_local``: the real ServerApp on either engine -> the results document.

Same seed, same numbers: sequential, any number of workers and Ray give bit-identical models and metrics
when each client trains with one torch thread (what Ray gives a one-CPU client; the workers always do;
set ``OMP_NUM_THREADS=1`` for the sequential engine), tests/test_engine_equivalence.py.

``flwr run .`` and real deployments do not use this package: they run on Flower's own engines.
"""

from engines.grid import InProcessGrid
from engines.local import make_grid, run_local

__all__ = ["InProcessGrid", "make_grid", "run_local"]
