"""MOON (issue 3): the model-contrastive loss on hand-made examples, the projection head hook, the previous
local model kept in client state, and the term's value inside training."""

import math

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job, make_model
from client_app.state import ClientState
from client_app.trainers.base import Trainer, frozen_copy
from client_app.trainers.moon import (STATE_PREV, MoonTerm, MoonTrainer, moon_contrastive_loss)
from client_app.training import Step
from flcore.config import ConfigError


def test_loss_hand_example_aligned_with_global():
    z = torch.tensor([[1.0, 0.0]])
    # sim(z, z_glob) = 1, sim(z, z_prev) = 0, tau = 0.5: -log(e^2 / (e^2 + e^0)) = log(1 + e^-2)
    loss = moon_contrastive_loss(z, torch.tensor([[3.0, 0.0]]), torch.tensor([[0.0, 2.0]]), 0.5)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-2)), rel=1e-6)


def test_loss_hand_example_batch_mean():
    z = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    zg = torch.tensor([[1.0, 0.0], [-1.0, 0.0]])
    zp = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    # row 1: equal similarities -> log 2; row 2: sim_g = -1, sim_p = 1, tau = 1 -> log(1 + e^2)
    expected = 0.5 * (math.log(2) + math.log(1 + math.exp(2)))
    assert moon_contrastive_loss(z, zg, zp, 1.0).item() == pytest.approx(expected, rel=1e-6)


def test_projection_head_hook_and_config():
    cfg = make_cfg(method="moon", proj_dim=5)
    model = make_model(cfg)
    proj = model.extras["proj"]
    assert proj(torch.zeros(2, model.feature_dim)).shape == (2, 5)
    assert any(k.startswith("extras.proj.") for k in model.state_dict())  # averaged with the model
    with pytest.raises(ConfigError, match=bound_error("moon.tau", 0.0, "> 0, finite")):
        make_model(make_cfg(method="moon", tau=0.0))


def test_first_participation_trains_like_fedavg_and_stores_local_model():
    cfg = make_cfg(method="moon", local_epochs=2)
    params, data = initial_params(cfg), make_data(0)
    state = RecordDict()
    job = make_job(cfg, 0, 1, params, data, state)
    reply = MoonTrainer(job).run()
    base = Trainer(make_job(cfg, 0, 1, params, data, RecordDict())).run()
    for k in params:
        np.testing.assert_array_equal(reply.params[k], base.params[k])
    stored = ClientState(state, 0).get_arrays(STATE_PREV)
    for k in params:
        np.testing.assert_array_equal(stored[k], reply.params[k])


def test_term_value_with_previous_model_matches_formula():
    cfg = make_cfg(method="moon", mu=2.0, tau=0.5)
    params, data = initial_params(cfg), make_data(1)
    state = RecordDict()
    prev_model = make_model(cfg)
    with torch.no_grad():
        for p in prev_model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ClientState(state, 0).put_arrays(STATE_PREV, {k: v.detach().numpy().copy() for k, v in prev_model.state_dict().items()})
    job = make_job(cfg, 0, 2, params, data, state)
    trainer = MoonTrainer(job)
    (term,) = trainer.terms()
    assert isinstance(term, MoonTerm) and term.prev_model is not None
    model = job.model
    with torch.no_grad():  # the model being trained has moved away from the global one
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    logits, feats = model.forward_features(data.x_train)
    got = term.loss(model, Step(data.x_train, data.y_train, logits, feats, 0, 0))
    proj = lambda m: m.extras["proj"](m.features(data.x_train))  # noqa: E731
    glob = make_model(cfg)
    glob.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    expected = 2.0 * moon_contrastive_loss(proj(model), proj(glob), proj(prev_model), 0.5)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    # the gradient reaches the backbone and the projection head, not the classifier
    got.backward()
    assert model.extras["proj"][0].weight.grad.abs().sum() > 0
    assert model.backbone[1].weight.grad.abs().sum() > 0
    assert model.head.weight.grad is None


def test_contrastive_term_changes_training_from_second_participation():
    cfg = make_cfg(method="moon", mu=5.0, local_epochs=2)
    params, data = initial_params(cfg), make_data(2)
    state = RecordDict()
    MoonTrainer(make_job(cfg, 0, 1, params, data, state)).run()
    moon = MoonTrainer(make_job(cfg, 0, 2, params, data, state)).run()
    base = Trainer(make_job(cfg, 0, 2, params, data, RecordDict())).run()
    diff = sum(float(np.abs(moon.params[k] - base.params[k]).sum()) for k in params)
    assert diff > 1e-3
    assert moon.metrics["train_loss"] > base.metrics["train_loss"]  # includes mu * l_con > 0


def test_missing_projection_head_fails_clearly():
    cfg = make_cfg(method="fedavg")
    job = make_job(cfg, 3, 1, initial_params(cfg), make_data(0), RecordDict())
    with pytest.raises(KeyError, match="extras\\['proj'\\]"):
        MoonTrainer(job)
    assert frozen_copy(job.model) is not job.model
