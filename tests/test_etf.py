"""Neural-collapse FL (seed 004): fixed simplex-ETF head, global memory vectors, FedETF strategy/trainer."""

from __future__ import annotations

import math
import re
import tomllib
from collections import OrderedDict

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from flwr.common.config import flatten_dict

from client_app.state import ClientState
from client_app.trainers.base import ClientData, Trainer, TrainJob
from client_app.trainers.fedetf import ETFTrainer, LastEpochClassMeans, add_memory, class_feature_means
from client_app.training import Step
from flcore.config import PROJECT_ROOT, ConfigError, RunConfig, resolve_run_config
from flcore.methods.fedetf import ACTIVE_KEY, MEANS_RECORD, MEMORY_RECORD, REPORT_KEY, FedETFConfig
from flcore.records import model_params, params_to_record, record_to_params
from models import build_model
from models.heads import ETFHead, simplex_etf
from strategies.base import ClientUpdate
from strategies.methods.fedetf import (FedETFStrategy, average_class_means, classifier_cosines, update_memory,
                               warmup_round)

C, D_IN = 4, 12


def make_cfg(**overrides) -> RunConfig:
    base = {"method": "fedetf", "model": "mlp", "lr": 0.1, "num-server-rounds": 10, "batch-size": 8}
    base.update(overrides)
    return RunConfig.from_dict(resolve_run_config(base))


def make_data(n_per_class: int = 6, classes=(0, 1, 2, 3), seed: int = 0) -> ClientData:
    g = torch.Generator().manual_seed(seed)
    y = torch.tensor([c for c in classes for _ in range(n_per_class)])
    x = torch.randn(len(y), D_IN, generator=g) + 2.0 * torch.nn.functional.one_hot(y, D_IN).float()
    return ClientData(x, y, x[:4], y[:4], num_classes=C)


def make_job(cfg: RunConfig, data: ClientData, config=None, records=None, cid: int = 0,
             server_round: int = 1, model=None) -> TrainJob:
    model = model if model is not None else build_model(cfg, (D_IN,), C)
    return TrainJob(cfg=cfg, cid=cid, server_round=server_round, model=model,
                    global_params={k: v.clone() for k, v in model.state_dict().items()}, data=data,
                    config=dict(config or {}), records=dict(records or {}),
                    state=ClientState(RecordDict(), cid), device=torch.device("cpu"),
                    generator=torch.Generator().manual_seed(cid))


# ============================================================================ the simplex ETF (Eq. 3)
@pytest.mark.parametrize("d,c,beta", [(64, 10, 1.0), (12, 4, 1.5), (3, 3, 0.5), (200, 2, 1.0)])
def test_etf_columns_unit_norm_equiangular_and_tight(d, c, beta):
    w = simplex_etf(d, c, seed=7, scale=beta).double()
    assert w.shape == (d, c)
    np.testing.assert_allclose(w.norm(dim=0).numpy(), beta, atol=1e-6)
    gram = (w.T @ w).numpy() / beta**2
    off = gram[~np.eye(c, dtype=bool)]
    np.testing.assert_allclose(off, -1.0 / (c - 1), atol=1e-6)       # pairwise cosine -1/(C-1)
    np.testing.assert_allclose(w.sum(dim=1).numpy(), 0.0, atol=1e-6)  # columns sum to zero
    eig = np.sort(np.linalg.eigvalsh(gram))                            # tight: C-1 equal eigenvalues
    np.testing.assert_allclose(eig[0], 0.0, atol=1e-6)
    np.testing.assert_allclose(eig[1:], c / (c - 1), atol=1e-6)


def test_etf_hand_cases():
    w2 = simplex_etf(5, 2, seed=1).double()
    np.testing.assert_allclose(w2[:, 0].numpy(), -w2[:, 1].numpy(), atol=1e-7)  # C=2: antipodal
    w3 = simplex_etf(3, 3, seed=1).double()
    cos = (w3.T @ w3).numpy()
    np.testing.assert_allclose(cos[0, 1], -0.5, atol=1e-6)                      # C=3: 120 degrees


def test_etf_seeded_identical_across_clients_and_differs_across_seeds():
    a, b = simplex_etf(64, 10, seed=3), simplex_etf(64, 10, seed=3)
    assert torch.equal(a, b)
    assert not torch.allclose(a, simplex_etf(64, 10, seed=4))
    cfg = make_cfg()
    m1, m2 = build_model(cfg, (D_IN,), C), build_model(cfg, (D_IN,), C)  # "server" and "client"
    assert isinstance(m1.head, ETFHead)
    assert torch.equal(m1.head.weight, m2.head.weight)
    assert torch.equal(m1.head.weight, simplex_etf(m1.feature_dim, C, seed=cfg.seed, scale=cfg.etf_scale))
    assert not any(n.startswith("head.") for n, _ in m1.named_parameters())  # a buffer, not a parameter
    assert "head.weight" in m1.state_dict()                                   # ... that travels with the model


def test_etf_scale_and_bad_shapes():
    cfg = make_cfg(**{"etf-scale": 1.5})
    w = build_model(cfg, (D_IN,), C).head.weight
    np.testing.assert_allclose(w.norm(dim=0).numpy(), 1.5, atol=1e-6)
    with pytest.raises(ValueError, match="feature_dim >= 10"):
        simplex_etf(5, 10, seed=0)
    with pytest.raises(ValueError, match="at least 2 classes"):
        simplex_etf(5, 1, seed=0)


def test_etf_head_logits_are_inner_products():
    head = ETFHead(6, 3, seed=0)
    h = torch.randn(5, 6)
    np.testing.assert_allclose(head(h).numpy(), (h @ head.weight).numpy(), atol=1e-6)


# ============================================================================ head is frozen in training
def _train_and_check_head(cfg: RunConfig, trainer_cls, config=None, records=None):
    data = make_data()
    job = make_job(cfg, data, config, records)
    before = {k: v.clone() for k, v in job.model.state_dict().items()}
    trainer_cls(job).run()
    after = job.model.state_dict()
    assert torch.equal(before["head.weight"], after["head.weight"])
    moved = [k for k in before if k != "head.weight" and not torch.equal(before[k], after[k])]
    assert moved, "the backbone should have been trained"
    return job


@pytest.mark.parametrize("method", ["fedavg", "fedetf", "fedgmv"])
def test_etf_head_never_changes_with_momentum_and_weight_decay(method):
    cfg = make_cfg(method=method, head="etf", momentum=0.9, **{"weight-decay": 5e-4, "local-epochs": 2})
    trainer = Trainer if method == "fedavg" else ETFTrainer
    _train_and_check_head(cfg, trainer)


def test_etf_head_never_changes_under_gmv_training():
    cfg = make_cfg(momentum=0.9)
    mu = np.random.default_rng(0).normal(size=(C, 200)).astype(np.float32)
    rec = params_to_record({"mu": mu, "valid": np.ones(C, bool)})
    _train_and_check_head(cfg, ETFTrainer, {ACTIVE_KEY: True, REPORT_KEY: True}, {MEMORY_RECORD: rec})


def test_averaging_keeps_the_head_exact_and_fedetf_pins_it():
    cfg = make_cfg()
    model = build_model(cfg, (D_IN,), C)
    ref = model_params(model)
    rng = np.random.default_rng(0)
    ups = []
    for k in range(3):
        p = OrderedDict((n, v + (0 if n == "head.weight" else rng.normal(size=v.shape).astype(v.dtype) * 0.01))
                        for n, v in ref.items())
        ups.append(ClientUpdate(k, p, 10 + k, {}, {}))
    from strategies.methods.fedavg import FedAvgStrategy
    assert np.array_equal(FedAvgStrategy(cfg).aggregate(1, ref, ups)["head.weight"], ref["head.weight"])
    ups[0].params["head.weight"] = ref["head.weight"] + 0.5  # a client that tampered with W*
    assert np.array_equal(FedETFStrategy(cfg).aggregate(1, ref, ups)["head.weight"], ref["head.weight"])


# ============================================================================ memory vectors: client side
def test_add_memory_values_mask_and_no_gradient():
    f = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]], requires_grad=True)
    y = torch.tensor([0, 1, 2])
    mu = torch.tensor([[10.0, 0.0], [0.0, 20.0], [5.0, 5.0]], requires_grad=True)
    valid = torch.tensor([True, True, False])
    h = add_memory(f, y, mu, valid, alpha=0.5)
    np.testing.assert_allclose(h.detach().numpy(), [[6.0, 0.0], [0.0, 11.0], [2.0, 2.0]])  # class 2: h = f
    h.sum().backward()
    assert mu.grad is None and torch.equal(f.grad, torch.ones_like(f))
    assert torch.equal(add_memory(f, y, mu, valid, alpha=0.0), f)
    with pytest.raises(ValueError, match="do not fit"):
        add_memory(f, y, mu[:, :1], valid, 0.5)


def test_class_feature_means_hand_example_and_absent_class():
    f = torch.tensor([[1.0, 2.0], [3.0, 4.0], [10.0, 0.0], [0.0, 0.0]])
    y = torch.tensor([0, 0, 2, 2])
    means, counts = class_feature_means(f, y, 3)
    np.testing.assert_allclose(means, [[2.0, 3.0], [0.0, 0.0], [5.0, 0.0]])
    assert counts.tolist() == [2, 0, 2]


def test_last_epoch_tracker_keeps_only_the_last_epoch():
    t = LastEpochClassMeans(2)
    y = torch.tensor([0, 1])
    for epoch, val in ((0, 100.0), (1, 1.0), (1, 3.0)):
        feats = torch.full((2, 3), val)
        t.loss(None, Step(torch.zeros(2, 1), y, torch.zeros(2, 2), feats, 0, epoch))
    means, counts = t.result()
    np.testing.assert_allclose(means, 2.0)
    assert counts.tolist() == [2, 2]


def test_before_warmup_h_equals_f():
    cfg = make_cfg()
    data = make_data()
    trainer = ETFTrainer(make_job(cfg, data, {ACTIVE_KEY: False, REPORT_KEY: False}))
    model = trainer.job.model
    logits, f = trainer.forward(model, data.x_train, data.y_train)
    ref_logits, ref_f = model.forward_features(data.x_train)
    assert torch.equal(logits, ref_logits) and torch.equal(f, ref_f)
    assert trainer.extra_records() == {}


def test_after_warmup_logits_use_memory_vectors():
    cfg = make_cfg(**{"fedetf.alpha": 1.0})
    data = make_data()
    mu = np.random.default_rng(1).normal(size=(C, 200)).astype(np.float32)
    valid = np.array([True, False, True, True])
    rec = params_to_record({"mu": mu, "valid": valid})
    trainer = ETFTrainer(make_job(cfg, data, {ACTIVE_KEY: True}, {MEMORY_RECORD: rec}))
    model = trainer.job.model
    logits, f = trainer.forward(model, data.x_train, data.y_train)
    y = data.y_train
    h = model.features(data.x_train) + torch.from_numpy(mu * valid[:, None])[y]
    torch.testing.assert_close(logits, h @ model.head.weight)
    # evaluation (no labels) is plain W*^T f
    torch.testing.assert_close(model(data.x_train), model.features(data.x_train) @ model.head.weight)


def test_gmv_active_without_memory_is_a_clear_error():
    cfg = make_cfg()
    with pytest.raises(ValueError, match="client 5: .*no 'etf-memory'"):
        ETFTrainer(make_job(cfg, make_data(), {ACTIVE_KEY: True}, cid=5))
    bad = params_to_record({"mu": np.zeros((C, 3), np.float32), "valid": np.ones(C, bool)})
    with pytest.raises(ValueError, match="client 5: memory vectors have shape"):
        ETFTrainer(make_job(cfg, make_data(), {ACTIVE_KEY: True}, {MEMORY_RECORD: bad}, cid=5))


@pytest.mark.parametrize("features", ["final", "train"])
def test_trainer_reports_class_means_of_backbone_features(features):
    cfg = make_cfg(**{"fedetf.gmv-features": features, "local-epochs": 2})
    data = make_data(classes=(0, 2))
    job = make_job(cfg, data, {REPORT_KEY: True})
    reply = ETFTrainer(job).run()
    rec = record_to_params(reply.records[MEANS_RECORD])
    assert rec["counts"].tolist() == [6, 0, 6, 0]
    assert rec["means"].shape == (C, job.model.feature_dim)
    np.testing.assert_allclose(rec["means"][[1, 3]], 0.0)
    if features == "final":  # exactly the class means of the returned model's features
        with torch.no_grad():
            expect, _ = class_feature_means(job.model.features(data.x_train), data.y_train, C)
        np.testing.assert_allclose(rec["means"], expect, rtol=1e-5, atol=1e-6)
    assert np.all(np.abs(rec["means"][[0, 2]]).sum(axis=1) > 0)


class _RecordingETFTrainer(ETFTrainer):
    """ETFTrainer that keeps every training forward's (epoch, f, y): the f_{i,k}^t of Alg. 1's minibatch loop."""

    def __init__(self, job):
        super().__init__(job)
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, model, x, y):
        logits, f = super().forward(model, x, y)
        self.seen.append((f.detach().clone(), y.clone()))
        return logits, f


def test_alg1_memory_vectors_by_hand_two_clients_and_a_missing_class():
    """Alg. 1, the mu_j^t line, end to end with the default keys: two clients train (E = 2, so the last epoch's
    f_{i,k}^t count), report the class means of their TRAINING-TIME features, and the server sets
    mu_j = (1/|S_t|) sum_k m_kj with m_kj = 0 for a class client k lacks. Client 0 holds classes {0, 1}, client 1
    {0, 2}, nobody class 3: mu_0 = (m_00 + m_10)/2, mu_1 = m_01/2, mu_2 = m_12/2, mu_3 = 0 (no memory, h = f)."""
    cfg = make_cfg(**{"local-epochs": 2, "num-server-rounds": 10, "fedetf.warmup-fraction": 0.3,
                      "momentum": 0.9})                                    # R_warm = 3: round 2 reports
    assert cfg.section(FedETFConfig).gmv_features == "train"
    s = FedETFStrategy(cfg)
    datas = [make_data(n_per_class=6, classes=(0, 1), seed=1), make_data(n_per_class=6, classes=(0, 2), seed=2)]
    model0 = build_model(cfg, (D_IN,), C)
    ref = model_params(model0)
    updates, hand = [], []
    for cid, data in enumerate(datas):
        model = build_model(cfg, (D_IN,), C)
        model.load_state_dict(model0.state_dict())
        trainer = _RecordingETFTrainer(make_job(cfg, data, s.client_config(2, cid), s.client_records(2, cid),
                                                cid=cid, server_round=2, model=model))
        reply = trainer.run()
        steps_per_epoch = -(-len(data.y_train) // cfg.batch_size)
        assert len(trainer.seen) == 2 * steps_per_epoch
        last = trainer.seen[steps_per_epoch:]                              # the last epoch's minibatches
        f = torch.cat([a for a, _ in last]).double()
        y = torch.cat([b for _, b in last])
        m = np.zeros((C, f.shape[1]))
        for c in y.unique().tolist():                                      # (1/|D_kc|) sum_{i in D_kc} f_i
            m[c] = f[y == c].mean(0).numpy()
        hand.append(m)
        rec = record_to_params(reply.records[MEANS_RECORD])
        np.testing.assert_allclose(rec["means"], m, rtol=1e-5, atol=1e-6)
        assert rec["counts"].tolist() == ([6, 6, 0, 0] if cid == 0 else [6, 0, 6, 0])
        # training-time features, not the returned model's: a no-grad pass of the final model differs
        with torch.no_grad():
            final, _ = class_feature_means(trainer.job.model.features(data.x_train), data.y_train, C)
        assert not np.allclose(final, m, atol=1e-4)
        updates.append(ClientUpdate(cid, model_params(trainer.job.model), len(data.y_train), {}, reply.records))
    s.aggregate(2, ref, updates)
    expect = np.stack([(hand[0][0] + hand[1][0]) / 2, hand[0][1] / 2, hand[1][2] / 2, np.zeros(hand[0].shape[1])])
    np.testing.assert_allclose(s.memory, expect, rtol=1e-5, atol=1e-6)
    assert s.memory_valid.tolist() == [True, True, True, False]
    # round 3 = R_warm: both clients get mu^2 and train on h = f + alpha mu_y (class 3 gets h = f)
    sent = record_to_params(s.client_records(3, 0)[MEMORY_RECORD])
    np.testing.assert_allclose(sent["mu"], expect.astype(np.float32), rtol=1e-6)
    assert s.client_config(3, 1)[ACTIVE_KEY]


# ============================================================================ memory vectors: server side
def test_average_class_means_skips_absent_classes():
    # 3 clients, 3 classes, d = 2. Class 2 held by nobody, class 1 only by client 2.
    means = np.array([[[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]],
                      [[3.0, 5.0], [0.0, 0.0], [0.0, 0.0]],
                      [[5.0, 0.0], [7.0, 7.0], [0.0, 0.0]]])
    counts = np.array([[2, 0, 0], [1, 0, 0], [1, 4, 0]])
    mu, present = average_class_means(means, counts, "clients")
    np.testing.assert_allclose(mu, [[3.0, 2.0], [7.0, 7.0], [0.0, 0.0]])  # (1+3+5)/3, (1+5+0)/3
    assert present.tolist() == [True, True, False]
    mu_s, _ = average_class_means(means, counts, "samples")
    np.testing.assert_allclose(mu_s[0], [(2 * 1 + 3 + 5) / 4, (2 * 1 + 5 + 0) / 4])  # pooled mean
    np.testing.assert_allclose(mu_s[1], [7.0, 7.0])
    # equal counts: both weightings agree
    eq = np.array([[3, 0, 0], [3, 0, 0], [3, 3, 0]])
    np.testing.assert_allclose(average_class_means(means, eq, "samples")[0],
                               average_class_means(means, eq, "clients")[0])


def test_gmv_divides_by_the_number_of_sampled_clients_by_default():
    """Alg. 1: mu_j^t = (1/|S_t|) sum_{k in S_t} (class-j mean of client k); a client without class j adds 0."""
    means = np.array([[[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]],
                      [[3.0, 5.0], [0.0, 0.0], [0.0, 0.0]],
                      [[5.0, 0.0], [7.0, 7.0], [0.0, 0.0]]])
    counts = np.array([[2, 0, 0], [1, 0, 0], [1, 4, 0]])
    assert FedETFConfig().gmv_weighting == "sampled"
    mu, present = average_class_means(means, counts)                       # the default: "sampled"
    np.testing.assert_allclose(mu, [[3.0, 2.0], [7.0 / 3, 7.0 / 3], [0.0, 0.0]])   # class 1: 7 / |S_t| = 7 / 3
    assert present.tolist() == [True, True, False]
    # a client's (garbage) row for a class it does not hold never enters the sum
    noisy = means.copy()
    noisy[0, 1] = [100.0, -100.0]
    np.testing.assert_allclose(average_class_means(noisy, counts, "sampled")[0], mu)
    with pytest.raises(ValueError, match="unknown GMV weighting"):
        average_class_means(means, counts, "median")


def test_update_memory_keeps_unseen_classes():
    mem, valid = update_memory(None, None, np.array([[1.0], [2.0], [0.0]]), np.array([True, True, False]))
    np.testing.assert_allclose(mem, [[1.0], [2.0], [0.0]])
    assert valid.tolist() == [True, True, False]
    mem, valid = update_memory(mem, valid, np.array([[9.0], [0.0], [4.0]]), np.array([True, False, True]))
    np.testing.assert_allclose(mem, [[9.0], [2.0], [4.0]])
    assert valid.tolist() == [True, True, True]
    # the paper's weighting replaces the memory: a class nobody holds this round has none (h = f for it)
    mem, valid = update_memory(mem, valid, np.array([[1.0], [0.0], [0.0]]), np.array([True, False, False]),
                               keep_unseen=False)
    np.testing.assert_allclose(mem, [[1.0], [0.0], [0.0]])
    assert valid.tolist() == [True, False, False]


def test_warmup_round_and_classifier_cosines():
    assert warmup_round(0.9, 1000) == 900
    assert warmup_round(0.5, 30) == 15
    assert warmup_round(0.0, 30) == 1
    assert warmup_round(1.0, 30) == 30
    cos = classifier_cosines(np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]), np.array([True, True, False]),
                             np.array([[2.0, 0.0], [0.0, -1.0], [1.0, 1.0]]))
    np.testing.assert_allclose(cos, [1.0, -1.0])


def _report(means: np.ndarray, counts) -> ArrayRecord:
    return params_to_record({"means": means.astype(np.float32), "counts": np.asarray(counts, np.int64)})


def test_strategy_memory_flow_state_and_bad_reports():
    cfg = make_cfg(**{"num-server-rounds": 10, "fedetf.warmup-fraction": 0.5,   # R_warm = 5
                      "fedetf.gmv-weighting": "clients"})                         # the memory keeps unseen classes
    s = FedETFStrategy(cfg)
    ref = model_params(build_model(cfg, (D_IN,), C))
    d = 200
    assert s.client_config(3, 0) == {ACTIVE_KEY: False, REPORT_KEY: False}
    assert s.client_config(4, 0) == {ACTIVE_KEY: False, REPORT_KEY: True}
    a = np.zeros((C, d))
    a[0], a[1] = 1.0, 3.0
    b = np.zeros((C, d))
    b[0], b[2] = 3.0, 5.0
    ups = [ClientUpdate(0, ref, 5, {}, {MEANS_RECORD: _report(a, [2, 3, 0, 0])}),
           ClientUpdate(1, ref, 5, {}, {MEANS_RECORD: _report(b, [2, 0, 3, 0])}),
           ClientUpdate(2, ref, 5, {}, {MEANS_RECORD: _report(np.full((C, d), np.nan), [1, 1, 1, 1])}),
           ClientUpdate(3, ref, 5, {}, {})]
    s.aggregate(4, ref, ups)
    assert s.memory is not None and s.memory_valid is not None
    np.testing.assert_allclose(s.memory[:, 0], [2.0, 3.0, 5.0, 0.0])
    assert s.memory_valid.tolist() == [True, True, True, False]
    m = s.round_metrics()
    assert m["gmv-reports"] == 2 and m["gmv-rejected"] == 2 and m["gmv-classes"] == 3 and m["gmv-active"] == 0
    assert -1.0 <= m["gmv-classifier-cos"] <= 1.0
    # round 5: memory goes out to every sampled client
    assert s.client_config(5, 7) == {ACTIVE_KEY: True, REPORT_KEY: True}
    sent = record_to_params(s.client_records(5, 7)[MEMORY_RECORD])
    np.testing.assert_allclose(sent["mu"][:, 0], [2.0, 3.0, 5.0, 0.0])
    assert sent["valid"].tolist() == [True, True, True, False]
    # checkpoint round trip
    s2 = FedETFStrategy(cfg)
    s2.load_state_dict(s.state_dict())
    np.testing.assert_array_equal(s2.memory, s.memory)
    np.testing.assert_array_equal(s2.memory_valid, s.memory_valid)
    assert s2.memory_round == 4 and s2.client_config(5, 0)[ACTIVE_KEY]
    # round 5: client 1 misses class 0 -> class 3 appears, class 1 keeps round 4's vector
    c = np.zeros((C, d))
    c[0], c[3] = 10.0, 4.0
    s.aggregate(5, ref, [ClientUpdate(0, ref, 5, {}, {MEANS_RECORD: _report(c, [1, 0, 0, 1])})])
    np.testing.assert_allclose(s.memory[:, 0], [10.0, 3.0, 5.0, 4.0])
    assert s.round_metrics()["gmv-active"] == 1


def _ups(ref, reports):
    return [ClientUpdate(i, ref, 5, {}, {MEANS_RECORD: _report(m, c)}) for i, (m, c) in enumerate(reports)]


def test_default_strategy_follows_alg1_memory_over_s_t_and_uniform_backbone_average():
    cfg = make_cfg(**{"num-server-rounds": 10, "fedetf.warmup-fraction": 0.3})   # R_warm = 3
    s = FedETFStrategy(cfg)
    assert (s.ecfg.gmv_weighting, s.ecfg.aggregation, s.warm_round) == ("sampled", "uniform", 3)
    ref = model_params(build_model(cfg, (D_IN,), C))
    d = ref["head.weight"].shape[0]
    x0 = OrderedDict((k, v + 1.0) for k, v in ref.items())
    x1 = OrderedDict((k, v + 4.0) for k, v in ref.items())
    new = s.aggregate(1, ref, [ClientUpdate(0, x0, 10, {}, {}), ClientUpdate(1, x1, 90, {}, {})])
    for k in ref:
        if k == "head.weight":                                   # W* pinned
            np.testing.assert_array_equal(new[k], ref[k])
        else:                                                    # (x0 + x1) / 2, not (10 x0 + 90 x1) / 100
            np.testing.assert_allclose(new[k], ref[k] + 2.5, rtol=1e-6, atol=1e-6)
    m = s.round_metrics()
    assert m == {"gmv-active": 0, "gmv-warm-round": 3, "fedetf-aggregation": "uniform", "gmv-classes": 0,
                 "gmv-norm": None}
    # round 2 (= R_warm - 1): 3 reports; class 0 held by all, class 1 by one, class 2 by two, class 3 by none
    a, b, c = (np.zeros((C, d)) for _ in range(3))
    a[0], a[1] = 3.0, 6.0
    b[0], b[2] = 6.0, 2.0
    c[0], c[2] = 0.0, 4.0
    s.aggregate(2, ref, _ups(ref, [(a, [1, 1, 0, 0]), (b, [1, 0, 1, 0]), (c, [1, 0, 1, 0])]))
    np.testing.assert_allclose(s.memory[:, 0], [3.0, 2.0, 2.0, 0.0])      # (3+6+0)/3, 6/3, (2+4)/3, -
    assert s.memory_valid.tolist() == [True, True, True, False]
    m = s.round_metrics()
    assert m["gmv-active"] == 0 and m["gmv-classes"] == 3 and m["gmv-reports"] == 3
    assert m["gmv-norm"] == pytest.approx(np.mean([3.0, 2.0, 2.0]) * math.sqrt(d))
    # round 3: GMV on; one client reports only class 3 -> the memory is replaced (Alg. 1 has no carry-over)
    assert s.client_config(3, 0)[ACTIVE_KEY]
    e = np.zeros((C, d))
    e[3] = 8.0
    s.aggregate(3, ref, _ups(ref, [(e, [0, 0, 0, 5])]))
    np.testing.assert_allclose(s.memory[:, 0], [0.0, 0.0, 0.0, 8.0])
    assert s.memory_valid.tolist() == [False, False, False, True]
    assert s.round_metrics()["gmv-active"] == 1 and s.round_metrics()["gmv-classes"] == 1
    # option: n_k-weighted backbone average
    w = FedETFStrategy(make_cfg(**{"fedetf.aggregation": "samples"}))
    new = w.aggregate(1, ref, [ClientUpdate(0, x0, 10, {}, {}), ClientUpdate(1, x1, 90, {}, {})])
    k = next(k for k in ref if k != "head.weight")
    np.testing.assert_allclose(new[k], ref[k] + 0.1 * 1.0 + 0.9 * 4.0, rtol=1e-6, atol=1e-6)


def test_config_defaults_match_pyproject_and_errors_name_the_key():
    with open(PROJECT_ROOT / "pyproject.toml", "rb") as fh:
        table = flatten_dict(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])
    defaults = FedETFConfig()
    for key in ("fedetf.alpha", "fedetf.warmup-fraction", "fedetf.gmv-weighting", "fedetf.gmv-features",
                "fedetf.aggregation"):
        assert table[key] == getattr(defaults, key.split(".")[1].replace("-", "_"))
    assert (defaults.alpha, defaults.warmup_fraction, defaults.gmv_weighting, defaults.aggregation,
            defaults.gmv_features) == (0.5, 0.9, "sampled", "uniform", "train")   # Alg. 1 (issue 40)
    for key, bad, allowed in (("fedetf.alpha", -1.0, ">= 0, finite"),
                              ("fedetf.warmup-fraction", 1.5, ">= 0, <= 1, finite"),
                              ("fedetf.gmv-weighting", "median", "one of sampled, clients, samples"),
                              ("fedetf.aggregation", "median", "one of uniform, samples"),
                              ("fedetf.gmv-features", "h", "one of final, train")):
        with pytest.raises(ConfigError, match=re.escape(f"run-config key '{key}' got {bad!r}; allowed: {allowed}")):
            FedETFConfig.parse({key: bad})
        with pytest.raises(ConfigError, match=re.escape(f"run-config key '{key}' got {bad!r}")):
            make_cfg(**{key: bad})
    parsed = FedETFConfig.parse({"fedetf.alpha": 1})
    assert isinstance(parsed.alpha, float) and math.isclose(parsed.alpha, 1.0)
    assert make_cfg(**{"fedetf.alpha": 1}).section(FedETFConfig) == parsed


# ============================================================================ ETF composes with any method
COMPOSE = ["fedavg", "fedprox", "scaffold", "moon", "fednova", "fedadam", "feddyn", "fedetf", "fedgmv"]


@pytest.mark.parametrize("method", COMPOSE)
def test_etf_head_composes_with_every_method(method):
    """Two in-process rounds (the strategy's own messages, trainers, validation and aggregation):
    W* is bitwise the seeded simplex ETF after every round while the backbone moves."""
    from flcore.registry import get_method, resolve
    from tests._baselines_util import CLASSES, initial_params, make_cfg as base_cfg, make_data as base_data
    from tests._baselines_util import register, run_round

    cfg = base_cfg(method=method, head="etf", momentum=0.5, **{"fedetf.warmup-fraction": 0.0,
                                                                "num-server-rounds": 2})
    strategy = resolve(get_method(method).strategy)(cfg)
    datas = {cid: base_data(cid) for cid in (0, 1)}
    states = {cid: RecordDict() for cid in datas}
    register(strategy, datas)
    params = initial_params(cfg)
    etf = simplex_etf(200, CLASSES, seed=cfg.seed, scale=cfg.etf_scale).numpy()
    assert np.array_equal(params["head.weight"], etf)
    for rnd in (1, 2):
        new, updates = run_round(cfg, strategy, rnd, params, datas, states, [0, 1])
        assert np.array_equal(new["head.weight"], etf), f"{method}: the ETF head moved in round {rnd}"
        assert any(not np.array_equal(new[k], params[k]) for k in params if k != "head.weight")
        if method in ("fedetf", "fedgmv"):  # R_warm = 1: means reported in round 1, used from round 2
            assert all(u.metrics["gmv-active"] == int(rnd == 2) for u in updates)
        params = new


# ============================================================================ end to end (Flower simulation)
@pytest.mark.slow
def test_fedetf_simulation_end_to_end(tmp_path):
    from experiments.simulate import simulate

    out = tmp_path / "run"
    doc = simulate({"method": "fedetf", "dataset": "digits", "partition": "classes", "classes-per-client": 2,
                    "samples-per-class": 30, "num-server-rounds": 4, "fedetf.warmup-fraction": 0.5,
                    "local-epochs": 2, "batch-size": 10, "lr": 0.02, "momentum": 0.9, "local-test-fraction": 0.0,
                    "federated-eval-every": 0, "out-dir": str(out), "seed": 3}, num_supernodes=10)
    rounds = doc["rounds"]
    strat = [r["strategy"] for r in rounds]
    assert [s["gmv-active"] for s in strat] == [0, 1, 1, 1]          # R_warm = round(0.5 * 4) = 2
    assert all(s["gmv-warm-round"] == 2 and s["fedetf-aggregation"] == "uniform" for s in strat)
    assert all(s["gmv-reports"] == r["num_updates"] for s, r in zip(strat, rounds))
    # every class is held by 2 of the 10 clients: each has a memory vector, 1/5 of its holders' mean feature
    assert all(s["gmv-classes"] == 10 and s["gmv-norm"] > 0 for s in strat)
    accs = [r["global_accuracy"] for r in rounds]
    assert accs[-1] > 0.7 and accs[-1] > accs[0]                      # learns (chance is 0.1)
    assert all(r["local_accuracy"] is None for r in rounds)           # no local test split
    final = torch.load(out / "final_model.pt")
    cfg = RunConfig.from_dict(resolve_run_config(doc["run_config"]))
    w = final["head.weight"]
    assert torch.equal(w, simplex_etf(w.shape[0], 10, seed=cfg.seed, scale=cfg.etf_scale))
    from flcore import safe_files

    ckpt = safe_files.load(out / "checkpoint.pt", "checkpoint")
    mem = np.asarray(ckpt["strategy"]["gmv"]["memory"])
    assert mem.shape == (10, w.shape[0]) and np.all(np.isfinite(mem))
    assert ckpt["strategy"]["gmv"]["round"] == 4
