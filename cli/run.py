"""``noniid-fl run``: pre-flight checks, then the federation through ``experiments.simulate.simulate``.

Exit codes: 0 the run finished every round; 1 it failed (an exception, every client failing a round, fewer
rounds than asked); 2 usage or config errors (refused before any engine starts); 130 interrupted (SIGINT);
143 stopped by SIGTERM (Ray engine: its Ray processes are stopped first, engines/ray_session.py).
"""

from __future__ import annotations

import argparse
import logging
import time
import traceback
from pathlib import Path
from typing import Any

from flcore.config import RunConfig, resolve_run_config

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT_NODES = 10


def run_values(args: argparse.Namespace) -> dict[str, Any]:
    """The run config of the command line: declared defaults, ``-c`` overrides, then the flags."""
    from cli.overrides import parse_overrides

    overrides = parse_overrides(args.config)
    if args.engine is not None:
        overrides["engine"] = args.engine
    if args.workers is not None:
        overrides["engine-workers"] = args.workers
    if args.overwrite:
        overrides["overwrite"] = True
    return resolve_run_config(overrides)


def preflight(args: argparse.Namespace) -> RunConfig:
    """The checked run config, or ConfigError (server_app/preflight.py: before any engine is imported)."""
    from server_app.preflight import check

    values = run_values(args)
    if args.nodes is None:  # a preset's federation size (its paper's K), else 10
        args.nodes = default_nodes(values)
    return check(values, num_nodes=args.nodes)


def default_nodes(values: dict[str, Any]) -> int:
    """The number of simulated clients when --nodes is not given: the preset's K (the paper's federation), else 10."""
    from flcore.presets import get_preset

    name = str(values.get("preset", "") or "")
    return get_preset(name).num_supernodes or DEFAULT_NODES if name else DEFAULT_NODES


def _log_to(path: Path, append: bool) -> logging.Handler:
    handler = logging.FileHandler(path, mode="a" if append else "w")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("noniid_fl", "flwr"):
        logging.getLogger(name).addHandler(handler)
    logging.getLogger("noniid_fl").setLevel(logging.INFO)
    return handler


def cmd_run(args: argparse.Namespace) -> int:
    cfg = preflight(args)
    if args.check:
        print(f"noniid-fl: config ok: {cfg.method} on {cfg.dataset}, {args.nodes} nodes, "
              f"{cfg.num_server_rounds} rounds -> {cfg.out_dir}")
        return EXIT_OK
    from server_app.outputs import RUN_LOG, prepare_out_dir

    out = prepare_out_dir(cfg.out_dir, cfg.overwrite, cfg.resume_from)
    log_path = out / RUN_LOG
    handler = _log_to(log_path, append=bool(cfg.resume_from))  # a resumed run keeps its log
    t0 = time.time()
    try:
        from experiments.simulate import simulate

        doc = simulate(cfg, num_supernodes=args.nodes, quiet=not args.verbose)
    except KeyboardInterrupt as exc:  # Ctrl-C; on the Ray engine also SIGTERM (engines.ray_session.RunStopped)
        signum = getattr(exc, "signum", None)
        print(f"noniid-fl: {exc if signum else 'interrupted'}; the rounds finished so far are in {out}", flush=True)
        return 128 + signum if signum else EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - one line here, the traceback in the log file
        logging.getLogger("noniid_fl").error("run failed:\n%s", traceback.format_exc())
        if args.verbose:
            traceback.print_exc()
        print(f"noniid-fl: run failed after {time.time() - t0:.0f}s: {_root_cause(exc)}\n"
              f"traceback in {log_path}", flush=True)
        return EXIT_FAILED
    finally:
        for name in ("noniid_fl", "flwr"):
            logging.getLogger(name).removeHandler(handler)
        handler.close()
    done = len(doc.get("rounds", []))
    if done < cfg.num_server_rounds:
        print(f"noniid-fl: run failed: {done} of {cfg.num_server_rounds} rounds finished (see {log_path})")
        return EXIT_FAILED
    return EXIT_OK


def _root_cause(exc: BaseException) -> str:
    """``Type: first line`` of the innermost exception (run_simulation may wrap the ServerApp's error)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    lines = str(exc).splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
