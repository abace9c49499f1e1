"""`local` (flcore/methods/pfl_basic.py): every client trains its own model alone. Nothing is aggregated (the
server's model stays at its initialisation, bit for bit), nothing personal is sent (the reply is the received
model), and the client's model persists in its state: two rounds are two local trainings in a row."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import RecordDict

from client_app.trainers.base import Trainer
from client_app.trainers.pfl_basic.split import LocalTrainer
from flcore.config import RunConfig, resolve_run_config
from flcore.methods.pfl_basic import STATE_LOCAL
from flcore.records import record_to_params
from flcore.registry import get_method, resolve
from tests._baselines_util import initial_params, make_cfg, make_data, make_job, register, run_round
from tests._pfl_basic_util import column, job
from data_partitioning.datasets import dataset_shape
from models import build_model
from tests.known_outputs import COMMON
from tests.known_outputs import params_digest as digest_of

CFG = {"batch_size": 8, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "local_epochs": 1}


def test_two_rounds_are_two_local_trainings_and_the_server_model_stays():
    cfg = make_cfg(method="local", **CFG)
    datas = {cid: make_data(cid) for cid in range(3)}
    states = {cid: RecordDict() for cid in datas}
    strategy = resolve(get_method("local").strategy)(cfg)
    register(strategy, datas)
    init = initial_params(cfg)
    params = init
    for rnd in (1, 2):
        params, updates = run_round(cfg, strategy, rnd, params, datas, states, sorted(datas))
        for u in updates:  # the reply is the received model: nothing of the client's leaves it
            for k, v in u.params.items():
                np.testing.assert_array_equal(v, init[k])
    for k in init:
        np.testing.assert_array_equal(params[k], init[k])
    # each client's stored model = FedAvg's local trainer run twice from the init on the same generators
    for cid, data in datas.items():
        model_params = init
        for rnd in (1, 2):
            plain = Trainer(make_job(cfg, cid, rnd, model_params, data, RecordDict()))
            plain.fit()
            model_params = {k: v.detach().numpy().copy() for k, v in plain.job.model.state_dict().items()}
        stored = states[cid]
        got = record_to_params(stored[STATE_LOCAL])
        for k in init:
            np.testing.assert_array_equal(got[k], model_params[k])


def test_p_fl_is_the_clients_own_model():
    cfg = make_cfg(method="local", **CFG)
    trainer = LocalTrainer(make_job(cfg, 0, 1, initial_params(cfg), make_data(0), RecordDict()))
    trainer.run()
    stored = trainer.job.state.get_arrays(STATE_LOCAL)
    for k, v in trainer.personalized().state_dict().items():
        torch.testing.assert_close(v, torch.as_tensor(stored[k]))


def test_known_output_federation_never_moves_the_global_model(tmp_path):
    out, doc = job(tmp_path, "local", method="local")
    cfg = RunConfig.from_dict(resolve_run_config({**COMMON, "method": "local"}))
    shape, classes = dataset_shape("digits")
    init = {k: v.detach().numpy() for k, v in build_model(cfg, shape, classes).state_dict().items()}
    assert out.digest.split(":")[0] == digest_of(init)
    g = column(doc, "global_accuracy")
    assert g[0] == g[1]                       # the initial model's G-FL, every round
    p = column(doc, "local_accuracy")
    assert p[1] > p[0] and p[0] > 0.2          # the clients' own models learn from their data
