"""The ServerApp: pre-flight checks on the run config, then hand over to the round driver; at the end the accuracy
plot (accuracy.png) of the rounds it returns.

The checks are the ones ``noniid-fl run`` makes (server_app/preflight.py) but the device (in a deployment the
clients' GPUs are theirs: each client refuses ``device='cuda'`` without CUDA at registration): a bad config is
refused before round 1 with one log line naming the key, the bad value and what is allowed (then Flower marks
the run failed).
"""

from __future__ import annotations

import logging

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from flcore.config import ConfigError
from server_app.outputs import prepare_out_dir
from server_app.preflight import check
from server_app.results import plot_accuracy
from server_app.runner import run_federation
from server_app.worker_watch import WorkerWatchGrid

app = ServerApp()
log = logging.getLogger("flwr")


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        cfg = check(dict(context.run_config), clients_here=False)
    except ConfigError as exc:
        log.error("noniid-fl: refused before round 1: %s", exc)
        raise ConfigError(str(exc)) from None
    prepare_out_dir(cfg.out_dir, cfg.overwrite, cfg.resume_from)
    doc = run_federation(WorkerWatchGrid(grid, resume_hint=cfg.out_dir), cfg)  # crashed Ray workers: worker_watch.py
    plot_accuracy(doc["rounds"], f"{cfg.method} on {cfg.dataset}", cfg.out_path / "accuracy.png")  # check() resolved it
