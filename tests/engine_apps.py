"""Small ClientApps for the engine tests (importable by worker processes as ``tests.engine_apps:<name>``).

``counter``: every message increments ``context.state["counter"]["n"]`` and the reply reports the new
count, the node's partition id and the worker's pid. Message config keys steer misbehaviour:
``raise-after-count`` (update the state, then raise), ``exit`` (the worker process dies), ``sleep`` (seconds).
"""

from __future__ import annotations

import os
import time

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

counter = ClientApp()


def _count(msg: Message, context: Context) -> Message:
    cfg = msg.content["config"] if "config" in msg.content else {}
    if "sleep" in cfg:
        time.sleep(float(cfg["sleep"]))
    if "counter" not in context.state:
        context.state["counter"] = ConfigRecord({"n": 0})
    n = int(context.state["counter"]["n"]) + 1
    context.state["counter"] = ConfigRecord({"n": n})
    if cfg.get("exit"):
        os._exit(3)
    if cfg.get("raise-after-count"):
        raise RuntimeError(f"node {context.node_config['partition-id']} failed on purpose")
    metrics = {"n": n, "partition-id": int(context.node_config["partition-id"]), "pid": os.getpid(),
               "run-config-keys": len(context.run_config)}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@counter.query()
def query(msg: Message, context: Context) -> Message:
    return _count(msg, context)


@counter.train()
def train(msg: Message, context: Context) -> Message:
    return _count(msg, context)
