"""``noniid-fl``: argument parsing and exit codes (see cli/__init__.py and cli/run.py)."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
import threading
import traceback

from flcore.config import ENGINES, ConfigError

DESCRIPTION = """Non-IID federated learning methods on Flower.

  noniid-fl run                                   # the default job: FedAvg on mnist-5k, 10 nodes, 10 rounds
  noniid-fl run --nodes 20 -c "method='fedprox' fedprox.mu=0.1 num-server-rounds=30"
  noniid-fl methods                               # every method, with its paper
  noniid-fl config fedprox                        # the keys a fedprox run reads: default, bounds, doc
  noniid-fl compare runs/a runs/b                 # runs side by side: figure (compare.png) and table
"""

RUN_EPILOG = """Keys and syntax are those of `flwr run -c` (sectioned method keys: fedprox.mu=0.1; strings in quotes).
The config is checked before any engine starts; a bad one exits with code 2 and one to three lines naming
the key. Outputs go to out-dir (default runs/<method>-<timestamp>; runs/latest links the newest).
Exit codes: 0 done, 1 the run failed (traceback in <out-dir>/run.log), 2 usage/config error, 130 interrupted.
"""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="noniid-fl", description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="{run,methods,config,compare}")
    run = sub.add_parser("run", help="run a federation on this machine", description="Run a federation of "
                         "--nodes simulated clients on this machine.", epilog=RUN_EPILOG,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--nodes", type=int, default=None, metavar="N",
                     help="number of clients (default: the preset's, its paper's K; else 10)")
    run.add_argument("-c", "--run-config", dest="config", action="append", metavar='"key=value ..."',
                     help="run-config overrides, as for `flwr run -c` (repeatable; or one .toml file)")
    run.add_argument("--engine", choices=ENGINES, help="run-config key engine (default: its declared value)")
    run.add_argument("--workers", type=int, metavar="W", help="run-config key engine-workers")
    run.add_argument("--overwrite", action="store_true", help="replace the run files of a non-empty out-dir")
    run.add_argument("--check", action="store_true", help="check the config and exit (no run)")
    run.add_argument("--verbose", action="store_true", help="tracebacks and engine logs on the terminal")
    sub.add_parser("methods", help="list every method with its paper",
                   description="List every method (the values of run-config key `method`) with its paper.")
    cfg = sub.add_parser("config", help="list every run-config key with default, bounds and doc",
                         description="List every run-config key with its default, bounds and doc; with METHOD, "
                                     "the common keys and that method's section.")
    cfg.add_argument("method", nargs="?", metavar="METHOD")
    from cli.compare import add_parser

    add_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        if args.command == "run":
            from cli.run import cmd_run

            return cmd_run(args)
        if args.command == "methods":
            from cli.listing import methods_text

            print(methods_text())
            return 0
        if args.command == "compare":
            from cli.compare import cmd_compare

            return cmd_compare(args)
        if args.command == "config":
            from cli.listing import config_text

            sys.stdout.write(config_text(args.method))
            return 0
        ap.print_help()
        return 2
    except ConfigError as exc:
        if getattr(args, "verbose", False):
            traceback.print_exc()
        print(f"noniid-fl: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `noniid-fl config | head`
        return 0


def console() -> None:
    """The ``noniid-fl`` entry point: :func:`main`, then exit.

    A usage or config error (2) exits normally (nothing heavy was loaded). After a completed run (0) the
    process waits for its non-daemon threads and runs what was registered to run at exit (Ray's and the
    worker pool's shutdown, the log handlers), then leaves without the interpreter's own teardown, which
    clears every module and collects every object of torch, Flower and the run: ~0.9 s of a 2-round digits
    run's 3.7 s. After a failed or interrupted run it exits at once, without waiting for threads the engine
    may have left behind (Flower's ServerApp thread can wait round-timeout for clients of a crashed engine).
    Every output file is closed by then; the log and the terminal streams are flushed first."""
    code = main()
    if code == 2:
        sys.exit(code)
    if code == 0:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()  # what a normal exit runs, logging.shutdown included (private, stable since Python 2)
    else:
        logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
