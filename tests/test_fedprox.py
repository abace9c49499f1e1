"""FedProx (issue 3): the proximal term's value and gradient, mu plumbing, FedAvg aggregation.

FedProx's server is FedAvg's (paper Alg. 2 averages like FedAvg); mu travels in one channel only, the run
config ("fedprox.mu", parsed and bound-checked once), which the trainer reads."""

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from tests._baselines_util import initial_params, make_cfg, make_data, make_job, run_client
from client_app.trainers.base import Trainer
from client_app.trainers.fedprox import FedProxTrainer, ProximalTerm, proximal_penalty
from client_app.training import Step
from flcore.config import ConfigError, RunConfig
from flcore.methods.fedprox import FedProxConfig
from flcore.registry import FEDAVG_STRATEGY, get_method, resolve
from strategies.aggregation import weighted_average
from strategies.methods.fedavg import FedAvgStrategy


def test_penalty_value_by_hand():
    w = torch.tensor([1.0, 2.0])
    wg = torch.tensor([0.0, 4.0])
    # mu/2 * ((1-0)^2 + (2-4)^2) = 0.25 * 5
    assert proximal_penalty([(w, wg)], 0.5).item() == pytest.approx(1.25)


def test_gradient_includes_mu_times_distance_to_global():
    cfg = make_cfg(method="fedprox")
    data = make_data(0)
    job = make_job(cfg, 0, 1, initial_params(cfg), data, RecordDict())
    model = job.model
    with torch.no_grad():  # move away from the global model so w - w_g is non-zero
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    mu = 0.7

    def grads(with_prox: bool):
        model.zero_grad()
        logits, z = model.forward_features(data.x_train)
        loss = torch.nn.functional.cross_entropy(logits, data.y_train)
        if with_prox:
            term = ProximalTerm(job.global_params, mu)
            term.begin(model)
            loss = loss + term.loss(model, Step(data.x_train, data.y_train, logits, z, 0, 0))
        loss.backward()
        return {k: p.grad.clone() for k, p in model.named_parameters()}

    plain, prox = grads(False), grads(True)
    params = dict(model.named_parameters())
    for k in plain:
        expected = plain[k] + mu * (params[k].detach() - job.global_params[k])
        torch.testing.assert_close(prox[k], expected)


def test_mu_zero_is_fedavg_training_and_mu_pulls_towards_global():
    data = make_data(1)
    cfg = make_cfg(method="fedprox", local_epochs=3)
    params = initial_params(cfg)

    def train(trainer_cls, mu):
        job = make_job(make_cfg(method="fedprox", local_epochs=3, **{"fedprox.mu": mu}), 0, 1, params, data,
                       RecordDict())
        reply = trainer_cls(job).run()
        return reply.params

    base = train(Trainer, 0.0)
    zero = train(FedProxTrainer, 0.0)
    strong = train(FedProxTrainer, 5.0)
    for k in base:
        np.testing.assert_array_equal(base[k], zero[k])

    def dist(p):
        return np.sqrt(sum(np.sum((p[k] - params[k]) ** 2) for k in params))

    assert dist(strong) < 0.8 * dist(base)


def test_server_is_fedavg_and_trainer_uses_the_run_config_mu():
    decl = get_method("fedprox")
    assert decl.strategy == FEDAVG_STRATEGY and resolve(decl.strategy) is FedAvgStrategy
    assert decl.config is FedProxConfig
    cfg = make_cfg(method="fedprox", **{"fedprox.mu": 0.3})
    params = initial_params(cfg)
    content = FedAvgStrategy(cfg).train_content(1, 2, params)
    # one channel: the run config the server sends, no per-client copy of mu
    assert not any("mu" in key for key in content["config"])
    assert content["run_config"]["fedprox.mu"] == pytest.approx(0.3)
    received = RunConfig.from_dict(dict(content["run_config"]), complete=True)
    assert received.section(FedProxConfig).mu == pytest.approx(0.3)
    trainer, reply = run_client(cfg, FedAvgStrategy(cfg), 2, 1, params, make_data(2), RecordDict())
    [term] = trainer.terms()
    assert isinstance(term, ProximalTerm) and term.mu == pytest.approx(0.3)
    # the trained model is the one a trainer with mu = 0.3 produces, not mu = 0
    zero = make_cfg(method="fedprox", **{"fedprox.mu": 0.0})
    _, reply0 = run_client(zero, FedAvgStrategy(zero), 2, 1, params, make_data(2), RecordDict())
    assert any(not np.array_equal(np.asarray(reply["arrays"][k].numpy()), np.asarray(reply0["arrays"][k].numpy()))
               for k in params)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_mu_is_a_config_error(bad):
    with pytest.raises(ConfigError, match=r"run-config key 'fedprox\.mu' got .*; allowed: >= 0, finite"):
        make_cfg(method="fedprox", **{"fedprox.mu": bad})
    # a client parsing a run config with a bad mu refuses it too (no client-side fallback)
    values = {**make_cfg(method="fedprox").to_dict(), "fedprox.mu": bad}
    with pytest.raises(ConfigError, match=r"'fedprox\.mu' got"):
        RunConfig.from_dict(values, complete=True)


def test_aggregation_is_sample_weighted_average():
    cfg = make_cfg(method="fedprox")
    strategy = resolve(get_method("fedprox").strategy)(cfg)
    a = {"w": np.array([1.0, 2.0], np.float32)}
    b = {"w": np.array([3.0, 6.0], np.float32)}
    from strategies.base import ClientUpdate
    ups = [ClientUpdate(0, a, 1, {}, {}), ClientUpdate(1, b, 3, {}, {})]
    out = strategy.aggregate(1, a, ups)
    np.testing.assert_allclose(out["w"], [2.5, 5.0])
    np.testing.assert_allclose(out["w"], weighted_average([a, b], [1, 3])["w"])
