"""fedrane-code's training recipe (issue 40): the common keys its MethodDecl.recipe sets (recorded in the run
config), drop_last batches, one optimizer per client kept across rounds (momentum buffers in the client state),
StepLR stepped once per local training (its counter in the client state), the authors' flattened CNNModel."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from client_app.state import ClientState
from client_app.trainers.base import ClientData, TrainJob
from client_app.trainers.fedrane import LRATrainer, step_lr
from client_app.training import minibatches
from flcore.config import RunConfig, resolve_run_config
from flcore.methods.fedrane import STATE_OPTIMIZER, STATE_SCHEDULE
from models import build_model

RECIPE = {"lr": 0.1, "momentum": 0.9, "weight-decay": 1e-5, "local-epochs": 10, "batch-size": 128}


def cfg_of(method: str, **over) -> RunConfig:
    return RunConfig.from_dict(resolve_run_config({"method": method, "dataset": "digits", **over}))


def data(n: int = 40, seed: int = 0) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    x = torch.randn(n, 64, generator=g) * 0.3 + (y.float() - 1).view(-1, 1)
    return ClientData(x, y, x[:0], y[:0], 10)


def train(c: RunConfig, model, state: ClientState, server_round: int = 1):
    """One local training of ``model`` with the given client state (the generator seeded as the ClientApp's)."""
    job = TrainJob(c, 0, server_round, model, {k: v.clone() for k, v in model.state_dict().items()}, data(), {},
                   {}, state, torch.device("cpu"), torch.Generator().manual_seed(server_round))
    return LRATrainer(job).run()


def test_a_fedrane_code_run_with_nothing_else_set_records_the_authors_recipe(tmp_path):
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    values = resolve_run_config({"method": "fedrane-code", "dataset": "digits", "num-server-rounds": 1,
                                 "max-local-steps": 2, "checkpoint": False, "out-dir": str(tmp_path / "run")})
    assert {k: values[k] for k in RECIPE} == RECIPE
    run_federation(FakeGrid(2), RunConfig.from_dict(values))
    recorded = json.loads((tmp_path / "run" / "results.json").read_text())["run_config"]
    assert {k: recorded[k] for k in RECIPE} == RECIPE
    assert recorded["fedrane-code.persistent-optimizer"] is True and recorded["fedrane-code.drop-last"] is True
    assert recorded["fedrane-code.lr-step-epochs"] == 150
    # the user still wins over the recipe; the paper variant has no recipe
    assert resolve_run_config({"method": "fedrane-code", "dataset": "digits", "lr": 0.5})["lr"] == 0.5
    assert resolve_run_config({"method": "fedrane", "dataset": "digits"})["lr"] != 0.1 or \
        resolve_run_config({"method": "fedrane", "dataset": "digits"})["local-epochs"] != 10


def test_round_two_continues_round_ones_momentum_buffer():
    # torch SGD: buf <- m buf + (g + wd w); a fresh optimizer starts buf = g + wd w. So with the buffer kept,
    # round 2's first step has buf_2 = m buf_1 + (g + wd w), and (g + wd w) is a fresh optimizer's first buffer
    c = cfg_of("fedrane-code", **{"max-local-steps": 1, "batch-size": 16})   # 40 rows: B = 128 drops them all
    assert (c.momentum, c.weight_decay) == (0.9, 1e-5)
    kept = ClientState(RecordDict(), 0)
    model = build_model(c, (64,), 10)
    train(c, model, kept, 1)
    buf1 = kept.get_arrays(STATE_OPTIMIZER)
    assert buf1 and all(np.any(v != 0) for v in buf1.values())
    start = {k: v.clone() for k, v in model.state_dict().items()}
    train(c, model, kept, 2)
    buf2 = kept.get_arrays(STATE_OPTIMIZER)
    fresh_model = build_model(c, (64,), 10)
    fresh_model.load_state_dict(start)
    fresh = ClientState(RecordDict(), 0)
    fresh.put_config(STATE_SCHEDULE, {"trainings": 1})        # the same lr as the kept client's 2nd training
    train(c, fresh_model, fresh, 2)
    grad = fresh.get_arrays(STATE_OPTIMIZER)
    assert set(buf2) == set(buf1) == set(grad)
    for name in buf1:
        np.testing.assert_allclose(buf2[name], 0.9 * buf1[name] + grad[name], rtol=1e-5, atol=1e-7)
    # and the step the kept client took is lr times that buffer
    after = dict(model.named_parameters())
    for name in buf2:
        np.testing.assert_allclose(after[name].detach().numpy(), start[name].numpy() - 0.1 * buf2[name],
                                   rtol=1e-5, atol=1e-6)
    # without persistent-optimizer nothing is kept
    off = ClientState(RecordDict(), 0)
    plain = cfg_of("fedrane-code", **{"max-local-steps": 1, "batch-size": 16,
                                      "fedrane-code.persistent-optimizer": False, "fedrane-code.lr-step-epochs": 0})
    train(plain, build_model(plain, (64,), 10), off)
    assert off.keys() == []


def test_steplr_is_stepped_once_per_local_training_of_the_client():
    assert step_lr(0.1, 0, 1500, 0.1) == 0.1 and step_lr(0.1, 1499, 1500, 0.1) == 0.1
    assert step_lr(0.1, 1500, 1500, 0.1) == pytest.approx(0.01) and step_lr(0.1, 3000, 1500, 0.1) == \
        pytest.approx(0.001)
    assert step_lr(0.3, 10 ** 6, 0, 0.1) == 0.3                     # no schedule
    c = cfg_of("fedrane-code", **{"max-local-steps": 1, "local-epochs": 1, "fedrane-code.lr-step-epochs": 2})
    state = ClientState(RecordDict(), 0)
    model = build_model(c, (64,), 10)
    lrs = []
    for rnd in range(1, 6):             # step_size = 2 x 1 epoch: lr 0.1, 0.1, 0.01, 0.01, 0.001
        job = TrainJob(c, 0, rnd, model, {k: v.clone() for k, v in model.state_dict().items()}, data(), {}, {},
                       state, torch.device("cpu"), torch.Generator().manual_seed(rnd))
        trainer = LRATrainer(job)
        lrs.append(trainer.optim_config().lr)
        trainer.run()
        assert state.get_config(STATE_SCHEDULE) == {"trainings": rnd}
    np.testing.assert_allclose(lrs, [0.1, 0.1, 0.01, 0.01, 0.001], rtol=1e-12)
    # fedrane-code's own schedule: StepLR(150 E) with E = 10 local epochs
    code = cfg_of("fedrane-code")
    job = TrainJob(code, 0, 1, build_model(code, (64,), 10), {}, data(), {}, {}, ClientState(RecordDict(), 0), torch.device("cpu"),
                   torch.Generator())
    job.state.put_config(STATE_SCHEDULE, {"trainings": 1500})
    assert LRATrainer(job).optim_config().lr == pytest.approx(0.01)
    job.state.put_config(STATE_SCHEDULE, {"trainings": 1499})
    assert LRATrainer(job).optim_config().lr == pytest.approx(0.1)


def test_drop_last_batches_are_all_full(caplog):
    x, y = torch.arange(23.0).view(-1, 1), torch.arange(23)
    full = [len(b[1]) for b in minibatches(x, y, 5, torch.Generator().manual_seed(0), drop_last=True)]
    assert full == [5, 5, 5, 5]
    assert [len(b[1]) for b in minibatches(x, y, 5, torch.Generator().manual_seed(0))] == [5, 5, 5, 5, 3]
    c = cfg_of("fedrane-code", **{"local-epochs": 3, "batch-size": 16})
    reply = train(c, build_model(c, (64,), 10), ClientState(RecordDict(), 0))
    assert reply.metrics["local-steps"] == 3 * (40 // 16)           # 2 full batches of 16 per epoch, not 3
    recipe = cfg_of("fedrane-code")                                 # B = 128 > 40 rows: no step, and it says so
    with caplog.at_level("WARNING"):
        reply = train(recipe, build_model(recipe, (64,), 10), ClientState(RecordDict(), 0))
    assert reply.metrics["local-steps"] == 0
    assert "40 training rows < batch-size 128 with fedrane-code.drop-last" in caplog.text


def test_flat_features_are_the_authors_cnnmodel():
    c = cfg_of("fedrane-code", model="convnet")
    model = build_model(c, (1, 28, 28), 10)
    assert model.feature_dim == 32 * 7 * 7 == 1568
    convs = [m for m in model.backbone.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(m.in_channels, m.out_channels, m.kernel_size, m.padding) for m in convs] == \
        [(1, 16, (5, 5), (2, 2)), (16, 32, (5, 5), (2, 2))]
    assert not any(isinstance(m, torch.nn.Linear) for m in model.backbone.modules())   # no embedding layer
    z = model.features(torch.randn(3, 1, 28, 28))
    assert z.shape == (3, 1568) and torch.allclose(z.norm(dim=1), torch.ones(3))     # hypersphere: unit norm
    assert model.neck.layers[0].heads[0].w.in_features == 1568
    ours = build_model(cfg_of("fedrane", model="convnet"), (1, 28, 28), 10)
    assert ours.feature_dim == 64                                    # the paper's ConvNet: 64-d embedding


def test_an_idle_client_is_left_out_of_the_nash_solve_with_gne_drop_idle():
    from collections import OrderedDict

    from strategies.base import ClientUpdate
    from strategies.methods.fedrane.strategy import GNEStrategy

    def params(v):
        return OrderedDict([("w", np.asarray(v, dtype=np.float32))])

    theta = np.array([1.0, 2.0, 3.0])
    moved = [ClientUpdate(0, params(theta + [0.5, -1.0, 0.25]), 10, {}, {}),
             ClientUpdate(1, params(theta + [-0.2, 0.3, 0.9]), 30, {}, {})]
    idle = ClientUpdate(2, params(theta), 60, {}, {})               # no local step: its delta is exactly zero
    code = GNEStrategy(cfg_of("fedrane-code"))
    alone = GNEStrategy(cfg_of("fedrane-code"))
    with_idle = code.aggregate(1, params(theta), moved + [idle])
    without = alone.aggregate(1, params(theta), moved)
    np.testing.assert_array_equal(with_idle["w"], without["w"])    # as if the idle client had not replied
    assert code.round_metrics()["gne-cids"] == [0, 1]
    assert code.round_metrics()["gne-status"] == "converged"
    paper = GNEStrategy(cfg_of("fedrane"))                           # fedrane: a zero update joins (degenerate)
    paper.aggregate(1, params(theta), moved + [idle])
    assert paper.round_metrics()["gne-status"] == "degenerate"
    nobody = GNEStrategy(cfg_of("fedrane-code"))
    np.testing.assert_array_equal(nobody.aggregate(1, params(theta), [idle])["w"], params(theta)["w"])


def test_the_kept_optimizer_and_schedule_are_persisted_client_state(tmp_path):
    """Through the real ClientApp: with client-state-dir the momentum buffers and the StepLR counter are written
    per client and round, as SCAFFOLD's c_i (client_app/state.py)."""
    from flcore import safe_files
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    values = resolve_run_config({"method": "fedrane-code", "dataset": "digits", "num-server-rounds": 2,
                                 "batch-size": 16, "max-local-steps": 1, "fraction-train": 1.0, "checkpoint": False,
                                 "client-state-dir": str(tmp_path / "state"), "out-dir": str(tmp_path / "run")})
    run_federation(FakeGrid(2), RunConfig.from_dict(values))
    last = sorted((tmp_path / "state").glob("run-*/client-*/r000002-*.pt"))
    assert len(last) == 2                                            # both clients, after round 2
    for path in last:
        entries = safe_files.load(path, "client-state")["entries"]
        kind, buffers = entries[STATE_OPTIMIZER]
        assert kind == "arrays" and buffers and all(np.any(np.asarray(v) != 0) for v in buffers.values())
        assert entries[STATE_SCHEDULE] == ("config", {"trainings": 2})
