"""Server-side tensors a method keeps across rounds (SCAFFOLD's control variate c, FedDyn's h): the generic
half of such methods, so that a method's strategy holds only its paper's formulas.

A strategy mixes :class:`TensorState` in before :class:`~strategies.base.FLStrategy` and declares
``TENSOR_STATE = {attribute: (checkpoint key, round-metric name)}``. Each attribute is an OrderedDict of
float64 arrays, empty until :meth:`TensorState.init_tensors` (called when a train message is built) sets
it to zero for every floating-point tensor of the model (integer buffers such as BatchNorm's counter get
none); it is checkpointed under its key and its L2 norm is logged every round under its metric name.
``REPLY_RECORDS = {record: attribute}`` rejects, like any malformed update, a reply whose ArrayRecord
``record`` is missing or does not fit the attribute's names and shapes (SCAFFOLD's delta c_i against c).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from flcore.named_arrays import Arrays
from flcore.config import RunConfig
from flcore.records import record_to_params
from strategies.aggregation import average_non_float, is_float
from strategies.exchange import Failure
from strategies.update_checks import ClientUpdate, arrays_problem, reject_updates



def with_non_float(params: Arrays, new_float: Arrays, client_params: Sequence[Arrays],
                   weights: Sequence[float]) -> "OrderedDict[str, np.ndarray]":
    """The model's entries in its order and dtypes: a method's new floating-point tensors ``new_float``, and
    the weighted mean of the client values for the others (integer counters no optimizer rule covers)."""
    ints = average_non_float(client_params, weights, [k for k in params if k not in new_float])
    return OrderedDict((k, new_float[k].astype(params[k].dtype) if k in new_float else ints[k]) for k in params)


class TensorState:
    """Mixin (before FLStrategy) for float64 state tensors: zero-initialised, checkpointed, norms logged."""

    TENSOR_STATE: ClassVar[dict[str, tuple[str, str]]] = {}
    REPLY_RECORDS: ClassVar[dict[str, str]] = {}

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)  # type: ignore[call-arg]
        self.model_dtypes: dict[str, np.dtype] = {}
        for attr in self.TENSOR_STATE:
            setattr(self, attr, OrderedDict())

    def init_tensors(self, params: Arrays) -> None:
        """Zero every empty state tensor (one entry per float tensor of ``params``); note the model's dtypes."""
        self.model_dtypes = {k: np.asarray(v).dtype for k, v in params.items()}
        for attr in self.TENSOR_STATE:
            if not getattr(self, attr):
                setattr(self, attr, OrderedDict((k, np.zeros(np.shape(v), np.float64))
                                                for k, v in params.items() if is_float(v)))

    def in_model_dtypes(self, tensors: Arrays) -> "OrderedDict[str, np.ndarray]":
        """``tensors`` cast to the model's dtypes (what goes into a message)."""
        return OrderedDict((k, np.asarray(v).astype(self.model_dtypes[k])) for k, v in tensors.items())

    def train_content(self, server_round: int, cid: int, params: Arrays,
                      message_config: dict[str, Any] | None = None) -> RecordDict:
        self.init_tensors(params)  # before client_records() may send a state tensor
        return super().train_content(server_round, cid, params, message_config)  # type: ignore[misc]

    def collect_updates(self, server_round: int, replies: Mapping[int, Any], reference: Arrays,
                        phase: str = "train") -> tuple[list[ClientUpdate], list[Failure]]:
        updates, rejected = super().collect_updates(server_round, replies, reference, phase)  # type: ignore[misc]
        if not self.REPLY_RECORDS:
            return updates, rejected
        self.init_tensors(reference)
        return reject_updates(server_round, updates, rejected, self._record_problem, phase)

    def _record_problem(self, update: Any) -> str | None:
        for key, attr in self.REPLY_RECORDS.items():
            rec = update.records.get(key)
            if not isinstance(rec, ArrayRecord):
                return f"record '{key}' missing from the reply"
            problem = arrays_problem(record_to_params(rec), getattr(self, attr), key)
            if problem is not None:
                return problem
        return None

    def round_metrics(self) -> dict[str, Any]:
        metrics = dict(super().round_metrics())  # type: ignore[misc]
        for attr, (_, name) in self.TENSOR_STATE.items():
            metrics[name] = math.sqrt(sum(float(np.sum(v ** 2)) for v in getattr(self, attr).values()))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()  # type: ignore[misc]
        for attr, (key, _) in self.TENSOR_STATE.items():
            state[key] = {k: v.copy() for k, v in getattr(self, attr).items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)  # type: ignore[misc]
        for attr, (key, _) in self.TENSOR_STATE.items():
            setattr(self, attr, OrderedDict((k, np.asarray(v, np.float64)) for k, v in state[key].items()))
