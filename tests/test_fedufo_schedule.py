"""FedUFO stage one (issue 19): the paper's order (model for the round's epochs, then D with the model fixed)
versus the per-step alternation, observed step by step on a real posterior phase."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from client_app.state import ClientState
from client_app.trainers.fedufo import loss_terms
from client_app.trainers.fedufo.trainer import FedUFOTrainer
from flcore.methods.fedufo import FedUFOConfig
from flcore.records import model_params
from models import build_model
from strategies.methods.fedufo import relay_records
from tests.test_fedufo import _cfg, _job


def _snapshot(module: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().flatten() for p in module.parameters()]).numpy().copy()


def _posterior_events(monkeypatch, **extra):
    """Run client 1's stage-one posterior after real priors of clients 0 and 2; return the trainer and the
    events in order: ("M", D params, model params) before each model step's loss, ("D", ...) before each
    D step."""
    cfg = _cfg(**extra)
    theta = dict(model_params(build_model(cfg, (1, 8, 8), 10)))
    states = {c: ClientState(RecordDict(), c) for c in (0, 1, 2)}
    priors = {c: FedUFOTrainer(_job(cfg, c, "train.prior", theta, state=states[c])).run() for c in (0, 1, 2)}
    relay = relay_records([0, 1, 2], {c: p.params for c, p in priors.items()}, {c: [1] * 10 for c in (0, 1, 2)})
    trainer = FedUFOTrainer(_job(cfg, 1, "train.posterior", theta, relay[1], states[1], stage=1))
    model, disc = trainer.job.model, trainer.disc
    backbone = [p for n, p in model.named_parameters() if not n.startswith("extras.")]
    events: list[tuple[str, np.ndarray, np.ndarray]] = []

    def record(kind: str) -> None:
        events.append((kind, _snapshot(disc), torch.cat([p.detach().flatten() for p in backbone]).numpy().copy()))

    uniform_loss, disc_step = loss_terms.UniformTerm.loss, loss_terms._DiscriminatorUpdates._step
    monkeypatch.setattr(loss_terms.UniformTerm, "loss", lambda self, m, step: (record("M"), uniform_loss(self, m, step))[1])
    monkeypatch.setattr(loss_terms._DiscriminatorUpdates, "_step",
                        lambda self, own, others: (record("D"), disc_step(self, own, others))[1])
    reply = trainer.run()
    return trainer, events, reply, theta


def test_paper_schedule_trains_the_model_for_the_round_then_the_discriminator(monkeypatch):
    """Sec. 3.4: 'we first freeze the parameter of the discriminator D and train the federated model ...
    Then parameters of the federated model are fixed and we train the discriminator'."""
    assert FedUFOConfig().disc_schedule == "paper"
    trainer, events, reply, theta = _posterior_events(monkeypatch, **{"fedufo.disc-epochs": 3})
    kinds = "".join(k for k, _, _ in events)
    steps_per_epoch = -(-48 // 16)                      # 48 samples, batch 16
    assert kinds == "M" * (2 * steps_per_epoch) + "D" * (3 * steps_per_epoch)   # E=2 model epochs, then 3 D epochs
    model_steps = [e for e in events if e[0] == "M"]
    disc_steps = [e for e in events if e[0] == "D"]
    # D frozen during all model steps: the D the server sent
    assert all(np.array_equal(e[1], model_steps[0][1]) for e in model_steps)
    assert np.array_equal(model_steps[0][1], np.concatenate([theta[k].ravel() for k in theta if k.startswith("extras.disc.")]))
    # the model fixed during all D steps: exactly the model that is sent back
    final_model = np.concatenate([reply.params[k].ravel() for k in reply.params if not k.startswith("extras.")])
    assert all(np.array_equal(e[2], final_model) for e in disc_steps)
    assert not np.array_equal(model_steps[0][2], final_model)                       # the model did train
    assert not np.array_equal(disc_steps[-1][1], disc_steps[0][1])                  # D did train
    assert reply.metrics["fedufo-disc-steps"] == 3 * steps_per_epoch


def test_alternating_schedule_steps_the_discriminator_after_every_model_step(monkeypatch):
    trainer, events, reply, _ = _posterior_events(monkeypatch, **{"fedufo.disc-schedule": "alternating"})
    kinds = "".join(k for k, _, _ in events)
    assert kinds == "MD" * 6                                                         # 2 epochs x 3 batches
    # D moves between model steps (each model step sees the D of the previous D step)
    model_disc = [e[1] for e in events if e[0] == "M"]
    assert not np.array_equal(model_disc[0], model_disc[-1])
    assert reply.metrics["fedufo-disc-steps"] == 6


def test_disc_schedule_is_validated():
    from flcore.schema import ConfigError

    with pytest.raises(ConfigError, match="fedufo.disc-schedule"):
        FedUFOConfig.parse({"fedufo.disc-schedule": "interleaved"})
