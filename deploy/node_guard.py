#!/usr/bin/env python
"""A SuperNode that comes back: ``flower-supernode`` with two guards (deploy/supernode.sh runs every node so).

    python deploy/node_guard.py <flower-supernode args>

1. **Transient TLS/connection errors are retried, never given up.** flwr 1.42's Fleet HTTP client retries
   connection errors with exponential back-off (capped at ``MAX_RETRY_DELAY``, 20 s), but gives up on any
   error whose text contains "ssl", "tls" or "certificate" (``flwr.supercore.retry.http_retry``): a
   handshake cut short by an overloaded or restarting proxy ends the node's polling for good while the
   process stays up. Here every ``httpx.TransportError`` is retried with that same back-off (logged once
   per outage); other errors keep flwr's decision (401 still stops the node, 502/503/504 are retried).
2. **A restarted node comes back within seconds, not after crash loops.** A SuperNode that died without
   deactivating (killed, out of memory, or its connection gave up) stays "online" on the SuperLink until its
   heartbeat window closes (flwr's ``HEARTBEAT_PATIENCE`` 2 x the interval it declared, 30 s in stock flwr:
   60 s), and until then the SuperLink refuses to activate its key again (412, Flower's
   ``FLEET_NODE_ACTIVATION_FAILED``). Stock flwr exits on that refusal, so a restart policy restarts it over and
   over (Kubernetes with a growing CrashLoopBackOff) and the node misses the next rounds. Here the node declares
   a ``HEARTBEAT_INTERVAL`` of 10 s (flwr's minimum; a heartbeat every ~4 s, so its window is 20 s), and a
   refused activation is retried every <= 2 s for ``ACTIVATION_PATIENCE`` s (75: a stock node's 60 s window
   plus 15; 0: exit at once, as stock flwr does), after which flwr's decision stands.
3. **A poll stamp for the health check.** Each completed poll of the SuperLink writes ``idle <time>`` to the
   stamp file, a received message ``busy <time>`` (the ClientApp runs), and the polling loop ending for any
   reason (an error, or flwr's connection context swallowing one and returning) ``stopped <time> <why>``;
   in the second case the process then exits (code 75), so that restart policies restart it. ``deploy/healthcheck.py supernode`` reports a node unhealthy when its
   stamp says stopped or is older than ``POLL_STALE`` s while idle, so Kubernetes' liveness probe restarts
   it and compose shows it unhealthy. Stamp file: ``POLL_STAMP`` or ``$TMPDIR/flower-supernode-<uid>/supernode-<RUNTIME_PORT>.poll`` (a 0700 directory).

All three patch named functions of the installed flwr after checking they exist; on a flwr without them the
node refuses to start (exit 2) rather than run unguarded. The per-poll stamp wraps flwr's private pull
function through ``flcore.internals.wrap_pull`` (the one module touching Flower's private members); without
it (``NONIID_FL_PUBLIC_ONLY=1`` or a flwr that lacks it) a thread stamps ``idle`` every 5 s while the polling
loop runs, so a stopped loop still shows but a message that hangs does not.

``python deploy/node_guard.py --make-runtime-secret`` writes a fresh Runtime-API secret in the node's private
directory and prints its path (:func:`runtime_secret`; deploy/supernode.sh's stock mode with TLS).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("node_guard")
EXIT_LOOP_ENDED = 75     # EX_TEMPFAIL: the polling loop ended while the process would have lived on
_exit = os._exit         # (tests replace it)
CONNECTION_MODULE = "flwr.supernode.fleet_http_connection"
LOOP_MODULE = "flwr.supernode.start_client_internal"


def stamp_path(environ: dict[str, str] | os._Environ = os.environ) -> Path:
    """Where the poll stamp of the SuperNode configured by ``environ`` lives (writer and health check agree):
    ``POLL_STAMP``, or ``supernode-<RUNTIME_PORT>.poll`` in this user's private directory
    ``$TMPDIR/flower-supernode-<uid>`` (0700, see :func:`private_dir`), never a predictable name in a shared
    directory, where another local user could plant a symlink or a file of their own."""
    if environ.get("POLL_STAMP"):
        return Path(environ["POLL_STAMP"])
    port = environ.get("RUNTIME_PORT", "9094")
    return Path(environ.get("TMPDIR", "/tmp")) / f"flower-supernode-{os.getuid()}" / f"supernode-{port}.poll"


def private_dir(path: Path) -> Path:
    """``path`` as a directory only this user can use: created 0700 if absent; refused (ValueError naming the
    problem) if it is a symlink or not a directory, belongs to another user, or others may write to it."""
    try:
        path.mkdir(mode=0o700, parents=False)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path}: the node's private directory is a symlink or not a directory (planted by "
                         "another local user?); remove it or set POLL_STAMP to a file in a directory of your own")
    if st.st_uid != os.getuid():
        raise ValueError(f"{path}: owned by uid {st.st_uid}, not this node's uid {os.getuid()} (created by another "
                         "local user?); remove it or set TMPDIR / POLL_STAMP")
    if st.st_mode & 0o022:
        raise ValueError(f"{path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): another local user "
                         "could replace the node's files; chmod 700 it or set POLL_STAMP elsewhere")
    return path


def stamp_dir(path: Path) -> Path:
    """The stamp's directory, checked: the private default is created 0700 and must be ours; a POLL_STAMP
    directory must not be writable by group or others (a sticky /tmp is refused)."""
    parent = path.parent
    if parent.name.startswith("flower-supernode-"):
        return private_dir(parent)
    st = os.stat(parent)
    if st.st_mode & 0o022:
        raise ValueError(f"POLL_STAMP={path}: its directory is writable by group or others (mode "
                         f"{stat.S_IMODE(st.st_mode):o}); put the stamp in a directory only the node's user can write")
    return parent


def write_stamp(path: Path, state: str, detail: str = "") -> None:
    """Replace the stamp atomically: a new file of a random name (mkstemp: O_EXCL, mode 0600) renamed over it,
    so a symlink at the stamp's path is replaced, never followed."""
    fd, tmp = tempfile.mkstemp(prefix=".stamp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{state} {time.time():.3f} {detail}".strip() + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_stamp(path: Path) -> tuple[str, float, str]:
    """(state, unix time, detail) of a stamp file."""
    state, when, *rest = path.read_text().split(" ", 2)
    return state, float(when), rest[0].strip() if rest else ""


DEFAULT_ACTIVATION_PATIENCE = 75.0   # flwr's HEARTBEAT_PATIENCE (2) x HEARTBEAT_DEFAULT_INTERVAL (30 s) + 15 s
DEFAULT_HEARTBEAT_INTERVAL = 10.0    # flwr's HEARTBEAT_MIN_INTERVAL: the SuperLink refuses shorter
ACTIVATION_RETRY_DELAY = 2           # the longest wait between two activation attempts
HEARTBEAT_MODULES = ("flwr.supernode.fleet_http_connection", "flwr.supercore.heartbeat")


def is_activation_refused(exc: Exception) -> bool:
    """Whether ``exc`` is the SuperLink refusing to activate this node's key: HTTP 412 carrying Flower's error
    ``FLEET_NODE_ACTIVATION_FAILED`` (``flwr.supercore.error``, public): the key's previous session is still
    online, or another process holds it."""
    import httpx
    from flwr.supercore.error import ApiErrorCode, FlowerError

    if not isinstance(exc, httpx.HTTPStatusError) or exc.response.status_code != 412:
        return False
    error = FlowerError.from_json(exc.response.text)
    return error is not None and error.code == ApiErrorCode.FLEET_NODE_ACTIVATION_FAILED


def _seconds(environ: dict[str, str] | os._Environ, name: str, default: float, low: float, high: float,
             bounds: str) -> float:
    """The environment variable ``name`` as seconds in [low, high] (``default`` when unset or empty); ValueError
    naming the variable otherwise."""
    raw = environ.get(name, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise ValueError(f"{name} must be a number of seconds {bounds}, got {raw!r}")
    return value


def activation_patience(environ: dict[str, str] | os._Environ = os.environ) -> float:
    """``ACTIVATION_PATIENCE`` in seconds (default 75, 0 = flwr's own: exit on the first refusal)."""
    return _seconds(environ, "ACTIVATION_PATIENCE", DEFAULT_ACTIVATION_PATIENCE, 0.0, 86400.0, "in 0..86400")


def heartbeat_interval(environ: dict[str, str] | os._Environ = os.environ) -> float:
    """``HEARTBEAT_INTERVAL`` in seconds (default 10), within flwr's accepted 10..1800."""
    return _seconds(environ, "HEARTBEAT_INTERVAL", DEFAULT_HEARTBEAT_INTERVAL, 10.0, 1800.0,
                    "in 10..1800 (flwr's bounds)")


def retry_transport_errors(giveup: Callable[[Exception], bool] | None, patience: float = 0.0,
                           clock: Callable[[], float] = time.monotonic) -> Callable[[Exception], bool]:
    """A ``should_giveup`` that never gives up on ``httpx.TransportError``, retries a refused activation
    (:func:`is_activation_refused`) until ``patience`` s after the first refusal, and defers to ``giveup``
    otherwise."""
    import httpx

    warned = {"outage": False}
    first_refusal: list[float] = []

    def should_giveup(exc: Exception) -> bool:
        if isinstance(exc, httpx.TransportError):
            if not warned["outage"]:
                log.warning("node_guard: transient connection error, retrying with back-off: %s", exc)
                warned["outage"] = True
            return False
        warned["outage"] = False
        if patience > 0 and is_activation_refused(exc):
            if not first_refusal:
                first_refusal.append(clock())
                log.warning("node_guard: the SuperLink refused to activate this node's key (its previous session "
                            "is still online until its heartbeat window closes, or another process holds the "
                            "key); retrying for up to %g s", patience)
            if clock() - first_refusal[0] < patience:
                return False
            log.error("node_guard: activation still refused after %g s (ACTIVATION_PATIENCE): another process "
                      "holds this key", patience)
        return bool(giveup(exc)) if giveup is not None else False

    return should_giveup


def install(stamp: Path, patience: float = DEFAULT_ACTIVATION_PATIENCE,
            interval: float = DEFAULT_HEARTBEAT_INTERVAL) -> None:
    """Patch the installed flwr (the three guards); raises RuntimeError naming what is missing."""
    import importlib

    from flwr.supercore.retry import exponential

    beat_modules: list[Any] = [importlib.import_module(name) for name in HEARTBEAT_MODULES]
    missing_beat = [m.__name__ for m in beat_modules
                    if not isinstance(getattr(m, "HEARTBEAT_DEFAULT_INTERVAL", None), (int, float))]
    if missing_beat:
        raise RuntimeError(f"this flwr has no HEARTBEAT_DEFAULT_INTERVAL in {', '.join(missing_beat)}: the node's "
                           "heartbeat interval cannot be set")
    for module in beat_modules:     # what the node declares at activation and in each heartbeat, and its cadence
        module.HEARTBEAT_DEFAULT_INTERVAL = interval

    conn: Any = importlib.import_module(CONNECTION_MODULE)
    loop: Any = importlib.import_module(LOOP_MODULE)
    missing = [f"{m.__name__}.{name}" for m, name in ((conn, "make_simple_http_retry_invoker"),
                                                      (loop, "start_client_internal"))
               if not callable(getattr(m, name, None))]
    if missing:
        raise RuntimeError(f"this flwr has no {', '.join(missing)}: the SuperNode guards cannot be installed")
    make_invoker = conn.make_simple_http_retry_invoker

    def guarded_invoker() -> Any:
        invoker = make_invoker()
        invoker.should_giveup = retry_transport_errors(invoker.should_giveup, patience)
        invoke = invoker.invoke

        def invoke_activation_promptly(target: Any, *args: Any, **kwargs: Any) -> Any:
            # the activation retries a refusal every <= ACTIVATION_RETRY_DELAY s: the node is back as soon as its
            # old session's window closes (every other request keeps flwr's back-off, up to 20 s)
            if getattr(target, "__name__", "") != "ActivateNode":
                return invoke(target, *args, **kwargs)
            backoff = invoker.wait_gen_factory
            invoker.wait_gen_factory = lambda: exponential(max_delay=ACTIVATION_RETRY_DELAY)
            try:
                return invoke(target, *args, **kwargs)
            finally:
                invoker.wait_gen_factory = backoff

        invoker.invoke = invoke_activation_promptly
        return invoker

    conn.make_simple_http_retry_invoker = guarded_invoker
    # every poll stamps idle/busy through flwr's private pull function (flcore/internals.py owns that wrapper);
    # without it (NONIID_FL_PUBLIC_ONLY=1, or a flwr without that function) a thread stamps 'idle' every
    # PUBLIC_STAMP_EVERY s while the polling loop runs: a stopped loop still shows, a hung message does not
    from flcore import internals  # here, not at the top: deploy/healthcheck.py imports this module, not flwr

    per_poll = internals.wrap_pull(loop, lambda run_id: write_stamp(stamp, "idle" if run_id is None else "busy"))
    if not per_poll:
        log.warning("node_guard: the poll stamp says only that the polling loop runs (flwr's pull is not wrapped: "
                    "public-API mode or another flwr)")
    start = loop.start_client_internal

    def stamped_start(*args: Any, **kwargs: Any) -> Any:
        # flwr's connection context logs and swallows an error raised in the polling loop, so the loop can
        # also end by returning while the process (its Runtime API server) lives on: both end the polling
        beat = None if per_poll else _loop_heartbeat(stamp)
        try:
            result = start(*args, **kwargs)
        except BaseException as exc:
            if beat is not None:
                beat.set()
            write_stamp(stamp, "stopped", f"{type(exc).__name__}: {exc}"[:500])
            raise
        if beat is not None:
            beat.set()
        write_stamp(stamp, "stopped", "the polling loop returned")
        # exit, so that any restart policy (compose's restart: unless-stopped included) starts the node again
        log.error("node_guard: the SuperNode's polling loop ended; exiting with %d so the node is restarted",
                  EXIT_LOOP_ENDED)
        logging.shutdown()
        _exit(EXIT_LOOP_ENDED)
        return result

    loop.start_client_internal = stamped_start
    # flower-supernode imported start_client_internal by name before we patched the module
    cli: Any = importlib.import_module("flwr.supernode.cli.flower_supernode")
    if getattr(cli, "start_client_internal", None) is start:
        cli.start_client_internal = stamped_start
    write_stamp(stamp, "idle", "starting")


PUBLIC_STAMP_EVERY = 5.0


def _loop_heartbeat(stamp: Path) -> threading.Event:
    """Stamp 'idle' every PUBLIC_STAMP_EVERY s until the returned event is set (the public-API fallback of the
    per-poll stamp)."""
    done = threading.Event()

    def beat() -> None:
        while not done.wait(PUBLIC_STAMP_EVERY):
            write_stamp(stamp, "idle", "polling loop running")

    threading.Thread(target=beat, name="node-guard-stamp", daemon=True).start()
    return done


def runtime_secret(environ: dict[str, str] | os._Environ = os.environ) -> Path:
    """A fresh Runtime-API secret for this SuperNode and the SuperExec deploy/supernode.sh starts beside it:
    32 random bytes in ``superexec-<RUNTIME_PORT>.secret`` of the node's private directory (the stamp's,
    :func:`private_dir`), written as a new 0600 file and renamed into place (never through a planted path), so
    each start replaces the last one's and nothing accumulates. Stock mode with TLS uses it: without a secret,
    any local process reaching the Runtime API port could take this node's ClientApp tasks (issue 42)."""
    port = environ.get("RUNTIME_PORT", "9094")
    directory = private_dir(Path(environ.get("TMPDIR", "/tmp")) / f"flower-supernode-{os.getuid()}")
    path = directory / f"superexec-{port}.secret"
    fd, tmp = tempfile.mkstemp(prefix=".secret-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(32))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--make-runtime-secret"]:  # deploy/supernode.sh: print the path of a fresh secret
        try:
            print(runtime_secret())
        except (ValueError, OSError) as exc:
            print(f"node_guard: {exc}", file=sys.stderr)
            sys.exit(2)
        return
    stamp = stamp_path()
    try:
        stamp_dir(stamp)
        install(stamp, activation_patience(), heartbeat_interval())
    except (RuntimeError, ImportError, ValueError, OSError) as exc:
        print(f"node_guard: {exc}", file=sys.stderr)
        sys.exit(2)
    from importlib.metadata import entry_points

    sys.argv = ["flower-supernode", *args]
    entry = [ep for ep in entry_points(group="console_scripts") if ep.name == "flower-supernode"]
    if not entry:
        print("node_guard: no console script flower-supernode is installed", file=sys.stderr)
        sys.exit(2)
    entry[0].load()()


if __name__ == "__main__":
    main()
