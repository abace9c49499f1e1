"""What runs inside an engine worker process (engines/pool.py starts them): it holds the Contexts of the
nodes it owns and runs the ClientApp on their messages, one at a time, with Flower's engine semantics
(:func:`engines.delivery.handle`).

Tasks (from the driver, in order): ``("adopt", node, context bytes)``, ``("release", node)`` -> the
node's context bytes go back, ``("run", message id, message bytes)`` -> the pickled reply and the seconds
it took go back, ``("stop",)``. A Context travels without the run config when it equals the run's
(every worker has that one), so a node costs its state and node config, not a copy of the config.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Mapping

from flwr.app import Context, Message
from flwr.common.constant import ErrorCode

from engines.delivery import ClientAppFn, error_reply, handle


def warm_imports() -> None:
    """Import what a PyTorch ClientApp imports lazily on its first message, so that forked workers inherit
    it: ``torch._dynamo``, which the first ``torch.optim`` optimizer step imports (~1 s of CPU)."""
    import torch._dynamo  # noqa: F401


def pack_context(context: Context, shared_run_config: Mapping[str, Any]) -> bytes:
    """A Context's bytes for the trip between processes; a run config equal to the run's shared one is
    left out (every worker has it), so a node costs its state and node config, not a copy of the config."""
    rc = None if context.run_config == shared_run_config else dict(context.run_config)
    return pickle.dumps((context.run_id, context.node_id, dict(context.node_config), context.state, rc,
                         getattr(context, "series_id", 0)), protocol=pickle.HIGHEST_PROTOCOL)


def unpack_context(payload: bytes, shared_run_config: dict[str, Any]) -> Context:
    run_id, node_id, node_config, state, rc, series_id = pickle.loads(payload)
    return Context(run_id=run_id, node_id=node_id, node_config=node_config, state=state,
                   run_config=shared_run_config if rc is None else rc, series_id=series_id)


def _exit_with_parent(interval: float = 1.0) -> None:
    """End this worker when the driver process is gone (killed without a chance to stop its workers)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="engine-parent-watch", daemon=True).start()


def worker_main(index: int, tasks: Any, results: Connection, app_ref: str | ClientAppFn, torch_threads: int,
                 run_config: dict[str, Any]) -> None:
    """Serve tasks until "stop": adopt/release a node's Context, run a message for a held node."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle; it stops us
    _exit_with_parent()
    import torch

    torch.set_num_threads(torch_threads)
    from engines.grid import load_client_app

    app = load_client_app(app_ref)
    contexts: dict[int, Context] = {}
    while True:
        kind, *args = tasks.get()
        if kind == "stop":
            break
        if kind == "adopt":
            node, payload = args
            contexts[node] = unpack_context(payload, run_config)
        elif kind == "release":
            (node,) = args
            results.send(("released", node, pack_context(contexts.pop(node), run_config)))
        elif kind == "run":
            msg_id, payload = args
            msg: Message = pickle.loads(payload)
            node = msg.metadata.dst_node_id
            if node not in contexts:
                reply, context, seconds = error_reply(msg, ErrorCode.UNKNOWN, f"engine worker {index} does not "
                                                      f"hold node {node} (engine bug)"), None, 0.0
            else:
                reply, context, seconds = handle(app, msg, contexts[node], copy_reply=False)
            if context is not None:
                contexts[node] = context
            results.send(("reply", msg_id, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL), seconds))
        else:
            raise ValueError(f"engine worker {index}: unknown task {kind!r}")
