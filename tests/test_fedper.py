"""FedPer (Arivazhagan et al. 2019; flcore/methods/pfl_basic.py): which entries are personal (the last K_P
layers), the server's average over the base layers only (by hand), the personal layers staying on the client
across rounds (never sent, never averaged), every layer shared being FedAvg and every layer personal being
`local`, both bit for bit."""

from __future__ import annotations

import math
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import RecordDict

from client_app.trainers.pfl_basic.split import FedPerTrainer
from flcore.config import ConfigError
from flcore.methods.pfl_basic import STATE_FEDPER, head_names, last_layers
from flcore.registry import get_method, resolve
from strategies.methods.pfl_basic import shared_average
from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job, register, run_round
from tests._pfl_basic_util import column, job, params_digest

MLP = ["backbone.1.weight", "backbone.1.bias", "backbone.3.weight", "backbone.3.bias", "head.weight", "head.bias"]
CFG = {"batch_size": 8, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "local_epochs": 1}


def test_personal_entries_are_the_last_k_layers():
    assert list(initial_params(make_cfg(method="fedper"))) == MLP   # the split below is on the real model's names
    assert last_layers(MLP, 0) == []
    assert last_layers(MLP, 1) == head_names(MLP) == ["head.weight", "head.bias"]
    assert last_layers(MLP, 2) == MLP[2:]
    assert last_layers(MLP, 3) == last_layers(MLP, 9) == MLP
    bn = ["b.0.weight", "b.0.bias", "b.1.weight", "b.1.running_mean", "b.1.num_batches_tracked", "head.weight"]
    assert last_layers(bn, 2) == bn[2:]                               # a layer's buffers go with it
    with pytest.raises(ValueError, match="personalization layers must be >= 0"):
        last_layers(MLP, -1)


def test_shared_average_by_hand():
    server = OrderedDict(a=np.array([1.0, 1.0], np.float32), h=np.array([5.0], np.float32))
    ups = [SimpleNamespace(params={"a": np.array([3.0, 0.0], np.float32), "h": np.array([7.0], np.float32)},
                           num_examples=1),
           SimpleNamespace(params={"a": np.array([0.0, 3.0], np.float32), "h": np.array([9.0], np.float32)},
                           num_examples=2)]
    out = shared_average(server, ups, {"a"})
    np.testing.assert_allclose(out["a"], [1.0, 2.0])     # (1 * 3 + 2 * 0) / 3, (1 * 0 + 2 * 3) / 3
    np.testing.assert_array_equal(out["h"], [5.0])       # personal: the server's own value
    assert out["a"].dtype == np.float32
    np.testing.assert_array_equal(shared_average(server, ups, set())["a"], server["a"])


def test_the_personal_head_stays_on_the_client_across_rounds():
    cfg = make_cfg(method="fedper", **CFG)
    datas = {cid: make_data(cid) for cid in range(3)}
    states = {cid: RecordDict() for cid in datas}
    strategy = resolve(get_method("fedper").strategy)(cfg)
    register(strategy, datas)
    init = initial_params(cfg)
    params, updates = run_round(cfg, strategy, 1, init, datas, states, sorted(datas))
    for u in updates:
        np.testing.assert_array_equal(u.params["head.weight"], init["head.weight"])   # not sent
    for k in ("head.weight", "head.bias"):
        np.testing.assert_array_equal(params[k], init[k])           # the server never averages it
    assert not np.array_equal(params["backbone.1.weight"], init["backbone.1.weight"])
    # round 2: client 0 trains from the shared body and ITS head of round 1 (not the server's)
    stored = make_job(cfg, 0, 2, params, datas[0], states[0]).state.get_arrays(STATE_FEDPER)
    assert set(stored) == {"head.weight", "head.bias"}
    assert not np.array_equal(stored["head.weight"], init["head.weight"])
    trainer = FedPerTrainer(make_job(cfg, 0, 2, params, datas[0], states[0]))
    trainer.run()
    expect = FedPerTrainer(make_job(cfg, 0, 2, {**params, **stored}, datas[0], RecordDict()))
    expect.fit()  # from the same start without a state: the same trained model
    for k, v in trainer.job.model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), expect.job.model.state_dict()[k].numpy())
    for k, v in trainer.personalized().state_dict().items():   # P-FL: shared body + personal head, trained
        np.testing.assert_array_equal(v.numpy(), trainer.job.model.state_dict()[k].numpy())


def test_every_layer_shared_is_fedavg_bit_for_bit(tmp_path):
    fedavg, _ = job(tmp_path, "fedavg", method="fedavg")
    shared, _ = job(tmp_path, "shared", method="fedper", **{"fedper.personal-layers": 0})
    fedper, doc = job(tmp_path, "fedper", method="fedper")
    assert shared.digest == fedavg.digest
    assert params_digest(fedper) != params_digest(fedavg)
    # the server's head is its initialisation after every round (the clients' heads are their own)
    assert fedper.sketch["head.weight"] == job(tmp_path, "local", method="local")[0].sketch["head.weight"]
    assert all(math.isfinite(a) for a in column(doc, "local_accuracy"))


def test_declaration_and_bounds():
    decl = get_method("fedper")
    assert decl.payload.state == (STATE_FEDPER,)
    assert make_cfg(method="fedper").to_dict()["fedper.personal-layers"] == 1
    with pytest.raises(ConfigError, match=bound_error("fedper.personal-layers", -1, ">= 0")):
        make_cfg(method="fedper", personal_layers=-1)


def test_every_layer_personal_is_local_bit_for_bit(tmp_path):
    every, _ = job(tmp_path, "every", method="fedper", **{"fedper.personal-layers": 99})
    local, _ = job(tmp_path, "local", method="local")
    assert every.digest == local.digest
