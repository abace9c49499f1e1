"""FedUFO dynamic sampling without a local test split (issue 19): the default ranking is theta_t's accuracy on
each client's training data, reported at the start of the client's round; options that need a local test
split are refused at config time when there is none."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from client_app.trainers.base import ClientData
from client_app.trainers.fedufo.trainer import FedUFOTrainer
from flcore.config import ConfigError, RunConfig, resolve_run_config
from flcore.methods.fedufo import GLOBAL_TRAIN_ACCURACY, FedUFOConfig
from flcore.records import model_params
from models import build_model
from models.evaluation import evaluate
from strategies.methods.fedufo import FedUFOStrategy, dynamic_sample, worst_half
from tests.test_fedufo import FailingGrid, _cfg, _job


def test_default_metric_needs_no_split_and_split_metrics_are_refused_without_one():
    assert FedUFOConfig().sampling_metric == "global-model-train-accuracy"
    base = {"method": "fedufo", "local-test-fraction": 0.0}
    RunConfig.from_dict(resolve_run_config(base))                                  # the default works
    for metric in ("global-model-local-accuracy", "local-accuracy"):
        with pytest.raises(ConfigError, match=f"'fedufo.sampling-metric' = '{metric}'.*'local-test-fraction' is 0"):
            RunConfig.from_dict(resolve_run_config({**base, "fedufo.sampling-metric": metric}))
        RunConfig.from_dict(resolve_run_config({**base, "fedufo.sampling-metric": metric, "local-test-fraction": 0.25}))
        RunConfig.from_dict(resolve_run_config({**base, "fedufo.sampling-metric": metric,
                                                "fedufo.dynamic-sampling": False}))   # no ranking, no need
        RunConfig.from_dict(resolve_run_config({"method": "fedavg", "fedufo.sampling-metric": metric}))


def test_prior_reply_reports_the_global_models_training_accuracy_without_a_local_split():
    cfg = _cfg(**{"local-test-fraction": 0.0})
    theta = dict(model_params(build_model(cfg, (1, 8, 8), 10)))
    job = _job(cfg, 2, "train.prior", theta)
    empty = job.data.x_train[:0]
    job.data = ClientData(job.data.x_train, job.data.y_train, empty, job.data.y_train[:0], 10)  # no local split
    reference = build_model(cfg, (1, 8, 8), 10)
    reference.load_state_dict({k: torch.as_tensor(v) for k, v in theta.items()})
    _, want = evaluate(reference, job.data.x_train, job.data.y_train)
    reply = FedUFOTrainer(job).run()
    assert reply.metrics[GLOBAL_TRAIN_ACCURACY] == pytest.approx(want, abs=0)
    assert math.isnan(reply.metrics["local-accuracy"]) and math.isnan(reply.metrics["global-model-local-accuracy"])
    # the posterior of the same round does not measure it again (same theta_t)
    assert FedUFOTrainer(_job(cfg, 2, "train.posterior", theta, stage=1)).before_fit() == {}


def test_ranking_ignores_non_finite_values():
    acc = {0: float("nan"), 1: 0.5, 2: 0.2, 3: float("inf"), 4: 0.9}
    assert worst_half(range(5), acc, 4) == [2, 1]
    picks = [dynamic_sample(range(5), acc, 4, np.random.default_rng(s)) for s in range(10)]
    assert all({1, 2} <= set(p) and len(p) == 4 for p in picks)


def first_round_without_a_split():
    """Round 1 of FedUFO on 4 shard clients without local test splits, half of them sampled."""
    cfg = _cfg(**{"partition": "shards", "fraction-train": 0.5, "local-epochs": 1, "num-server-rounds": 2,
                  "local-test-fraction": 0.0})
    grid = FailingGrid(4)
    strategy = FedUFOStrategy(cfg)
    theta = dict(model_params(build_model(cfg, (1, 8, 8), 10)))
    return grid, strategy, strategy.train_round(grid, 1, theta)


def test_rounds_without_a_local_split_rank_by_training_accuracy():
    grid, strategy, out = first_round_without_a_split()
    assert len(out.updates) == 2
    for u in out.updates:
        assert math.isnan(u.metrics["local-accuracy"])                              # no split: NaN, no crash
    ranked = dict(strategy.client_accuracy)
    assert set(ranked) == set(out.sampled) and all(0.0 <= v <= 1.0 for v in ranked.values())
    info = strategy.round_metrics()
    assert info["mean-" + GLOBAL_TRAIN_ACCURACY] == pytest.approx(np.mean(list(ranked.values())))
    assert info["fedufo-ranked-clients"] == 0                                       # nothing known before round 1
    # round 2: the worse-ranked of the two known clients is in the group, the mean of the worst half is recorded
    out2 = strategy.train_round(grid, 2, out.params)
    worst = min(ranked, key=lambda c: (ranked[c], c))
    assert worst in out2.sampled
    info2 = strategy.round_metrics()
    assert info2["fedufo-ranked-clients"] == 2 and info2["fedufo-worst-half"] == 1
    assert info2["fedufo-worst-half-accuracy"] == pytest.approx(ranked[worst])


def test_dynamic_sampling_never_picks_an_evicted_client():
    """A client evicted after repeated timeouts (strategies/client_registry.py) is not sampled by FedUFO's own
    sampler either, until it answers a liveness probe; the group size counts the eligible clients."""
    grid, strategy, out = first_round_without_a_split()
    worst = min(strategy.client_accuracy, key=lambda c: (strategy.client_accuracy[c], c))
    strategy.registry.evicted[worst] = (0, 10**6)   # silent: evicted, its next probe far away
    assert strategy.group_size() == 2               # ceil(0.5 * 3 eligible) = 2
    for _ in range(20):
        assert worst not in strategy.sample(2)      # the worst-ranked client would be picked first otherwise
    assert worst not in strategy.train_round(grid, 2, out.params).sampled
