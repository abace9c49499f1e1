"""FedRANE: the GNE strategy's aggregation (hooks called directly), the LRA trainer, and a short simulation."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest
import torch

from client_app.state import ClientState
from client_app.trainers.base import ClientData, TrainJob, Trainer
from client_app.trainers.fedrane import LRATrainer
from flcore.config import ConfigError, RunConfig, resolve_run_config
from flcore.records import model_params
from models import build_model
from strategies.aggregation import weighted_average
from strategies.base import ClientUpdate
from flcore.methods.fedrane import FedRANEConfig
from strategies.methods.fedrane.strategy import GNEStrategy, step_coefficients
from tests._baselines_util import bound_error, run_config_keys


def cfg(**over) -> RunConfig:
    base = {"method": "fedrane", "dataset": "digits", "model": "convnet", "batch-size": 16, "lr": 0.1}
    return RunConfig.from_dict(resolve_run_config({**base, **run_config_keys("fedrane", over)}))


def params(vec: np.ndarray) -> "OrderedDict[str, np.ndarray]":
    """A two-tensor 'model' holding the vector (float32) plus an integer buffer."""
    v = np.asarray(vec, dtype=np.float32)
    return OrderedDict([("a", v[:2].copy()), ("b", v[2:].reshape(1, -1).copy()), ("n", np.array(5, np.int64))])


def updates(theta: np.ndarray, deltas: list[np.ndarray], sizes: list[int]) -> list[ClientUpdate]:
    return [ClientUpdate(cid, params(theta + d), n, {}, {}) for cid, (d, n) in enumerate(zip(deltas, sizes))]


def flat(p) -> np.ndarray:
    return np.concatenate([p["a"].ravel(), p["b"].ravel()]).astype(np.float64)


THETA = np.array([1.0, 2.0, 3.0, 4.0])


@pytest.mark.parametrize("solver", ["cvxpy", "newton"])
def test_identical_deltas_update_along_common_direction(solver):
    d = np.array([0.5, -1.0, 0.25, 0.0])
    strat = GNEStrategy(cfg(gne_solver=solver))
    new = strat.aggregate(1, params(THETA), updates(THETA, [d, d, d], [10, 30, 60]))
    np.testing.assert_allclose(flat(new), THETA + d, rtol=1e-6)          # normalised Nash step: exactly d
    m = strat.round_metrics()
    np.testing.assert_allclose(m["gne-weights"], [1 / 3] * 3, rtol=1e-4)  # equal weights despite sizes
    assert m["gne-status"] == "converged" and m["gne-residual"] < 1e-3
    assert m["gne-cos-clients-min"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("solver", ["cvxpy", "newton"])
def test_orthogonal_equal_norm_deltas_get_equal_weights(solver):
    d1, d2 = np.array([2.0, 0, 0, 0]), np.array([0, 0, 2.0, 0])
    strat = GNEStrategy(cfg(gne_solver=solver))
    new = strat.aggregate(1, params(THETA), updates(THETA, [d1, d2], [90, 10]))   # FedAvg would use 0.9/0.1
    np.testing.assert_allclose(flat(new), THETA + 0.5 * (d1 + d2), rtol=1e-5)
    m = strat.round_metrics()
    np.testing.assert_allclose(m["gne-p"], [0.5, 0.5], rtol=1e-4)        # p_k = 1/||Delta_k||
    assert m["gne-cids"] == [0, 1] and m["gne-iterations"] >= 1
    # the spread results.json records: equal weights (ratio 1), 0.4 of the mass moved away from FedAvg's 0.9/0.1
    assert m["gne-weight-ratio"] == pytest.approx(1.0, rel=1e-4)
    assert m["gne-tv-from-fedavg"] == pytest.approx(0.4, rel=1e-4)
    # normalized step sqrt(2) vs FedAvg's ||0.9 d1 + 0.1 d2|| = 2 sqrt(0.82)
    assert m["gne-step-norm-ratio"] == pytest.approx(math.sqrt(2) / (2 * math.sqrt(0.82)), rel=1e-4)
    assert np.asarray(m["gne-p"]) @ np.asarray(m["gne-p"]) * 4 == pytest.approx(2.0, rel=1e-4)  # p^T M p = K


def test_scales_fedavg_norm_and_server_lr():
    rng = np.random.default_rng(0)
    deltas = [rng.normal(size=4) * s for s in (0.5, 1.0, 2.0)]
    sizes = [10, 20, 70]
    ups = updates(THETA, deltas, sizes)
    f = np.array(sizes) / 100
    fedavg_step = sum(fk * d for fk, d in zip(f, deltas))

    s_norm = GNEStrategy(cfg(gne_solver="newton", gne_scale="fedavg-norm"))
    step = flat(s_norm.aggregate(1, params(THETA), ups)) - THETA
    assert np.linalg.norm(step) == pytest.approx(np.linalg.norm(fedavg_step), rel=1e-5)
    p = np.array(s_norm.round_metrics()["gne-p"])
    nash_dir = sum(pk * d for pk, d in zip(p, deltas))
    np.testing.assert_allclose(step / np.linalg.norm(step), nash_dir / np.linalg.norm(nash_dir), atol=1e-5)

    s_lr = GNEStrategy(cfg(gne_solver="newton", gne_scale="server-lr", gne_server_lr=0.5))
    step = flat(s_lr.aggregate(1, params(THETA), ups)) - THETA
    assert np.linalg.norm(step) == pytest.approx(0.5 * math.sqrt(3), rel=1e-5)   # ||G p|| = sqrt(K)


def test_step_coefficients_values():
    m = np.diag([4.0, 1.0])
    p = np.array([0.5, 1.0])  # the Nash solution of M
    np.testing.assert_allclose(step_coefficients(m, p, np.array([0.5, 0.5]), "normalized"), [1 / 3, 2 / 3])
    np.testing.assert_allclose(step_coefficients(m, p, np.array([0.5, 0.5]), "server-lr", 2.0), [1.0, 2.0])
    # ||G f||^2 = 0.25*4 + 0.25*1 = 1.25, ||G p||^2 = 2  ->  c = p * sqrt(1.25/2)
    np.testing.assert_allclose(step_coefficients(m, p, np.array([0.5, 0.5]), "fedavg-norm"), p * math.sqrt(0.625))


def test_degenerate_round_falls_back_to_weighted_average(caplog):
    d = np.array([1.0, 0.0, -1.0, 0.5])
    ups = updates(THETA, [d, -d, np.array([0, 1.0, 0, 0])], [10, 20, 30])
    strat = GNEStrategy(cfg())
    with caplog.at_level("WARNING", logger="noniid_fl"):
        new = strat.aggregate(3, params(THETA), ups)
    expect = weighted_average([u.params for u in ups], [10, 20, 30])
    np.testing.assert_allclose(flat(new), flat(expect), rtol=1e-6)
    m = strat.round_metrics()
    assert m["gne-status"] == "degenerate" and "vanishes" in m["gne-fallback"]
    assert m["gne-tv-from-fedavg"] == 0 and m["gne-step-norm-ratio"] == 1 and m["gne-weight-ratio"] == pytest.approx(3)
    assert "falling back" in caplog.text


def test_solver_failure_never_fails_the_round(monkeypatch):
    import cvxpy as cp

    def boom(self, *a, **k):
        raise cp.SolverError("simulated failure")

    monkeypatch.setattr(cp.Problem, "solve", boom)
    rng = np.random.default_rng(1)
    deltas = [np.ones(4) + 0.3 * rng.normal(size=4) for _ in range(3)]   # (M f)_k > 0 at the start
    ups = updates(THETA, deltas, [10, 30, 60])
    strat = GNEStrategy(cfg(gne_solver="cvxpy", gne_warm_start=False))
    new = strat.aggregate(1, params(THETA), ups)
    m = strat.round_metrics()
    assert m["gne-status"] == "solver-failed" and "simulated failure" in m["gne-message"]
    # the last good weights are the start (sample fractions): the normalised step is FedAvg's
    np.testing.assert_allclose(flat(new), flat(weighted_average([u.params for u in ups], [10, 30, 60])), rtol=1e-6)


def test_warm_start_state_roundtrip():
    rng = np.random.default_rng(2)
    deltas = [rng.normal(size=4) for _ in range(3)]
    strat = GNEStrategy(cfg(gne_solver="newton"))
    strat.aggregate(1, params(THETA), updates(THETA, deltas, [10, 30, 60]))
    w = strat.round_metrics()["gne-weights"]
    state = strat.state_dict()
    assert state["gne_warm"] == {0: pytest.approx(w[0]), 1: pytest.approx(w[1]), 2: pytest.approx(w[2])}
    other = GNEStrategy(cfg(gne_solver="newton"))
    other.load_state_dict(state)
    assert other.warm == strat.warm
    # next round: known clients start from last weights, a new one from its sample fraction, renormalised
    start = other.start_point([0, 2, 7], np.array([0.2, 0.3, 0.5]))
    raw = np.array([w[0], w[2], 0.5])
    np.testing.assert_allclose(start, raw / raw.sum())
    cold = GNEStrategy(cfg(gne_warm_start=False))
    cold.load_state_dict(state)
    np.testing.assert_allclose(cold.start_point([0, 2], np.array([0.4, 0.6])), [0.4, 0.6])


def test_gne_config_errors_name_the_key():
    for key, value, allowed in (("fedrane.gne-solver", "lbfgs", "one of cvxpy, newton"),
                                ("fedrane.gne-scale", "unit", "one of normalized, fedavg-norm, server-lr"),
                                ("fedrane.gne-server-lr", 0.0, "> 0, finite"), ("fedrane.gne-max-iter", 0, ">= 1")):
        with pytest.raises(ConfigError, match=bound_error(key, value, allowed)):
            FedRANEConfig.parse({key: value})


# ------------------------------------------------------------------------------------------ client side
def job(c: RunConfig, model, seed: int = 0, n: int = 48) -> TrainJob:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    x = torch.randn(n, 1, 8, 8, generator=g) * 0.3 + (y.float() - 1).view(-1, 1, 1, 1)
    data = ClientData(x[: n * 3 // 4], y[: n * 3 // 4], x[n * 3 // 4:], y[n * 3 // 4:], 10)
    glob = {k: v.clone() for k, v in model.state_dict().items()}
    from flwr.app import RecordDict
    return TrainJob(c, 0, 1, model, glob, data, {}, {}, ClientState(RecordDict(), 0), torch.device("cpu"),
                    torch.Generator().manual_seed(seed))


def test_lra_trainer_learns_and_reports_cd_loss():
    c = cfg(method="fedrane-repaired", local_epochs=6)    # the repaired variant (the literal one: below)
    model = build_model(c, (1, 8, 8), 10)
    before = model_params(model)
    reply = LRATrainer(job(c, model)).run()
    m = reply.metrics
    assert m["local-steps"] == 6 * 3
    assert m["lra-cd-loss"] > 0 and math.isfinite(m["lra-cd-loss"])
    assert m["local-accuracy"] > m["global-model-local-accuracy"]      # trained model beats the received one
    changed = [k for k in before if not np.array_equal(before[k], reply.params[k])]
    assert any(k.startswith("neck.") for k in changed) and any(k.startswith("backbone.") for k in changed)


def test_the_literal_fedrane_trains_on_the_complete_graph_and_evaluates_without_it():
    """The paper's defaults: every A_ij > 0 an edge (density 1), messages without residual, the MLP predictor;
    evaluation on F(x) (lra-eval = identity: no evaluation graph, so no P-FL graph density)."""
    c = cfg(local_epochs=2)
    model = build_model(c, (1, 8, 8), 10)
    before = model_params(model)
    reply = LRATrainer(job(c, model)).run()
    m = reply.metrics
    assert m["lra-graph-density"] == 1.0 and "lra-eval-graph-density" not in m
    assert m["lra-cd-loss"] > 0 and math.isfinite(m["lra-cd-loss"])
    changed = {k.split(".")[0] for k in before if not np.array_equal(before[k], reply.params[k])}
    assert changed == {"backbone", "neck", "head"}
    assert any(k.startswith("head.hidden.") for k in before)          # the MLP predictor travels too


def test_lra_trainer_needs_the_neck_and_gne_works_with_base_trainer():
    c = cfg(method="fedrane-no-lra")
    model = build_model(c, (1, 8, 8), 10)
    with pytest.raises(ValueError, match="no LRA neck"):
        LRATrainer(job(c, model))
    # fedrane-no-lra: base trainer replies, GNE aggregates them
    ups = []
    for cid in range(3):
        m = build_model(c, (1, 8, 8), 10)
        rep = Trainer(job(c, m, seed=cid)).run()
        ups.append(ClientUpdate(cid, rep.params, int(rep.metrics["num-examples"]), rep.metrics, {}))
    strat = GNEStrategy(c)
    new = strat.aggregate(1, model_params(model), ups)
    assert set(new) == set(model_params(model))
    assert strat.round_metrics()["gne-residual"] < 1e-3


# ------------------------------------------------------------------------------------------ end to end
def test_fedrane_simulation_learns(tmp_path):
    """On the in-process engine (experiments.simulate's default; same numbers as Flower's Ray simulation,
    tests/test_engine_equivalence.py)."""
    from experiments.simulate import simulate

    doc = simulate({"method": "fedrane-repaired", "dataset": "digits", "model": "convnet", "num-server-rounds": 3,
                    "partition": "dirichlet", "dirichlet-alpha": 0.5, "local-epochs": 2, "batch-size": 64,
                    "lr": 0.1, "fedrane-repaired.lra-graph": "closed-form", "local-test-fraction": 0.25,
                    "out-dir": str(tmp_path), "checkpoint": False},
                   num_supernodes=4)   # the real ServerApp and ClientApp, in this process
    rounds = doc["rounds"]
    assert len(rounds) == 3
    for row in rounds:
        s = row["strategy"]
        assert s["gne-status"] == "converged" and s["gne-residual"] < 1e-3
        assert len(s["gne-p"]) == row["num_updates"] == 4
        assert abs(sum(s["gne-weights"]) - 1) < 1e-9
        assert row["local_accuracy"] is not None
        assert row["global_lra_eval"] == "inductive" and 0 < row["global_lra_graph_density"] < 1
        assert 0 < s["lra-graph-density-mean"] < 1 and 0 < s["lra-eval-graph-density-mean"] < 1
    assert rounds[-1]["global_accuracy"] > 0.2          # well above chance (0.1) after 3 rounds
    assert rounds[-1]["global_loss"] < rounds[0]["global_loss"]


# ------------------------------------------------------------------------------------------ host synchronisations
@pytest.mark.parametrize("method", ["fedrane", "fedrane-code"])
def test_a_local_step_makes_no_host_synchronisation_and_the_running_means_equal_pythons_sums(method, monkeypatch):
    """On a GPU each float(t) / bool(t) / .item() of a step stalls the host until the device's queue drains.
    Before this change a FedRANE step made 3 (the loss, the L_CD mean, the graph density), a fedrane-code
    step 5 (+ the mixup term, a second graph); now the running sums stay on the device (tests/_op_counter.py
    counts them). The values read once at the end are Python's float sums bit for bit.
    On the complete graph (lra-cut none: the fmnist presets, fedrane-code's default); the SLIM solve of the
    row-mean cut keeps its data-dependent stops (convergence of the alternation, the Cholesky fallback)."""
    from models.device_sum import DeviceSum
    from tests._op_counter import OpCounter

    c = cfg(method=method, local_epochs=2, **({"fedrane.lra-cut": "none"} if method == "fedrane" else
                                               {"fedrane-code.drop-last": False}))
    counts = {}
    for epochs in (1, 2):
        trainer = LRATrainer(job(RunConfig.from_dict({**c.to_dict(), "local-epochs": epochs}),
                                 build_model(c, (1, 8, 8), 10)))
        trainer.neck.generator = trainer.job.generator
        with OpCounter() as counter:
            stats = trainer.fit()
        counts[epochs] = (counter.count, counter.syncs, stats.steps)
    assert counts[1][2] == 3 and counts[2][2] == 6
    assert counts[2][0] > counts[1][0] > 0           # three more steps: more operations...
    # ...and no host synchronisation in any step (fedrane-code: its kept optimizer's momentum buffers are copied
    # to the client state once per training, at most 2 counted per trainable tensor, however many the steps)
    trainable = sum(p.requires_grad for p in build_model(c, (1, 8, 8), 10).parameters())
    assert counts[1][1] == counts[2][1]
    assert counts[1][1] == 0 if method == "fedrane" else 0 < counts[1][1] <= 2 * trainable

    seen: dict[int, list[float]] = {}                # every value each device sum was given, by sum
    add = DeviceSum.add
    monkeypatch.setattr(DeviceSum, "add",
                        lambda self, v: (seen.setdefault(id(self), []).append(float(v)), add(self, v))[1])
    trainer = LRATrainer(job(c, build_model(c, (1, 8, 8), 10)))
    trainer.neck.generator = trainer.job.generator
    stats = trainer.fit()
    terms = [trainer.cd_term] + ([trainer.mixup] if trainer.mixup is not None else [])
    for running, steps in [(stats.losses, 6)] + [(term.running, 6) for term in terms]:
        python_sum = 0.0                             # the per-step float() sum the device sum replaces
        for v in seen[id(running)]:
            python_sum += v
        assert len(seen[id(running)]) == steps and running.value() == python_sum
        assert running.mean() == python_sum / steps
    assert stats.loss_sum == stats.losses.value()
    with OpCounter() as counter:
        trainer.extra_metrics(stats)
    assert counter.syncs == len(terms) + 1           # each running sum, and the graph density, read once here


def test_fedavgs_local_loop_makes_no_host_synchronisation_per_step():
    """The one local loop every method trains through reads nothing to the host per step either (its running loss
    stays on the device): FedAvg's trainer, 1 and 2 local epochs, no synchronisation in either."""
    from flcore.registry import get_method, resolve
    from tests._op_counter import OpCounter

    c = cfg(method="fedavg")
    syncs = {}
    for epochs in (1, 2):
        run = RunConfig.from_dict({**c.to_dict(), "local-epochs": epochs})
        trainer = resolve(get_method("fedavg").trainer)(job(run, build_model(run, (1, 8, 8), 10)))
        with OpCounter() as counter:
            stats = trainer.fit()
        syncs[epochs] = (counter.syncs, stats.steps)
    assert syncs == {1: (0, 3), 2: (0, 6)}
