#!/usr/bin/env python
"""Request-body limits of the proxy's routes, derived from the largest legitimate message of a configured model.

    python -m deploy.body_limits -c "method='scaffold' dataset='cifar10' model='resnet18'"
    # -> FLEET_OBJECT_MAX_BODY=...k FLEET_MAX_BODY=...k CONTROL_MAX_BODY=...k  (deploy/proxy.sh settings)

How Flower 1.42 moves a reply over the Fleet API (read from its source and checked here with its own
serialisation): the SuperNode pushes the message's *object tree* (ids only) with ``push-messages`` and then
every object separately with ``push-object``: the Message, its RecordDict, each ArrayRecord, each Array
(metadata) and the Array's data in ArrayChunks of at most ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE`` (5 MiB).
So the largest legitimate body of a route is:

- ``push-object``: the largest deflated object of a reply, i.e. a chunk of min(5 MiB, largest tensor) (or
  a metrics/config record, if larger), plus the request's protobuf framing (node id, run id, object id) and
  ``FRAMING_MARGIN``. A reply carries ``1 + len(reply_records)`` model-sized records (the method's
  declaration; each counted as a full copy of the model's parameters: an upper bound);
- every other Fleet route: its protobuf request, of which only ``push-messages`` grows with the model (the
  object tree: one id per object); limit = twice that tree + ``SMALL_MARGIN``;
- Control: ``start-run`` carries the app package, at most flwr's ``FAB_MAX_SIZE`` (10 MiB), + 1 MiB;
- a reply as a whole (the SuperLink's ``deploy/link_guard.py``, not the proxy): at most twice the legitimate
  reply's object count + ``REPLY_OBJECT_MARGIN`` objects, and twice its deflated bytes + ``REPLY_BYTE_MARGIN``.

Without a model (the proxy's defaults) the push-object bound is the chunk size's: no model's reply needs more.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

FRAMING_MARGIN = 16 * 1024      # push-object: protobuf framing and HTTP slack beyond the object itself
SMALL_MARGIN = 64 * 1024        # every other Fleet request: node/run ids, message metadata, public keys
CONTROL_MARGIN = 1024 * 1024    # start-run: the run config overrides and FAB metadata beside the FAB
MESSAGE_NODE = 80               # the Message's own node in the object tree (a 64-hex id + protobuf framing)
MESSAGE_BYTES = 4096            # the Message object itself (metadata, one child id): counted, not built
REPLY_OBJECT_MARGIN = 16        # a reply's metrics/config records beside its array records
REPLY_BYTE_MARGIN = 1024 * 1024


@dataclass(frozen=True)
class BodyLimits:
    """Largest accepted request body per route group, in bytes (and how they were derived)."""

    push_object: int
    fleet_other: int
    control: int
    largest_object: int
    tree_bytes: int
    records: int
    parameter_bytes: int
    reply_objects: int = 0      # objects of the legitimate reply (0: model-independent defaults)
    reply_bytes: int = 0        # their deflated bytes

    def superlink(self) -> dict[str, str]:
        """deploy/superlink.sh settings (the reply bounds of deploy/link_guard.py); the model-independent
        defaults without a model."""
        from deploy.link_guard import DEFAULT_MAX_REPLY_BYTES, DEFAULT_MAX_REPLY_OBJECTS

        if not self.reply_objects:
            return {"FLEET_MAX_REPLY_OBJECTS": str(DEFAULT_MAX_REPLY_OBJECTS),
                    "FLEET_MAX_REPLY_BYTES": str(DEFAULT_MAX_REPLY_BYTES)}
        return {"FLEET_MAX_REPLY_OBJECTS": str(2 * self.reply_objects + REPLY_OBJECT_MARGIN),
                "FLEET_MAX_REPLY_BYTES": str(2 * self.reply_bytes + REPLY_BYTE_MARGIN)}

    def nginx(self) -> dict[str, str]:
        """deploy/proxy.sh settings (nginx sizes in KiB, rounded up)."""
        return {"FLEET_OBJECT_MAX_BODY": f"{math.ceil(self.push_object / 1024)}k",
                "FLEET_MAX_BODY": f"{math.ceil(self.fleet_other / 1024)}k",
                "CONTROL_MAX_BODY": f"{math.ceil(self.control / 1024)}k"}


def chunk_size() -> int:
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE

    return int(FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE)


def push_object_request_bytes(object_bytes: int) -> int:
    """Serialized size of a PushObjectRequest carrying ``object_bytes`` of object content (largest ids)."""
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node

    req = PushObjectRequest(node=Node(node_id=2**64 - 1), run_id=2**64 - 1, object_id="f" * 64,
                            object_content=b"\0" * object_bytes)
    return req.ByteSize()


def reply_objects(arrays: Mapping[str, np.ndarray], records: int,
                  config: Mapping[str, Any] | None = None) -> tuple[int, int]:
    """(largest deflated object, serialized object tree) of a reply carrying ``records`` ArrayRecords of
    ``arrays`` (+ ``config`` as a ConfigRecord), as flwr 1.42 itself deflates it."""
    largest, tree, _, _ = reply_layout(arrays, records, config)
    return largest, tree


def reply_layout(arrays: Mapping[str, np.ndarray], records: int,
                 config: Mapping[str, Any] | None = None) -> tuple[int, int, int, int]:
    """(largest deflated object, serialized object tree, object count, deflated bytes of all objects) of such a
    reply; the Message object above the RecordDict counts as one more object of ``MESSAGE_BYTES``."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree

    if records < 1:
        raise ValueError(f"a reply carries at least one array record, got records={records}")
    content: dict[str, Any] = {}
    for i in range(records):   # distinct data per record, so no object is shared between them
        content[f"arrays-{i}"] = ArrayRecord({k: Array(np.asarray(v) + i) for k, v in arrays.items()})
    if config:
        content["config"] = ConfigRecord(dict(config))
    # the RecordDict and everything under it (the Message object above it holds metadata and one child id;
    # building one needs a live run, so its tree node is counted as one more id)
    root = RecordDict(content)
    sizes = [len(obj.deflate()) for obj in get_all_nested_objects(root).values()]
    tree = get_object_tree(root)
    return max(sizes), tree.ByteSize() + MESSAGE_NODE, len(sizes) + 1, sum(sizes) + MESSAGE_BYTES


def limits_for(arrays: Mapping[str, np.ndarray] | None, records: int = 1,
               config: Mapping[str, Any] | None = None) -> BodyLimits:
    """Limits for replies of ``records`` copies of ``arrays``; ``arrays=None``: the model-independent bound
    (a full chunk is the largest array object any reply can push)."""
    from flwr.common.constant import FAB_MAX_SIZE

    if arrays is None:
        from flwr.app import Array
        probe = Array(np.zeros(chunk_size(), dtype=np.uint8))   # one full chunk, deflated by flwr
        largest = max(len(c.deflate()) for _, c in probe.slice_array())
        largest_obj, tree, params, count, total = largest, 0, 0, 0, 0
    else:
        largest_obj, tree, count, total = reply_layout(arrays, records, config)
        params = sum(np.asarray(v).nbytes for v in arrays.values())
    return BodyLimits(push_object=push_object_request_bytes(largest_obj) + FRAMING_MARGIN,
                      fleet_other=2 * tree + SMALL_MARGIN, control=FAB_MAX_SIZE + CONTROL_MARGIN,
                      largest_object=largest_obj, tree_bytes=tree, records=records, parameter_bytes=params,
                      reply_objects=count, reply_bytes=total)


def limits_for_run_config(overrides: Mapping[str, Any]) -> BodyLimits:
    """Limits for the model and method a run config names (the model is built as the ServerApp builds it)."""
    from data_partitioning.datasets import dataset_shape
    from flcore.config import RunConfig
    from flcore.records import model_params
    from flcore.registry import get_method
    from models import build_model

    cfg = RunConfig.from_dict(dict(overrides))
    shape, classes = dataset_shape(cfg.dataset)
    arrays = model_params(build_model(cfg, shape, classes))
    records = 1 + len(get_method(cfg.method).payload.reply_records)
    return limits_for(arrays, records)


def main(argv: list[str] | None = None) -> None:
    from deploy.localfed import _parse_overrides

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--run-config", default="", help="run-config overrides (TOML pairs); "
                        "empty: the model-independent bound (the proxy's defaults)")
    ns = parser.parse_args(argv)
    lim = limits_for_run_config(_parse_overrides(ns.run_config)) if ns.run_config else limits_for(None)
    print(" ".join(f"{k}={v}" for k, v in lim.nginx().items()))
    print(" ".join(f"{k}={v}" for k, v in lim.superlink().items()) + "   # deploy/superlink.sh")
    print(f"# parameters {lim.parameter_bytes} B x {lim.records} record(s) per reply; largest object "
          f"{lim.largest_object} B; object tree {lim.tree_bytes} B")


if __name__ == "__main__":
    main()
