"""FedBABU (Oh et al., ICLR 2022; flcore/methods/pfl_basic.py): the head stays exactly at its initialisation
during federated training while the body learns and is averaged, P-FL fine-tunes the broadcast model (the
parts and epochs the keys say), and a trainable head with no fine-tuning is FedAvg's training bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from client_app.trainers.pfl_basic.fedbabu import FedBABUTrainer, part_parameters
from client_app.training import OptimConfig, local_train
from flcore.config import ConfigError
from flcore.registry import get_method, resolve
from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job, make_model, register, run_round
from tests._pfl_basic_util import column, job, params_digest

CFG = {"batch_size": 8, "lr": 0.1, "momentum": 0.5, "weight_decay": 1e-3, "local_epochs": 1}
HEAD = ("head.weight", "head.bias")


def test_part_parameters():
    model = make_model(make_cfg(method="fedbabu"))
    names = {id(p): n for n, p in model.named_parameters()}
    assert [names[id(p)] for p in part_parameters(model, "head")] == list(HEAD)
    assert [names[id(p)] for p in part_parameters(model, "body")] == [n for n in names.values() if n not in HEAD]
    assert len(part_parameters(model, "full")) == len(names)


def test_the_head_stays_at_its_init_and_the_body_is_averaged():
    cfg = make_cfg(method="fedbabu", **CFG)   # momentum and weight decay on: neither may touch the head
    datas = {cid: make_data(cid) for cid in range(3)}
    strategy = resolve(get_method("fedbabu").strategy)(cfg)
    register(strategy, datas)
    states = {cid: RecordDict() for cid in datas}
    init = initial_params(cfg)
    params = init
    for rnd in (1, 2):
        params, updates = run_round(cfg, strategy, rnd, params, datas, states, sorted(datas))
        for u in updates:
            for k in HEAD:
                np.testing.assert_array_equal(u.params[k], init[k])
    for k in HEAD:
        np.testing.assert_array_equal(params[k], init[k])
    assert not np.array_equal(params["backbone.1.weight"], init["backbone.1.weight"])


def fine_tuned_and_reference(cfg):
    """One round's fit, then the P-FL model; with a fresh copy of the received model and a generator at the
    state the fine-tuning started from, to redo the fine-tuning by hand."""
    received = initial_params(cfg)
    data = make_data(1)
    trainer = FedBABUTrainer(make_job(cfg, 1, 1, received, data, RecordDict()))
    trainer.fit()
    state = trainer.job.generator.get_state()
    tuned = trainer.personalized()
    ref = make_model(cfg)
    ref.load_state_dict({k: torch.as_tensor(v) for k, v in received.items()})
    order = torch.Generator()
    order.set_state(state)
    return received, data, tuned, order, ref


def test_p_fl_fine_tunes_the_broadcast_model():
    cfg = make_cfg(method="fedbabu", **CFG, **{"fedbabu.finetune-epochs": 2, "fedbabu.finetune-part": "head"})
    received, data, tuned, order, ref = fine_tuned_and_reference(cfg)
    # by hand: the received model, 2 epochs of SGD(lr 1e-3, momentum 0.9) on the head only, same batches
    local_train(ref, data.x_train, data.y_train, OptimConfig(lr=1e-3, epochs=2, batch_size=8, momentum=0.9), (),
                generator=order, params=part_parameters(ref, "head"))
    for k, v in tuned.state_dict().items():
        torch.testing.assert_close(v, ref.state_dict()[k], rtol=0, atol=0)
        if k in HEAD:
            assert not torch.equal(v, torch.as_tensor(received[k]))
        else:
            assert torch.equal(v, torch.as_tensor(received[k]))   # the body is the broadcast one
    none = FedBABUTrainer(make_job(make_cfg(method="fedbabu", **{"fedbabu.finetune-epochs": 0}), 1, 1, received,
                                   data, RecordDict()))
    for k, v in none.personalized().state_dict().items():
        assert torch.equal(v, torch.as_tensor(received[k]))


def test_finetune_max_steps_caps_the_fine_tuning_at_that_many_sgd_steps():
    """fedbabu.finetune-max-steps = 3: the first 3 steps of the same fine-tuning (same batches), no more."""
    cfg = make_cfg(method="fedbabu", **CFG, **{"fedbabu.finetune-epochs": 5, "fedbabu.finetune-max-steps": 3})
    received, data, tuned, order, ref = fine_tuned_and_reference(cfg)
    assert 5 * (len(data.y_train) // 8) > 3  # uncapped, 5 epochs would take more than 3 steps
    stats = local_train(ref, data.x_train, data.y_train,
                        OptimConfig(lr=1e-3, epochs=5, batch_size=8, momentum=0.9, max_steps=3), (),
                        generator=order, params=part_parameters(ref, "full"))
    assert stats.steps == 3
    for k, v in tuned.state_dict().items():
        torch.testing.assert_close(v, ref.state_dict()[k], rtol=0, atol=0)
    uncapped = make_cfg(method="fedbabu", **CFG, **{"fedbabu.finetune-epochs": 5})
    full = FedBABUTrainer(make_job(uncapped, 1, 1, received, data, RecordDict()))
    full.fit()
    assert not torch.equal(full.personalized().state_dict()["head.weight"], tuned.state_dict()["head.weight"])


def test_trainable_head_and_no_fine_tuning_is_fedavg(tmp_path):
    """update-part = full trains and averages the head too: FedAvg's parameters and G-FL bit for bit (P-FL then
    is the broadcast model's, FedBABU's evaluation without fine-tuning, not FedAvg's locally trained one)."""
    fedavg, fedavg_doc = job(tmp_path, "fedavg", method="fedavg")
    full, full_doc = job(tmp_path, "full", method="fedbabu", **{"fedbabu.update-part": "full",
                                                                "fedbabu.finetune-epochs": 0})
    babu, babu_doc = job(tmp_path, "babu", method="fedbabu")
    assert params_digest(full) == params_digest(fedavg)
    assert column(full_doc, "global_accuracy") == column(fedavg_doc, "global_accuracy")
    assert column(full_doc, "global_loss") == column(fedavg_doc, "global_loss")
    # no fine-tuning: the P-FL figure is the received model's (round 1: the initial model on the local tests)
    assert params_digest(babu) != params_digest(fedavg)
    assert column(babu_doc, "local_accuracy") != column(full_doc, "local_accuracy")


def test_declaration_and_bounds():
    values = make_cfg(method="fedbabu").to_dict()
    assert (values["fedbabu.update-part"], values["fedbabu.finetune-epochs"], values["fedbabu.finetune-part"],
            values["fedbabu.finetune-lr"], values["fedbabu.finetune-momentum"]) == ("body", 5, "full", 1e-3, 0.9)
    with pytest.raises(ConfigError, match=bound_error("fedbabu.finetune-epochs", -1, ">= 0")):
        make_cfg(method="fedbabu", **{"fedbabu.finetune-epochs": -1})
    with pytest.raises(ConfigError, match=bound_error("fedbabu.update-part", "head", "one of body, full")):
        make_cfg(method="fedbabu", **{"fedbabu.update-part": "head"})
    with pytest.raises(ConfigError, match=bound_error("fedbabu.finetune-lr", 0.0, "> 0, finite")):
        make_cfg(method="fedbabu", **{"fedbabu.finetune-lr": 0.0})
