"""A Grid through which this project's strategies drive NumPyClient ClientApps (client_app/numpy_client.py).

A ``ClientApp(client_fn=...)`` answers Flower's legacy records only (flwr/compat/common/recorddict_compat):

    ours (docs/PROTOCOL.md)                         legacy, as sent to the client
    query    {run_config}                        -> get_properties  getpropertiesins.config
    train    {run_config, arrays, config}        -> train           fitins.parameters, fitins.config
    evaluate {run_config, arrays, config}        -> evaluate        evaluateins.parameters, evaluateins.config

The run config travels as ``run-config.<key>`` entries of the legacy config (flcore/faces.py), the model
as the list of its arrays in state-dict order. Replies are turned back into ours (``info``; ``arrays``
named again + ``metrics`` with num-examples = fitres.num_examples; evaluate ``metrics``), so the strategy,
its validation and its aggregation are unchanged, under ``start()`` as under ``train_round()``::

    result = strategy.start(grid=NumPyClientGrid(grid), initial_arrays=..., num_rounds=...)

A message with records besides these (SCAFFOLD's c, FedETF's memory) or another action is refused: a
NumPyClient cannot receive them. Replies are new messages answering ours (the wrapped grid's replies are
left as they are); one that is not in the legacy form becomes an error reply.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Iterable, cast

from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.app.typing import ConfigRecordValues, MetricRecordValues
from flwr.common import (Config, EvaluateIns, FitIns, GetPropertiesIns, ndarrays_to_parameters,
                         parameters_to_ndarrays)
from flwr.compat.common import recorddict_compat as legacy
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from flcore import internals, protocol
from flcore.faces import decode_counts, with_run_config
from flcore.records import params_to_record, record_to_params

GET_PROPERTIES = "get_properties"


class NumPyClientGrid(Grid):
    """Wraps a Grid: our messages go out in Flower's legacy records, replies come back in ours."""

    def __init__(self, grid: Grid) -> None:
        self.inner = grid
        self._pending: dict[str, tuple[Message, list[str]]] = {}  # message id -> (our message, array names)

    # --- translation ------------------------------------------------------------------------------------
    @staticmethod
    def to_legacy(msg: Message) -> tuple[Message, list[str]]:
        """The legacy message for one of ours, and the names of the arrays it carries."""
        kind, content = msg.metadata.message_type, msg.content
        extra = sorted(set(content.keys()) - set(protocol.SERVER_RECORDS))
        if extra:
            raise ValueError(f"'{kind}' message carries record(s) {extra} that a NumPyClient cannot receive "
                             "(flcore/faces.py: numpy_client_problem)")
        run = dict(content[protocol.RUN_CONFIG]) if protocol.RUN_CONFIG in content else {}
        # the values of two ConfigRecords, which Flower's legacy Config type calls scalars
        config = cast(Config, with_run_config(dict(content.get(protocol.CONFIG, {})), run))
        names: list[str] = []
        if kind == protocol.QUERY:
            out, out_type = legacy.getpropertiesins_to_recorddict(GetPropertiesIns(config=config)), GET_PROPERTIES
        elif kind in (protocol.TRAIN, protocol.EVALUATE):
            arrays = content[protocol.ARRAYS]
            assert isinstance(arrays, ArrayRecord)  # our train and evaluate messages carry the model so
            params = record_to_params(arrays)
            names = list(params)
            parameters = ndarrays_to_parameters(list(params.values()))
            if kind == protocol.TRAIN:
                out = legacy.fitins_to_recorddict(FitIns(parameters, config), keep_input=True)
            else:
                out = legacy.evaluateins_to_recorddict(EvaluateIns(parameters, config), keep_input=True)
            out_type = kind
        else:
            raise ValueError(f"message type '{kind}' has no NumPyClient counterpart (query, train, evaluate)")
        return Message(out, dst_node_id=msg.metadata.dst_node_id, message_type=out_type,
                       group_id=msg.metadata.group_id, ttl=msg.metadata.ttl), names

    @staticmethod
    def from_legacy(kind: str, content: RecordDict, names: list[str]) -> RecordDict:
        """Our reply content for a legacy reply to a ``kind`` message."""
        if kind == protocol.QUERY:
            props = dict(legacy.recorddict_to_getpropertiesres(content).properties)
            info: dict[str, ConfigRecordValues] = {
                "cid": int(props["cid"]), "num-examples": int(props["num-examples"]),
                "class-counts": decode_counts(str(props["class-counts"]))}
            return RecordDict({protocol.INFO: ConfigRecord(info)})
        if kind == protocol.TRAIN:
            res = legacy.recorddict_to_fitres(content, keep_input=True)
            arrays = parameters_to_ndarrays(res.parameters)
            if len(arrays) != len(names):
                raise ValueError(f"fit returned {len(arrays)} arrays, {len(names)} were sent")
            # legacy scalars: MetricRecord refuses one that is not a number (the reply then becomes an error reply)
            metrics = cast(dict[str, MetricRecordValues], {**res.metrics, "num-examples": int(res.num_examples)})
            return RecordDict({protocol.ARRAYS: params_to_record(OrderedDict(zip(names, arrays))),
                               protocol.METRICS: MetricRecord(metrics)})
        eval_res = legacy.recorddict_to_evaluateres(content)
        eval_metrics = cast(dict[str, MetricRecordValues], {**eval_res.metrics, "loss": float(eval_res.loss)})
        return RecordDict({protocol.METRICS: MetricRecord(eval_metrics)})

    # --- the Grid -----------------------------------------------------------------------------------------
    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ours = list(messages)
        converted = [self.to_legacy(m) for m in ours]
        ids = list(self.inner.push_messages([out for out, _ in converted]))
        for msg, (_, names), msg_id in zip(ours, converted, ids):
            internals.stamp(msg, msg_id, msg.metadata.src_node_id)  # replies name it, as Flower's grids do
            self._pending[msg_id] = (msg, names)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out = []
        for reply in self.inner.pull_messages(message_ids):
            msg, names = self._pending.pop(reply.metadata.reply_to_message_id)
            if reply.has_error():  # passed on as it is (a lost node's error comes from the SuperLink)
                out.append(reply)
                continue
            kind = msg.metadata.message_type
            try:
                out.append(Message(self.from_legacy(kind, reply.content, names), reply_to=msg))
            except Exception as exc:  # noqa: BLE001 - a malformed reply becomes an error reply
                out.append(Message(Error(code=0, reason=f"reply to '{kind}' is not a NumPyClient answer: "
                                                        f"{exc!r}"), reply_to=msg))
        return out

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        ids = set(self.push_messages(messages))
        end = time.monotonic() + (timeout if timeout is not None else float("inf"))
        replies: list[Message] = []
        while ids:
            got = list(self.pull_messages(ids))
            replies += got
            ids -= {r.metadata.reply_to_message_id for r in got}
            if ids and time.monotonic() < end:
                time.sleep(0.05)
            elif ids:
                break
        return replies

    # --- the rest is the wrapped grid's -------------------------------------------------------------------
    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def set_run(self, run: Run) -> None:
        self.inner.set_run(run)

    @property
    def run(self):
        return self.inner.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_nodes(self):
        return self.inner.get_nodes()
