"""Conversions between model parameters and Flower records (the only place that knows the formats).

Parameters travel as ``dict[str, np.ndarray]`` keyed by state-dict name ("params"), which keeps names
attached for validation and lets methods address layers (ETF head, extras) by name.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Mapping, cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from flcore import internals


# --- .npy bytes (Flower's Array format, stype "numpy.ndarray"), without re-parsing the same headers ----------
# Flower's Array(ndarray) / Array.numpy() run np.save / np.load, which format and parse (ast) the text
# header of every array of every message. A model has a handful of (dtype, shape) pairs, so the header
# bytes are memoized: encoding is header + raw bytes, decoding a copy of the buffer after the header.
# Both give exactly np.save's bytes and np.load's array (tests/test_engine_records.py).
_NPY = "numpy.ndarray"
_ENCODE: dict[tuple[str, tuple[int, ...]], tuple[bytes, Array]] = {}
_DECODE_HEADERS: dict[bytes, tuple[np.dtype, tuple[int, ...], bool]] = {}
_MAX_HEADERS = 4096


def _encode(a: np.ndarray) -> Array:
    """Array of a C-contiguous ndarray (np.save's bytes). The first Array of each (dtype, shape) is built
    by Flower's constructor; later ones are copies of it with their own data (no re-validation)."""
    if a.dtype.hasobject or not a.flags.c_contiguous:
        return Array(a)
    key = (a.dtype.str, a.shape)
    hit = _ENCODE.get(key)
    if hit is None:
        buf = io.BytesIO()
        np.save(buf, a, allow_pickle=False)
        data = buf.getvalue()
        arr = Array(dtype=str(a.dtype), shape=tuple(a.shape), stype=_NPY, data=data)
        if len(_ENCODE) < _MAX_HEADERS:
            _ENCODE[key] = (data[:len(data) - a.nbytes], arr)
        return arr
    header, proto = hit
    return internals.array_like(proto, header + a.data)  # a.data: memoryview(a)


def _decode(arr: Array, copy: bool = True) -> np.ndarray:
    """np.load of an Array's .npy bytes (a new, writable array); ``copy=False``: the same values as a read-only
    view of the Array's bytes (no copy; where the bytes are not plain .npy, np.load's array)."""
    data = arr.data
    if arr.stype != _NPY or len(data) < 12 or data[:6] != b"\x93NUMPY":
        return arr.numpy()
    start = 10 + int.from_bytes(data[8:10], "little") if data[6] == 1 else 12 + int.from_bytes(data[8:12], "little")
    header = data[:start]
    parsed = _DECODE_HEADERS.get(header)
    if parsed is None:
        fp = io.BytesIO(data)
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            return arr.numpy()
        if dtype.hasobject or fp.tell() != start:
            return arr.numpy()
        parsed = (dtype, shape, fortran)
        if len(_DECODE_HEADERS) < _MAX_HEADERS:
            _DECODE_HEADERS[header] = parsed
    dtype, shape, fortran = parsed
    count = 1
    for n in shape:
        count *= n
    if len(data) - start != count * dtype.itemsize:
        return arr.numpy()  # np.load names the problem
    if count == 0:
        return np.empty(shape, dtype=dtype, order="F" if fortran else "C")
    out = np.frombuffer(data, dtype=dtype, count=count, offset=start)
    return (out.copy() if copy else out).reshape(shape, order="F" if fortran else "C")


def params_to_record(params: Mapping[str, np.ndarray]) -> ArrayRecord:
    record = ArrayRecord()  # item by item: ArrayRecord(dict) would build every Array a second time
    # keys are str and values Arrays by construction: ArrayRecord's checks hold
    internals.set_items(record, {str(k): _encode(np.ascontiguousarray(v)) for k, v in params.items()})
    return record


def record_to_params(record: ArrayRecord) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict((k, _decode(v)) for k, v in record.items())


def record_views(record: ArrayRecord) -> "OrderedDict[str, np.ndarray]":
    """:func:`record_to_params` without the copies: read-only arrays viewing the record's bytes (they keep the
    bytes alive). For code that only reads the values - loads them into a model, aggregates them - and so
    needs no array of its own: a model's bytes are copied once fewer per message."""
    return OrderedDict((k, _decode(v, copy=False)) for k, v in record.items())


def model_params(model: torch.nn.Module) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict((k, v.detach().cpu().numpy().copy()) for k, v in model.state_dict().items())


def model_views(model: torch.nn.Module) -> "OrderedDict[str, np.ndarray]":
    """:func:`model_params` without the copies on the CPU: arrays sharing the model's memory, valid until the
    model changes. For values encoded into a record at once (which copies them anyway)."""
    return OrderedDict((k, v.detach().cpu().numpy()) for k, v in model.state_dict().items())


def load_params(model: torch.nn.Module, params: Mapping[str, np.ndarray]) -> None:
    state = {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}
    model.load_state_dict(state, strict=True)


def params_nbytes(params: Mapping[str, np.ndarray]) -> int:
    return int(sum(np.asarray(v).nbytes for v in params.values()))


def config_to_record(values: Mapping[str, object]) -> ConfigRecord:
    """ConfigRecord from scalars / lists; numpy scalars become Python scalars."""
    out = {}
    for k, v in values.items():
        if isinstance(v, np.generic):
            v = v.item()
        elif isinstance(v, np.ndarray):
            v = v.tolist()
        out[k] = v
    return _filled(ConfigRecord, out, _CONFIG_SCALARS)


def metric_record(values: Mapping[str, object]) -> MetricRecord:
    """``MetricRecord(values)`` (the same record, the same errors)."""
    return _filled(MetricRecord, values, _METRIC_SCALARS)


def record_dict(records: Mapping[str, object]) -> RecordDict:
    """``RecordDict(records)`` (the same RecordDict, the same errors)."""
    if all(type(k) is str and type(v) in _RECORDS for k, v in records.items()):
        return internals.filled(RecordDict, records)
    # any other value: RecordDict's own checks of every item (and its errors) decide
    return RecordDict(cast("dict[str, ArrayRecord | ConfigRecord | MetricRecord]", dict(records)))


# --- records without Flower's per-item checks where they provably pass --------------------------------
# Flower's records check every item as it is set (a few microseconds each: thousands of items per round in a
# small federation). Values of exactly these Python types (and lists of one of them) are what the checks
# accept, so such a record is filled directly; anything else (numpy scalars, bools in a MetricRecord,
# mixed lists, subclasses) goes through the record's own constructor and its checks.
_CONFIG_SCALARS = frozenset({int, float, str, bytes, bool})
_METRIC_SCALARS = frozenset({int, float})
_RECORDS = frozenset({ArrayRecord, ConfigRecord, MetricRecord})


def _plain(value: object, scalars: frozenset) -> bool:
    if type(value) in scalars:
        return True
    if type(value) is not list:
        return False
    if not value:
        return True
    first = type(value[0])
    return first in scalars and all(type(v) is first for v in value)


def _filled(cls: type, values: Mapping[str, object], scalars: frozenset):
    if all(type(k) is str and _plain(v, scalars) for k, v in values.items()):
        return internals.filled(cls, values)
    return cls(dict(values))
