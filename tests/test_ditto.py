"""Ditto (Li et al., ICML 2021; flcore/methods/pfl_basic.py): the personal step on v_k computed by hand, v_k kept
in the client state across rounds, lambda = 0 being local training for v_k with FedAvg's global model bit for
bit, and lambda pulling v_k towards the global model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_app.trainers.pfl_basic.ditto import DittoTrainer, ditto_prox
from flcore.config import ConfigError
from flcore.declaration import FEDAVG_STRATEGY
from flcore.methods.pfl_basic import STATE_DITTO_V
from flcore.registry import get_method
from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job, make_model
from tests._pfl_basic_util import column, job, params_digest

ONE_STEP = {"batch_size": 1000, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "local_epochs": 1}


def perturbed(params: dict, scale: float = 0.05, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: (v + scale * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in params.items()}


def full_gradient_at(cfg, params: dict, data) -> dict[str, torch.Tensor]:
    """grad F_k at ``params``: mean cross-entropy over all of the client's training data."""
    model = make_model(cfg)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in params.items()})
    logits, _ = model.forward_features(data.x_train)
    F.cross_entropy(logits, data.y_train).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def test_prox_penalty_and_its_gradient_by_hand():
    v = torch.tensor([1.0, -2.0], requires_grad=True)
    w = torch.tensor([0.5, 1.0])
    value = ditto_prox(0.4)([(v, w)])
    assert value.item() == pytest.approx(0.5 * 0.4 * (0.25 + 9.0))
    value.backward()
    torch.testing.assert_close(v.grad, 0.4 * (v.detach() - w))


@pytest.mark.parametrize("lam", [0.0, 0.5, 2.0])
def test_one_personal_step_is_v_minus_lr_times_grad_plus_lambda_distance(lam):
    """One full-batch step: v_1 = v_0 - eta (grad F_k(v_0) + lambda (v_0 - w^t)), v_0 = w^0 (the initial model),
    w^t the received model (here w^0 perturbed, so the pull is visible)."""
    cfg = make_cfg(method="ditto", lam=lam, **ONE_STEP)
    data, w0 = make_data(0), initial_params(cfg)
    w_t = perturbed(w0)
    state = RecordDict()
    trainer = DittoTrainer(make_job(cfg, 0, 1, w_t, data, state))
    reply = trainer.run()
    grad = full_gradient_at(cfg, w0, data)
    stored = trainer.job.state.get_arrays(STATE_DITTO_V)
    for name, g in grad.items():
        want = torch.as_tensor(w0[name]) - 0.1 * (g + lam * (torch.as_tensor(w0[name]) - torch.as_tensor(w_t[name])))
        torch.testing.assert_close(torch.as_tensor(stored[name]), want, rtol=1e-5, atol=1e-6)
    # the reply is the global model's own local step from w^t (FedAvg's local solver), not v
    grad_w = full_gradient_at(cfg, w_t, data)
    for name, g in grad_w.items():
        torch.testing.assert_close(torch.as_tensor(reply.params[name]), torch.as_tensor(w_t[name]) - 0.1 * g,
                                   rtol=1e-5, atol=1e-6)


def test_v_survives_rounds_and_starts_where_it_was_left():
    cfg = make_cfg(method="ditto", lam=0.0, **ONE_STEP)
    data, w0 = make_data(1), initial_params(cfg)
    state = RecordDict()
    first = DittoTrainer(make_job(cfg, 1, 1, w0, data, state))
    first.run()
    v1 = first.job.state.get_arrays(STATE_DITTO_V)
    # round 2: another global model arrives; lambda = 0, so v_2 is one more plain step from v_1
    second = DittoTrainer(make_job(cfg, 1, 2, perturbed(w0, 0.3, 5), data, state))
    second.run()
    v2 = second.job.state.get_arrays(STATE_DITTO_V)
    grad = full_gradient_at(cfg, v1, data)
    for name, g in grad.items():
        torch.testing.assert_close(torch.as_tensor(v2[name]), torch.as_tensor(v1[name]) - 0.1 * g,
                                   rtol=1e-5, atol=1e-6)
    # P-FL is v's: the personalized model is the stored v_2
    for name, p in second.personalized().state_dict().items():
        torch.testing.assert_close(p, torch.as_tensor(v2[name]))


def test_v_init_received_starts_from_the_round_model():
    cfg = make_cfg(method="ditto", lam=0.0, v_init="received", **ONE_STEP)
    data, w_t = make_data(2), perturbed(initial_params(make_cfg(method="ditto")), 0.2, 3)
    trainer = DittoTrainer(make_job(cfg, 0, 1, w_t, data, RecordDict()))
    reply = trainer.run()
    v = trainer.job.state.get_arrays(STATE_DITTO_V)
    for name in reply.params:  # lambda = 0 and the same start and batches: v is the global model's local step
        np.testing.assert_array_equal(v[name], reply.params[name])


def test_lambda_zero_v_is_local_training_and_the_global_model_fedavgs(tmp_path):
    """The known-output federation: with lambda = 0 Ditto's global model ends at FedAvg's parameters with FedAvg's
    G-FL, bit for bit, and its P-FL (v_k on the local test split) is `local`'s, round by round; lambda = 1 moves
    the P-FL away from local training."""
    extra = {"max-local-steps": 0}  # whole epochs: v and the local models move enough to tell them apart
    fedavg, fedavg_doc = job(tmp_path, "fedavg", method="fedavg", **extra)
    zero, zero_doc = job(tmp_path, "zero", method="ditto", **{"ditto.lam": 0.0}, **extra)
    local, local_doc = job(tmp_path, "local", method="local", **extra)
    ditto, ditto_doc = job(tmp_path, "ditto", method="ditto", **extra)
    assert params_digest(zero) == params_digest(fedavg) == params_digest(ditto)
    assert column(zero_doc, "global_accuracy") == column(fedavg_doc, "global_accuracy")
    assert column(zero_doc, "global_loss") == column(fedavg_doc, "global_loss")
    assert column(zero_doc, "local_accuracy") == column(local_doc, "local_accuracy")
    assert column(zero_doc, "local_accuracy") != column(fedavg_doc, "local_accuracy")
    assert column(ditto_doc, "local_accuracy") != column(local_doc, "local_accuracy")


def test_declaration_and_bounds():
    decl = get_method("ditto")
    assert decl.strategy == FEDAVG_STRATEGY and decl.payload.state == (STATE_DITTO_V,)
    values = make_cfg(method="ditto").to_dict()
    assert (values["ditto.lam"], values["ditto.v-init"]) == (1.0, "initial")
    with pytest.raises(ConfigError, match=bound_error("ditto.lam", -1.0, ">= 0, finite")):
        make_cfg(method="ditto", lam=-1.0)
    with pytest.raises(ConfigError, match=bound_error("ditto.lam", math.inf, ">= 0, finite")):
        make_cfg(method="ditto", lam=math.inf)
    with pytest.raises(ConfigError, match=bound_error("ditto.v-init", "zero", "one of initial, received")):
        make_cfg(method="ditto", v_init="zero")


def test_building_w0_leaves_the_global_rng_as_it_was():
    cfg = make_cfg(method="ditto", **ONE_STEP)
    trainer = DittoTrainer(make_job(cfg, 0, 1, perturbed(initial_params(cfg)), make_data(0), RecordDict()))
    before = torch.get_rng_state()
    v = trainer.initial_v()
    assert torch.equal(torch.get_rng_state(), before)
    for k, value in initial_params(cfg).items():   # v_0 = w^0, not the received model
        np.testing.assert_array_equal(v.state_dict()[k].numpy(), value)
