"""Fed-RoD (Chen & Chao, ICLR 2022; flcore/methods/pfl_basic.py): the balanced-softmax loss by hand, the two
risks training disjoint parts (the generic model from the balanced risk alone, the personal head from the
empirical risk on top of the generic logits: one step by hand), the personal head kept in the client state
across rounds and never sent, P-FL = generic + personal logits, and gamma = 0 giving FedAvg's global model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_app.trainers.pfl_basic.fedrod import FedRoDTrainer, GenericPlusPersonal, balanced_softmax_loss
from client_app.training import OptimConfig, local_train
from flcore.config import ConfigError
from flcore.declaration import FEDAVG_STRATEGY
from flcore.methods.pfl_basic import STATE_FEDROD_HEAD
from flcore.registry import get_method
from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job, make_model
from tests._pfl_basic_util import column, job, params_digest

ONE_STEP = {"batch_size": 1000, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "local_epochs": 1}


def test_balanced_softmax_by_hand():
    g = torch.zeros(2, 3)
    counts = torch.tensor([1.0, 3.0, 0.0])
    # equal logits: p(y) = N_y / sum_c N_c over the classes the client has -> -log(1/4), -log(3/4)
    per = [balanced_softmax_loss(g[:1], torch.tensor([c]), counts, 1.0).item() for c in (0, 1)]
    assert per == pytest.approx([math.log(4), math.log(4 / 3)])
    assert balanced_softmax_loss(g, torch.tensor([0, 1]), counts, 1.0).item() == pytest.approx(
        (math.log(4) + math.log(4 / 3)) / 2)
    # gamma = 1/2: N^gamma = 1, sqrt(3): -log(1 / (1 + sqrt 3))
    assert balanced_softmax_loss(g[:1], torch.tensor([0]), counts, 0.5).item() == pytest.approx(
        math.log(1 + math.sqrt(3)))
    # gamma = 0: the plain cross-entropy over all 3 classes
    logits = torch.tensor([[0.3, -1.2, 2.0]])
    assert balanced_softmax_loss(logits, torch.tensor([2]), counts, 0.0).item() == pytest.approx(
        F.cross_entropy(logits, torch.tensor([2])).item())
    # a class the client lacks gets no mass: the loss of g with an absent class = CE over the present ones
    want = F.cross_entropy(logits[:, :2] + torch.log(counts[:2]), torch.tensor([1])).item()
    assert balanced_softmax_loss(logits, torch.tensor([1]), counts, 1.0).item() == pytest.approx(want)


def test_one_step_by_hand_generic_from_bsm_personal_from_ce_on_top():
    cfg = make_cfg(method="fedrod", **ONE_STEP)
    data, w = make_data(0), initial_params(cfg)
    trainer = FedRoDTrainer(make_job(cfg, 0, 1, w, data, RecordDict()))
    trainer.run()
    # generic: one step of the balanced risk alone
    ref = make_model(cfg)
    ref.load_state_dict({k: torch.as_tensor(v) for k, v in w.items()})
    counts = torch.bincount(data.y_train, minlength=data.num_classes)
    logits, z = ref.forward_features(data.x_train)
    balanced_softmax_loss(logits, data.y_train, counts, 1.0).backward()
    for n, p in ref.named_parameters():
        torch.testing.assert_close(trainer.job.model.state_dict()[n], p.detach() - 0.1 * p.grad, rtol=1e-5, atol=1e-6)
    # personal: zero at first, so its gradient is that of CE(g + 0, y) w.r.t. (W, b) at the generic logits g
    probs = torch.softmax(logits.detach(), 1)
    err = (probs - F.one_hot(data.y_train, data.num_classes).float()) / data.num_train
    stored = trainer.job.state.get_arrays(STATE_FEDROD_HEAD)
    torch.testing.assert_close(torch.as_tensor(stored["weight"]), -0.1 * err.T @ z.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.as_tensor(stored["bias"]), -0.1 * err.sum(0), rtol=1e-5, atol=1e-6)


def test_the_personal_term_never_moves_the_generic_model():
    cfg = make_cfg(method="fedrod", batch_size=8, lr=0.1, momentum=0.5, weight_decay=1e-3)
    data, w = make_data(2), initial_params(cfg)
    trainer = FedRoDTrainer(make_job(cfg, 2, 1, w, data, RecordDict()))
    state = trainer.job.generator.get_state()
    trainer.fit()
    ref = make_model(cfg)
    ref.load_state_dict({k: torch.as_tensor(v) for k, v in w.items()})
    order = torch.Generator()
    order.set_state(state)
    counts = torch.bincount(data.y_train, minlength=data.num_classes)
    local_train(ref, data.x_train, data.y_train, OptimConfig(lr=0.1, epochs=1, batch_size=8, momentum=0.5,
                                                             weight_decay=1e-3), (), generator=order,
                criterion=lambda g, y: balanced_softmax_loss(g, y, counts, 1.0))
    for k, v in ref.state_dict().items():
        assert torch.equal(trainer.job.model.state_dict()[k], v), k


def test_personal_head_survives_rounds_is_not_sent_and_adds_to_the_generic_logits():
    cfg = make_cfg(method="fedrod", batch_size=8, lr=0.1)
    data, w = make_data(1), initial_params(cfg)
    state = RecordDict()
    first = FedRoDTrainer(make_job(cfg, 1, 1, w, data, state))
    reply = first.run()
    assert set(reply.params) == set(w)                  # the model's entries only: the personal head stays
    phi = first.job.state.get_arrays(STATE_FEDROD_HEAD)
    assert np.abs(phi["weight"]).sum() > 0
    second = FedRoDTrainer(make_job(cfg, 1, 2, w, data, state))
    for k, v in second.head.state_dict().items():      # round 2 starts from round 1's phi_k
        np.testing.assert_array_equal(v.numpy(), phi[k])
    model = second.job.model
    personal = second.personalized()
    assert isinstance(personal, GenericPlusPersonal)
    with torch.no_grad():
        logits, z = model.forward_features(data.x_test)
        torch.testing.assert_close(personal(data.x_test), logits + z @ torch.as_tensor(phi["weight"]).T
                                   + torch.as_tensor(phi["bias"]))


def test_gamma_zero_has_fedavgs_global_model(tmp_path):
    """gamma = 0 makes the generic risk the cross-entropy: the global model is FedAvg's bit for bit (the personal
    head's risk never reaches it); P-FL differs (generic + personal head)."""
    fedavg, fedavg_doc = job(tmp_path, "fedavg", method="fedavg")
    zero, zero_doc = job(tmp_path, "zero", method="fedrod", **{"fedrod.gamma": 0.0})
    rod, _ = job(tmp_path, "rod", method="fedrod")
    assert params_digest(zero) == params_digest(fedavg)
    assert column(zero_doc, "global_accuracy") == column(fedavg_doc, "global_accuracy")
    assert column(zero_doc, "local_accuracy") != column(fedavg_doc, "local_accuracy")
    assert params_digest(rod) != params_digest(fedavg)


def test_declaration_and_bounds():
    decl = get_method("fedrod")
    assert decl.strategy == FEDAVG_STRATEGY and decl.payload.state == (STATE_FEDROD_HEAD,)
    assert make_cfg(method="fedrod").to_dict()["fedrod.gamma"] == 1.0
    with pytest.raises(ConfigError, match=bound_error("fedrod.gamma", -0.5, ">= 0, finite")):
        make_cfg(method="fedrod", gamma=-0.5)
