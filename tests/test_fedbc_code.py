"""FedBC against its authors' code (issue 40): the code's dual step (one torch SGD over all devices' [lambda, gamma]),
the fedbc-code variant and its recipe, the all-devices local (P-FL) accuracy, and Synthetic as the authors draw it."""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np
import pytest
import torch

from data_partitioning.federated import client_indices, data_seed, synthetic_data
from data_partitioning.synthetic import client_size, prior_std, synthetic_client
from flcore.config import RunConfig, resolve_run_config
from flcore.methods.fedbc import CODE_RECIPE, FedBCCodeConfig, FedBCConfig, fedbc_config
from strategies.base import ClientInfo, ClientUpdate
from strategies.client_registry import ClientRegistry
from strategies.methods.fedbc.duals import code_dual_step
from strategies.methods.fedbc.strategy import FedBCStrategy


def P(**arrays) -> "OrderedDict[str, np.ndarray]":
    return OrderedDict((k, np.asarray(v, np.float32)) for k, v in arrays.items())


def cfg_of(method: str = "fedbc", **overrides) -> RunConfig:
    values = {"method": method, "dataset": "synthetic", "partition": "power-law", "model": "logistic",
              "local-test-fraction": 0.2}
    values.update(overrides)
    return RunConfig.from_dict(resolve_run_config(values))


def strategy(method: str = "fedbc", num_clients: int = 3, **overrides) -> FedBCStrategy:
    s = FedBCStrategy(cfg_of(method, **overrides))
    for cid in range(num_clients):
        s.clients[cid] = ClientInfo(cid, 100 + cid, 10 * (cid + 1), [1, 1])
    return s


def upd(cid: int, params, n: int = 10) -> ClientUpdate:
    return ClientUpdate(cid, params, n, {"num-examples": n}, {})


# ---------------------------------------------------------------------------------------------- the code's dual step
def test_code_dual_step_hand_computed_momentum_moves_the_devices_not_stepped():
    """3 devices, eta 0.1, momentum 0.5. Step (k=0, d=2): b_l = [2,0,0], lambda = [0.2,0,0]; gamma's gradient is
    lambda_0 = 0. Step (k=1, d=1): b_l = [1,1,0], lambda = [0.3,0.1,0]. Step (k=0, d=1): b_l = [1.5,0.5,0],
    lambda = [0.45,0.15,0] (device 1 was not stepped and still moved by 0.05), b_g = [0.3,0,0], gamma = [0.03,0,0]."""
    z3 = np.zeros(3)
    lam, gam, lb, gb = code_dual_step(z3, z3, z3, z3, 0, 2.0, 0.1, 0.1, 0.5, None)
    assert lam == pytest.approx([0.2, 0, 0]) and lb == pytest.approx([2, 0, 0]) and gam == pytest.approx([0, 0, 0])
    lam, gam, lb, gb = code_dual_step(lam, gam, lb, gb, 1, 1.0, 0.1, 0.1, 0.5, None)
    assert lam == pytest.approx([0.3, 0.1, 0]) and lb == pytest.approx([1, 1, 0])
    lam, gam, lb, gb = code_dual_step(lam, gam, lb, gb, 0, 1.0, 0.1, 0.1, 0.5, None)
    assert lam == pytest.approx([0.45, 0.15, 0]) and lb == pytest.approx([1.5, 0.5, 0])
    assert gam == pytest.approx([0.03, 0, 0]) and gb == pytest.approx([0.3, 0, 0])


def test_code_dual_step_clamps_every_entry_and_fix_gamma_keeps_gamma():
    lam, gam, lb, gb = code_dual_step(np.array([0.1, 0.05]), np.array([0.0, 0.0]), np.array([0.0, -1.0]),
                                      np.zeros(2), 0, 0.5, 0.1, 0.1, 0.5, None, fix_gamma=True)
    # device 1's buffer -0.5 moves it to 0.05 - 0.05 = 0, device 0: 0.1 + 0.1 * 0.5
    assert lam == pytest.approx([0.15, 0.0]) and lb == pytest.approx([0.5, -0.5])
    assert gam.tolist() == [0.0, 0.0] and gb.tolist() == [0.0, 0.0]
    lam, *_ = code_dual_step(np.array([0.9]), np.zeros(1), np.zeros(1), np.zeros(1), 0, 5.0, 0.1, 0.1, 0.0, 1.0)
    assert lam.tolist() == [1.0]                                                  # Proj onto [0, lambda_max]
    with pytest.raises(ValueError, match="client index 3"):
        code_dual_step(np.zeros(2), np.zeros(2), np.zeros(2), np.zeros(2), 3, 1.0, 0.1, 0.1, 0.5, None)


def test_code_dual_step_equals_torch_sgd_over_the_whole_vectors():
    """The authors' loop (main_fed.py __main__): zero_grad; ((d - gamma[k]) * lamb[k]).backward(); lamb.grad *= -1;
    opt.step(); lamb.clamp_(min=0): one SGD(momentum 0.5) over [lamb, gamma], stepped after each client."""
    n, eta, beta = 5, 0.05, 0.5
    lamb = torch.zeros(n, dtype=torch.float64, requires_grad=True)
    gamma = torch.zeros(n, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([lamb, gamma], lr=eta, momentum=beta)
    ours = [np.zeros(n)] * 4
    steps = [(0, 3.0), (2, 1.0), (4, 0.2), (0, 0.5), (1, 4.0), (2, 0.01), (0, 0.0), (3, 2.0), (2, 5.0)]
    for k, d in steps:
        opt.zero_grad()
        ((d - gamma[k]) * lamb[k]).backward()
        lamb.grad.data = -lamb.grad.data
        opt.step()
        with torch.no_grad():
            lamb.clamp_(min=0)
        ours = code_dual_step(*ours, k, d, eta, eta, beta, None)
        np.testing.assert_allclose(ours[0], lamb.detach().numpy(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(ours[1], gamma.detach().numpy(), rtol=1e-12, atol=1e-15)
    assert (ours[1] > 0).tolist() == [True, False, True, False, False]   # gamma moves from a device's 2nd step


def test_strategy_code_dual_step_moves_every_known_client_and_weights_by_the_result():
    s = strategy(**{"fedbc.dual-step": "code", "fedbc.eta-lambda": 0.1, "fedbc.eta-gamma": 0.1})
    z = P(w=[0.0, 0.0])
    s.aggregate(1, z, [upd(1, P(w=[1.0, 0.0])), upd(0, P(w=[1.0, 1.0]))])      # sq dist 1 and 2, stepped 0 then 1
    assert [s.duals[c].lam for c in range(3)] == pytest.approx([0.3, 0.1, 0.0])
    m = s.round_metrics()
    assert m["fedbc-round-cids"] == [1, 0] and m["fedbc-round-weights"] == pytest.approx([0.25, 0.75])
    s.aggregate(2, z, [upd(0, P(w=[1.0, 0.0]))])
    assert [s.duals[c].lam for c in range(3)] == pytest.approx([0.45, 0.15, 0.0])   # client 1 moved unsampled
    assert [s.duals[c].gamma for c in range(3)] == pytest.approx([0.03, 0.0, 0.0])
    # the per-client default (the paper's Eq. 11) leaves client 1 where its own step put it
    p = strategy(**{"fedbc.eta-lambda": 0.1, "fedbc.eta-gamma": 0.1})
    p.aggregate(1, z, [upd(0, P(w=[1.0, 1.0])), upd(1, P(w=[1.0, 0.0]))])
    p.aggregate(2, z, [upd(0, P(w=[1.0, 0.0]))])
    assert [p.duals[c].lam for c in range(2)] == pytest.approx([0.2 + 0.1 * 2.0, 0.1])
    # checkpoint round trip keeps the buffers
    again = strategy(**{"fedbc.dual-step": "code"})
    again.load_state_dict(json.loads(json.dumps(s.state_dict())))
    assert again.duals == s.duals


# --------------------------------------------------------------------------------------------------- fedbc-code
def test_fedbc_code_reads_its_own_section_with_the_codes_values():
    code = fedbc_config(cfg_of("fedbc-code"))
    assert isinstance(code, FedBCCodeConfig) and code.dual_step == "code"
    assert (code.eta_lambda, code.eta_gamma, code.lambda_momentum, code.lambda_init, code.gamma_init,
            code.lambda_max, code.fix_gamma) == (1e-3, 1e-3, 0.5, 0.0, 0.0, 0.0, False)
    paper = fedbc_config(cfg_of("fedbc"))
    assert type(paper) is FedBCConfig and paper.dual_step == "per-client"
    assert fedbc_config(cfg_of("fedbc-code", **{"fedbc-code.eta-lambda": 0.01})).eta_lambda == 0.01
    assert fedbc_config(cfg_of("fedbc", **{"fedbc-code.eta-lambda": 0.01})).eta_lambda == 1e-3


def test_a_fedbc_code_run_with_nothing_else_set_records_the_codes_recipe(tmp_path):
    """results.json's run config of a fedbc-code run shows the authors' optimizer (lr 0.01, momentum 0.5, no weight
    decay, B = 20, E = 1), and the round ran the code's dual step (unsampled clients' multipliers move)."""
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    cfg = RunConfig.from_dict(resolve_run_config({
        "method": "fedbc-code", "dataset": "synthetic", "partition": "natural", "model": "logistic",
        "num-server-rounds": 3, "fraction-train": 0.5, "local-test-fraction": 0.2, "checkpoint": False,
        "out-dir": str(tmp_path / "run")}))
    run_federation(FakeGrid(4), cfg)
    doc = json.loads((tmp_path / "run" / "results.json").read_text())
    rc = doc["run_config"]
    assert {k: rc[k] for k in CODE_RECIPE} == CODE_RECIPE == {"lr": 0.01, "momentum": 0.5, "weight-decay": 0.0,
                                                              "batch-size": 20, "local-epochs": 1}
    assert rc["fedbc-code.dual-step"] == "code" and rc["fedbc-code.lambda-momentum"] == 0.5
    moved = False
    for prev, row in zip(doc["rounds"], doc["rounds"][1:]):
        s0, s1 = prev["strategy"], row["strategy"]
        for c in set(s1["fedbc-cids"]) - set(s1["fedbc-round-cids"]):
            if c in s0["fedbc-cids"] and s0["fedbc-lambda"][s0["fedbc-cids"].index(c)] > 0:
                moved |= s1["fedbc-lambda"][s1["fedbc-cids"].index(c)] != s0["fedbc-lambda"][s0["fedbc-cids"].index(c)]
    assert moved
    # the all-devices P-FL metric: every device trained so far counts once
    seen: set[int] = set()
    for row in doc["rounds"]:
        seen |= set(row["sampled"])
        assert row["local_accuracy_all_devices_n"] == len(seen) and row["num_registered"] == 4


# ------------------------------------------------------------------------------------- P-FL over all devices
def test_all_devices_local_accuracy_keeps_each_devices_last_local_model():
    reg = ClientRegistry(cfg_of(), query=lambda: None)
    for cid in range(4):
        reg.clients[cid] = ClientInfo(cid, cid, 10, [1])
    assert reg.all_devices_local_accuracy() == {"local_accuracy_all_devices": None,
                                                "local_accuracy_all_devices_n": 0, "num_registered": 4}
    acc = lambda cid, a: ClientUpdate(cid, {}, 10, {"local-accuracy": a}, {})   # noqa: E731
    reg.note_local_models([acc(0, 0.5), acc(1, 0.9)])
    reg.note_local_models([acc(1, 0.7), acc(2, float("nan"))])       # 1's newer model; 2 has no local test split
    out = reg.all_devices_local_accuracy()
    assert out == {"local_accuracy_all_devices": pytest.approx((0.5 + 0.7) / 2), "local_accuracy_all_devices_n": 2,
                   "num_registered": 4}
    reg.accuracy[0] = 0.0                                             # what FedUFO's ranking rewrites: not read here
    assert reg.all_devices_local_accuracy()["local_accuracy_all_devices"] == pytest.approx(0.6)
    back = ClientRegistry(cfg_of(), query=lambda: None)
    back.clients = dict(reg.clients)
    back.load_state_dict(json.loads(json.dumps(reg.state_dict())))
    assert back.all_devices_local_accuracy() == out


# ------------------------------------------------------------------------------------ Synthetic as the authors draw it
def test_synthetic_sizes_follow_the_authors_floor_plus_50_and_the_cap_is_an_option():
    assert client_size(0.7) == 50 and client_size(12.99) == 62 and client_size(5000.2) == 2000
    assert client_size(5000.2, max_samples=0) == 5050                 # the authors: no cap
    big = [k for k in range(200) if len(synthetic_client(1.0, 1.0, 0, k)[1]) == 2000]
    assert big, "some of 200 lognormal(4, 2) draws exceed 1950"
    k = big[0]
    assert len(synthetic_client(1.0, 1.0, 0, k, max_samples=0)[1]) > 2000


def test_synthetic_prior_scale_std_is_the_authors_and_equals_variance_at_alpha_one():
    assert prior_std(0.5, "std") == 0.5 and prior_std(0.25, "variance") == 0.5
    for k in range(3):   # Synthetic(1, 1): both readings draw the same data (the results recorded before)
        a, b = synthetic_client(1.0, 1.0, 7, k, prior_scale="std"), synthetic_client(1.0, 1.0, 7, k, prior_scale="variance")
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    a, b = synthetic_client(0.5, 0.5, 7, 0, prior_scale="std"), synthetic_client(0.5, 0.5, 7, 0, prior_scale="variance")
    assert not np.array_equal(a[0], b[0])
    # the client mean v_k ~ N(B_k, 1) with B_k ~ N(0, beta): across clients, its spread grows with beta's reading
    # beta = 4, alpha = 0: the same draws scaled by sd 4 against sd 2, so x differs by the constant B_k(var) = 2 z
    x_sd = synthetic_client(0.0, 4.0, 1, 0, 5000, "std")[0].astype(np.float64)
    x_var = synthetic_client(0.0, 4.0, 1, 0, 5000, "variance")[0].astype(np.float64)
    shift = x_sd - x_var
    assert np.ptp(shift) < 1e-5 and abs(shift.mean()) > 1e-3
    means = lambda scale: np.std([synthetic_client(0.0, 4.0, 1, k, 5000, scale)[0].mean() for k in range(40)])  # noqa
    assert 1.6 < means("std") / means("variance") < 2.4                 # across clients: sd 4 against sd 2
    with pytest.raises(ValueError, match="synthetic-prior-scale"):
        synthetic_client(1.0, 1.0, 0, 0, prior_scale="sd")


def test_synthetic_run_config_keys_reach_the_generator_and_the_80_20_split():
    c = cfg_of(**{"synthetic-alpha": 0.5, "synthetic-beta": 0.5, "synthetic-max-samples": 0})
    assert c.synthetic_prior_scale == "std"
    x, y = synthetic_data(c, 3)
    ref = synthetic_client(0.5, 0.5, data_seed("synthetic"), 3, max_samples=0, prior_scale="std")
    assert np.array_equal(x, ref[0])
    tr, te, va = client_indices(c, 3, 30)
    n = len(y)
    assert len(tr) + len(te) == n and len(te) == round(0.2 * n) and abs(len(te) - (n - int(0.8 * n))) <= 1


def test_plot_fedbc_reads_the_all_devices_pfl_series(tmp_path):
    from experiments.plot_fedbc import pfl_series, plot

    s = strategy()
    z = P(w=[0.0, 0.0])
    rows = []
    for rnd, (acc_all, n, sampled) in enumerate([(None, 0, None), (0.5, 2, 0.5), (0.6, 3, 0.7)], start=1):
        z = s.aggregate(rnd, z, [upd(0, P(w=[1.0, rnd])), upd(2, P(w=[3.0, 0.0]), 30)])
        rows.append({"round": rnd, "local_accuracy": sampled, "local_accuracy_all_devices": acc_all,
                     "local_accuracy_all_devices_n": n, "num_registered": 3, "strategy": s.round_metrics()})
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"run_config": {}, "rounds": rows}))
    got = pfl_series(json.loads(path.read_text()))
    assert np.isnan(got["all_devices"][0]) and got["all_devices"][1:].tolist() == [0.5, 0.6]
    assert got["devices_with_model"].tolist() == [0, 2, 3] and got["registered"].tolist() == [3, 3, 3]
    assert plot(path, tmp_path / "f.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="before issue 40"):
        pfl_series({"rounds": [{"round": 1}]})


@pytest.mark.parametrize("name", ["claim-fedbc-synthetic", "fedbc-table1-synthetic11", "fedbc-mnist5k-powerlaw",
                                  "fedbc-uniform-validation"])
def test_committed_fedbc_results_stay_attached_to_their_configs(name):
    """Issue 40 changed FedBC's keys and Synthetic's generator options: every committed run is still the run its
    config plans (same recorded values, same client split), so experiments.run would not redo it. The new
    fedbc-table1-synthetic (the authors' (0.5, 0.5)) has no results yet."""
    from experiments.run import RESULTS_ROOT, is_complete, load_experiment, planned_config, run_dir, tuned_runs
    from flcore.config import PROJECT_ROOT

    doc = load_experiment(PROJECT_ROOT / "experiments" / "configs" / f"{name}.toml")
    exp = doc["experiment"]
    runs = 0
    for label, over in tuned_runs(doc, RESULTS_ROOT / name, None).items():
        for seed in exp.get("seeds", [0, 1, 2]):
            out = run_dir(name, label, seed)
            cfg = planned_config({**doc.get("base", {}), **over, "seed": seed, "out-dir": str(out),
                                  "checkpoint": False, "overwrite": True})
            assert is_complete(out, cfg, int(exp["num-supernodes"])), f"{name}/{label}/seed{seed} would be redone"
            runs += 1
    assert runs >= 6


def test_fedbc_table1_runs_are_attached_to_their_config_on_their_own_federations():
    """Issue 43 items 3 and 5: every committed run of fedbc-table1-synthetic is the run its config plans, each
    reported seed drew its own federation (distinct client-split digests, the same for every label of a seed),
    and no tuning federation is a reported one."""
    import json

    from experiments.run import RESULTS_ROOT, is_complete, load_experiment, planned_config, run_dir, tuned_runs
    from flcore.config import PROJECT_ROOT

    name = "fedbc-table1-synthetic"
    doc = load_experiment(PROJECT_ROOT / "experiments" / "configs" / f"{name}.toml")
    exp = doc["experiment"]
    digests: dict[int, set[str]] = {}
    tuned = list(json.loads((RESULTS_ROOT / name / "tuning.json").read_text())["runs"])  # the columns tuned so far
    assert {"fedavg-e1", "fedprox-e1", "scaffold-e1", "qfedavg-e1", "fedbc-e1"} <= set(tuned)
    for label, over in tuned_runs(doc, RESULTS_ROOT / name, tuned).items():
        for seed in exp["seeds"]:
            out = run_dir(name, label, seed)
            if not out.exists():  # a column not run yet
                continue
            cfg = planned_config({**doc["base"], **over, "seed": seed, "out-dir": str(out), "checkpoint": False,
                                  "overwrite": True})
            assert is_complete(out, cfg, int(exp["num-supernodes"])), f"{name}/{label}/seed{seed} would be redone"
            digests.setdefault(seed, set()).add(json.loads((out / "client_split.json").read_text())["digest"])
    assert len(digests) == 5 and all(len(d) == 1 for d in digests.values())      # one federation per seed
    reported = {next(iter(d)) for d in digests.values()}
    assert len(reported) == 5                                                       # ... and five of them
    tuning = {json.loads(f.read_text())["digest"]
              for f in (RESULTS_ROOT / name / "tuning").rglob("client_split.json")}
    assert len(tuning) == 3 and not tuning & reported                               # 3 tuning federations, apart
