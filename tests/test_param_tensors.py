"""The shared halves of state-keeping methods (issue 16): client-side parameter tensors and loop pieces
(client_app/trainers/param_tensors.py) and server-side state tensors (strategies/tensor_state.py)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict

from client_app.state import ClientState
from client_app.trainers.param_tensors import ParamPenalty, received_tensors, stored_tensors, to_numpy
from flcore.declaration import Payload
from flcore.records import params_to_record
from strategies.base import FLStrategy
from strategies.tensor_state import TensorState, with_non_float
from tests._baselines_util import initial_params, make_cfg, make_data, make_job, register_sizes


def _job(records=None, state=None):
    cfg = make_cfg(method="fedavg")
    content = RecordDict(records or {})
    return make_job(cfg, 7, 1, initial_params(cfg), make_data(0), state if state is not None else RecordDict(),
                    content)


def test_received_tensors_converts_and_checks():
    job = _job()
    shapes = {k: tuple(p.shape) for k, p in job.model.named_parameters()}
    with pytest.raises(KeyError, match=r"client 7: the message lacks the thing \(record 'rec'\)"):
        received_tensors(job, "rec", "the thing")
    arrays = {k: np.full(s, 0.5, np.float64) for k, s in shapes.items()}
    got = received_tensors(_job({"rec": params_to_record(arrays)}), "rec", "the thing")
    assert list(got) == list(shapes)  # the trainable parameters, in named_parameters() order
    assert all(t.dtype == torch.float32 and torch.all(t == 0.5) for t in got.values())
    first = next(iter(shapes))
    arrays[first] = np.zeros((1, 1))
    with pytest.raises(ValueError, match=f"client 7: record 'rec'.*'{first}' has shape"):
        received_tensors(_job({"rec": params_to_record(arrays)}), "rec", "the thing")


def test_stored_tensors_start_at_zero_and_reload():
    rd = RecordDict()
    job = _job(state=rd)
    zeros = stored_tensors(job, "st")
    assert [tuple(v.shape) for v in zeros.values()] == [tuple(p.shape) for p in job.model.parameters()]
    assert all(not v.requires_grad and torch.all(v == 0) for v in zeros.values())
    ClientState(rd, 7).put_arrays("st", to_numpy({k: v + 2.0 for k, v in zeros.items()}))
    assert all(torch.all(v == 2.0) for v in stored_tensors(_job(state=rd), "st").values())
    ClientState(rd, 7).put_arrays("st", {"other": np.zeros(3, np.float32)})
    with pytest.raises(KeyError, match="client 7: client state 'st'"):
        stored_tensors(_job(state=rd), "st")


def test_param_penalty_passes_parameters_with_their_references():
    lin = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0]]))
    ref_a, ref_b = {"weight": torch.tensor([[0.5, 0.0]])}, {"weight": torch.tensor([[2.0, -1.0]])}
    term = ParamPenalty(lambda ts: sum(((w - a) * b).sum() for w, a, b in ts), ref_a, ref_b)
    term.begin(lin)
    value = term.loss(lin, None)
    assert value.item() == pytest.approx(0.5 * 2.0 + 2.0 * -1.0)
    value.backward()
    torch.testing.assert_close(lin.weight.grad, ref_b["weight"])


class _Toy(TensorState, FLStrategy):
    TENSOR_STATE = {"m": ("toy_m", "toy-m-norm")}
    REPLY_RECORDS = {"toy-rec": "m"}


def test_tensor_state_zero_init_metrics_checkpoint_and_reply_check():
    cfg = make_cfg(method="fedavg")
    toy = _Toy(cfg)
    params = {"w": np.ones((2, 2), np.float32), "n": np.array([3], np.int64)}
    toy.init_tensors(params)
    assert list(toy.m) == ["w"] and toy.m["w"].dtype == np.float64 and not toy.m["w"].any()
    toy.m["w"][0] = [3.0, 4.0]
    toy.init_tensors(params)  # a non-empty state is kept
    assert toy.round_metrics() == {"toy-m-norm": 5.0}
    assert toy.in_model_dtypes(toy.m)["w"].dtype == np.float32
    other = _Toy(cfg)
    other.load_state_dict(toy.state_dict())
    np.testing.assert_array_equal(other.m["w"], toy.m["w"])
    register_sizes(toy, {1: 4, 2: 4, 3: 4})
    toy.checks.payload = Payload(reply_records=("toy-rec",))  # a real method declares its records (SCAFFOLD's)
    base = {"arrays": params_to_record(params), "metrics": MetricRecord({"num-examples": 4, "local-steps": 1})}
    replies = {1: RecordDict(base),
               2: RecordDict({**base, "toy-rec": params_to_record({"w": np.zeros(3, np.float32)})}),
               3: RecordDict({**base, "toy-rec": params_to_record({"w": np.zeros((2, 2), np.float32)})})}
    updates, rejected = toy.collect_updates(1, {c: SimpleNamespace(content=r) for c, r in replies.items()}, params)
    assert [u.cid for u in updates] == [3]
    assert [(f.cid, f.reason) for f in rejected] == [
        (1, "record 'toy-rec' missing from the reply"),
        (2, "record 'toy-rec' tensor 'w' has shape (3,), expected (2, 2)")]


def test_with_non_float_keeps_order_and_dtypes():
    params = {"n": np.array(3, np.int64), "w": np.zeros(2, np.float32)}
    clients = [{"n": np.array(5, np.int64), "w": np.ones(2, np.float32)},
               {"n": np.array(8, np.int64), "w": np.ones(2, np.float32)}]
    out = with_non_float(params, {"w": np.array([0.25, 1.5])}, clients, [1.0, 3.0])
    assert list(out) == ["n", "w"] and out["w"].dtype == np.float32 and out["n"].dtype == np.int64
    np.testing.assert_array_equal(out["w"], [0.25, 1.5])
    assert int(out["n"]) == 7  # rint(0.25 * 5 + 0.75 * 8)
