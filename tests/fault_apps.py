"""Fault-injecting wrappers of the real ClientApp, for the crash-recovery tests (importable by Ray actors
and engine workers as ``tests.fault_apps:<name>``).

``exit_in_round_2``: the real ClientApp (``client_app.app:app``), except that the client with
partition id :data:`CRASHING_PARTITION` kills its own process with ``os._exit(3)`` when it receives the
``train`` message of server round 2 (what an out-of-memory kill or a segfault does to a Ray actor or an
engine worker: no exception, no reply, the process is gone). Every other message goes to the real app.

``exit_every_train``: every client's process dies on every ``train`` message (no round can complete).

``linger``: the real ClientApp; each process that runs it starts, at its first ``train`` message, a
``sleep 600`` in a session of its own: a process of the run that outlives the run's driver when that is
killed (as Ray's agents do for a minute or two, or a hung actor would), for the SIGKILL test.
"""

from __future__ import annotations

import os
import subprocess

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

CRASHING_PARTITION = 1
CRASH_ROUND = "2"


def _real_app() -> ClientApp:
    from client_app.app import app

    return app


def _exit_in_round_2(message: Message, context: Context) -> Message:
    meta = message.metadata
    if (meta.message_type == "train" and meta.group_id == CRASH_ROUND
            and int(context.node_config["partition-id"]) == CRASHING_PARTITION):
        os._exit(3)
    return _real_app()(message, context)


def _exit_every_train(message: Message, context: Context) -> Message:
    if message.metadata.message_type == "train":
        os._exit(3)
    return _real_app()(message, context)


_lingering: list[subprocess.Popen] = []


def _linger(message: Message, context: Context) -> Message:
    if message.metadata.message_type == "train" and not _lingering:
        # through a shell that exits at once: not a child of this worker (Ray kills a dying worker's children)
        _lingering.append(subprocess.Popen(["sh", "-c", "sleep 600 >/dev/null 2>&1 &"], start_new_session=True))
    return _real_app()(message, context)


class _Wrapped(ClientApp):
    """A ClientApp whose every message goes through ``fn`` (Flower calls ``ClientApp.__call__``)."""

    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self._fn = fn

    def __call__(self, message: Message, context: Context) -> Message:
        return self._fn(message, context)


exit_in_round_2 = _Wrapped(_exit_in_round_2)
exit_every_train = _Wrapped(_exit_every_train)
linger = _Wrapped(_linger)
