"""The ServerApp's watch on its replies for simulation workers that died (Flower's Ray engine).

The ServerApp runs on engines it does not choose: ``flwr run .`` (Flower's simulation SuperLink, where no code of
this project starts the engine), ``noniid-fl run --engine ray`` (:mod:`engines.ray`), the in-process engines and
real deployments. On Flower's Ray engine a ClientApp actor whose process died leaves an error reply of a
recognisable form (Flower 1.42 writes ``<class 'ray.exceptions.ActorDiedError'>...`` into a code-0 error), and
only the ServerApp sees every reply, whatever the engine, so the watch lives here: :class:`WorkerWatchGrid`
rewrites a replaced worker's reply into code 8 (``CLIENT_APP_CRASHED``) with a plain reason and stops the run with
:class:`WorkerLost` on a worker that stays dead. Replies of every other engine pass through unchanged.
Why workers die and how the Ray engine restarts them: :mod:`engines.ray_faults`.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from flwr.app import Error, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

log = logging.getLogger("noniid_fl")

RAY_ERROR_PREFIX = "<class 'ray.exceptions."  # how Flower's engine writes an exception into an error reply
RESTARTED = ("ActorUnavailableError", "OutOfMemoryError")  # the worker died and Ray replaced it
DEAD = ("ActorDiedError", "RayActorError")  # the worker died and stays dead


class WorkerLost(RuntimeError):
    """A simulation worker died and was not replaced: the run cannot go on without sending later clients to it."""


def ray_failure(reply: Message) -> str | None:
    """``'restarted'`` / ``'dead'`` when ``reply`` is the error Flower's Ray engine sends for a message whose
    worker process died, else None (a ClientApp exception is code 2 and is not a worker failure)."""
    if not reply.has_error() or reply.error.code != ErrorCode.UNKNOWN:
        return None
    reason = reply.error.reason or ""
    if not reason.startswith(RAY_ERROR_PREFIX):
        return None
    name = reason[len(RAY_ERROR_PREFIX):].split("'", 1)[0]
    if name in RESTARTED:
        return "restarted"
    if name in DEAD:
        return "dead"
    return None


class DelegatingGrid(Grid):
    """A Grid that forwards everything to ``inner`` (subclasses intercept some calls)."""

    def __init__(self, inner: Grid) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:  # attributes of the wrapped grid that Grid does not declare
        return getattr(self.inner, name)

    def set_run(self, run: Any) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Any:
        return self.inner.run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def get_nodes(self) -> Iterable[Any]:
        return self.inner.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.inner.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.inner.send_and_receive(messages, timeout=timeout)


class WorkerWatchGrid(DelegatingGrid):
    """Looks at every reply for a crashed Ray worker (see the module doc): a replaced one becomes an error
    reply with code 8 and a plain reason; a dead one stops the run with :class:`WorkerLost`.

    ``resume_hint``: the run's out-dir, named in the WorkerLost message (``resume-from``). Replies from any
    other engine (in-process, deployment) pass through unchanged.
    """

    def __init__(self, inner: Grid, resume_hint: str = "") -> None:
        super().__init__(inner)
        self.resume_hint = resume_hint
        self.replaced = 0  # messages whose worker crashed and was replaced

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._check(list(self.inner.pull_messages(message_ids)))

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self._check(list(self.inner.send_and_receive(messages, timeout=timeout)))

    def _check(self, replies: list[Message]) -> list[Message]:
        for reply in replies:
            kind = ray_failure(reply)
            if kind is None:
                continue
            meta = reply.metadata
            assert reply.error.reason is not None  # ray_failure matched Ray's text in it
            where = f"node {meta.src_node_id}, '{meta.message_type}' of round {meta.group_id}"
            if kind == "dead":
                hint = f" Continue it with resume-from='{self.resume_hint}'." if self.resume_hint else ""
                raise WorkerLost(
                    f"the Ray worker running {where} died and was not replaced ({_short(reply.error.reason)}). "
                    "Flower's simulation engine would keep sending later clients to the dead worker, so the run "
                    "stops here. `flwr run .` (Flower 1.42) cannot be told to restart crashed workers; "
                    f"`noniid-fl run --engine ray` restarts them.{hint}")
            self.replaced += 1
            reason = (f"the Ray worker process running this client died ({_short(reply.error.reason)}); Ray "
                      "replaced it and the message was tried at most twice")
            log.error("%s: %s", where, reason)
            reply.error = Error(code=ErrorCode.CLIENT_APP_CRASHED, reason=reason)
        return replies


def _short(reason: str) -> str:
    """``ActorUnavailableError: <first line of Ray's message>``."""
    body = reason[len(RAY_ERROR_PREFIX):] if reason.startswith(RAY_ERROR_PREFIX) else reason
    name, _, rest = body.partition("'>:<'")
    rest = rest.strip().removesuffix("'>").strip()
    first = rest.splitlines()[0] if rest else ""
    return f"{name}: {first}" if first else name
