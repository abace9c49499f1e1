"""FedUFO's discriminator in a federation smaller than ``fedufo.num-clients`` (issue 19): Eqs. 4-5 use only the
registered clients' outputs, so K is the federation's size as in the paper. Without it, on the issue's job
(20 clients, K = 100) D learned to never output the 80 ids no client holds and the uniform loss, which asks
for all K outputs to be equal, grew from 4.65 to 5.57 over 12 rounds while G-FL stayed at 0.19-0.40."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from client_app.trainers.fedufo.trainer import FedUFOTrainer
from client_app.trainers.fedufo.loss_terms import LiveOutputs
from flcore.methods.fedufo import CLIENTS_KEY
from flcore.records import model_params
from models import build_model
from strategies.methods.fedufo import FedUFOStrategy, relay_records
from tests.test_fedufo import FailingGrid, _cfg, _job


def test_live_outputs_select_the_registered_clients_columns():
    live = LiveOutputs([1, 3], 5, torch.device("cpu"))
    z = torch.arange(10.0).reshape(2, 5)
    assert torch.equal(live.logits(z), torch.tensor([[1.0, 3.0], [6.0, 8.0]]))
    assert live.column(3) == 1 and live.column(1) == 0
    with pytest.raises(ValueError, match="client 2 is not among the registered clients"):
        live.column(2)
    every = LiveOutputs([0, 1, 2], 3, torch.device("cpu"))
    assert every.logits(z[:, :3]) is not None and torch.equal(every.logits(z[:, :3]), z[:, :3])
    for bad in ([], [3, 1], [1, 1], [0, 5]):
        with pytest.raises(ValueError, match="fedufo.num-clients"):
            LiveOutputs(bad, 5, torch.device("cpu"))


def test_unregistered_outputs_neither_enter_the_losses_nor_train():
    cfg = _cfg(**{"fedufo.num-clients": 10, "weight-decay": 0.0})
    theta = dict(model_params(build_model(cfg, (1, 8, 8), 10)))
    registered = [0, 1, 2]
    jobs = {c: _job(cfg, c, "train.prior", theta) for c in registered}
    priors = {}
    for c, job in jobs.items():
        job.config[CLIENTS_KEY] = registered
        priors[c] = FedUFOTrainer(job).run().params
    relay = relay_records(registered, priors, {c: [1] * 10 for c in registered})
    job = _job(cfg, 1, "train.posterior", theta, relay[1], stage=1)
    job.config[CLIENTS_KEY] = registered
    reply = FedUFOTrainer(job).run()
    # Eq. 4 over the 3 live outputs: at least log 3, and well below log 10 for a D that starts near uniform
    assert math.log(3) - 1e-6 <= reply.metrics["fedufo-uniform-loss"] < math.log(10) - 0.5
    w_old, w_new = theta["extras.disc.2.weight"], reply.params["extras.disc.2.weight"]
    b_old, b_new = theta["extras.disc.2.bias"], reply.params["extras.disc.2.bias"]
    assert np.array_equal(w_new[3:], w_old[3:]) and np.array_equal(b_new[3:], b_old[3:])   # dead rows untouched
    assert not np.array_equal(w_new[:3], w_old[:3])                                          # live rows trained
    # a client whose id is not among the registered ones is refused, naming the cause
    stray = _job(cfg, 5, "train.posterior", theta, relay[1], stage=1)
    stray.config[CLIENTS_KEY] = registered
    with pytest.raises(ValueError, match="client 5 is not among the registered clients"):
        FedUFOTrainer(stray)


def test_strategy_sends_the_registered_ids_and_records_their_number():
    cfg = _cfg(**{"partition": "shards", "fraction-train": 0.5, "local-epochs": 1, "fedufo.num-clients": 10})
    grid = FailingGrid(4)
    strategy = FedUFOStrategy(cfg)
    strategy.train_round(grid, 1, dict(model_params(build_model(cfg, (1, 8, 8), 10))))
    assert strategy.round_metrics()["fedufo-disc-outputs"] == 4
    assert strategy.client_config(1, 2)[CLIENTS_KEY] == [0, 1, 2, 3]
    no_uad = FedUFOStrategy(_cfg(**{"fedufo.losses": "cgl"}))
    assert CLIENTS_KEY not in no_uad.client_config(1, 0)                    # no D, nothing to send
