"""FedDecorr (issue 34 item 6): the decorrelation loss's values (a hand-computed batch, decorrelated = 1/d,
collapsed = 1, invariance to each dimension's scale and shift, the authors' code form against the paper's),
that gradient steps reduce it, its plumbing from the run config, and beta = 0 being FedAvg bit for bit."""

import math

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from client_app.trainers.feddecorr import DecorrTerm, FedDecorrTrainer, correlation_matrix, decorrelation_loss
from flcore.config import ConfigError, RunConfig
from flcore.registry import FEDAVG_STRATEGY, get_method
from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job
from tests.known_outputs import COMMON, run_job

EPS = 1e-12   # the tests' z-scoring epsilon: small enough that K is the Pearson correlation to ~1e-12


def test_hand_computed_batch():
    # x = 1,2,3,4 and y = 1,3,2,4: centred (-1.5,-.5,.5,1.5), (-1.5,.5,-.5,1.5); sum xy = 4, sum x^2 = sum y^2 = 5,
    # so r = 0.8, K = [[1, .8], [.8, 1]], ||K||_F^2 = 2 + 2 * 0.64 = 3.28 and L = 3.28 / d^2 = 0.82
    z = torch.tensor([[1.0, 1.0], [2.0, 3.0], [3.0, 2.0], [4.0, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(correlation_matrix(z, EPS), torch.tensor([[1.0, 0.8], [0.8, 1.0]], dtype=torch.float64))
    assert decorrelation_loss(z, EPS).item() == pytest.approx(0.82, abs=1e-10)
    # the authors' code form: (N-1)^2/N * mean of the off-diagonal K_ij^2 = 9/4 * 0.64
    assert decorrelation_loss(z, EPS, "code").item() == pytest.approx(1.44, abs=1e-10)


def test_decorrelated_features_give_one_over_d():
    # columns 2..5 of the 8 x 8 Hadamard matrix: zero-mean, unit variance, mutually orthogonal -> K = I
    h = torch.tensor([[1.0]])
    for _ in range(3):
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    z = h[:, 1:5].double()
    torch.testing.assert_close(correlation_matrix(z, EPS), torch.eye(4, dtype=torch.float64))
    assert decorrelation_loss(z, EPS).item() == pytest.approx(1 / 4, abs=1e-12)
    assert decorrelation_loss(z, EPS, "code").item() == pytest.approx(0.0, abs=1e-12)


def test_collapsed_features_give_one():
    # every dimension an affine image of one signal (signs mixed: K_ij = +-1) -> ||K||_F^2 = d^2
    t = torch.randn(32, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    z = t * torch.tensor([2.0, -0.5, 3.0, 1.0, -7.0], dtype=torch.float64) + torch.arange(5.0, dtype=torch.float64)
    assert decorrelation_loss(z, EPS).item() == pytest.approx(1.0, abs=1e-10)
    assert decorrelation_loss(z, EPS, "code").item() == pytest.approx(31 ** 2 / 32, rel=1e-10)


def test_invariant_to_each_dimensions_scale_and_shift():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(16, 6, generator=g, dtype=torch.float64) @ torch.randn(6, 6, generator=g, dtype=torch.float64)
    scale = torch.tensor([0.01, 3.0, -2.0, 100.0, 0.5, -1.0], dtype=torch.float64)
    shift = torch.randn(6, generator=g, dtype=torch.float64) * 50
    for form in ("paper", "code"):
        a, b = decorrelation_loss(z, EPS, form), decorrelation_loss(z * scale + shift, EPS, form)
        assert b.item() == pytest.approx(a.item(), rel=1e-9)
        assert a.item() > 0.2 if form == "paper" else a.item() > 0.5   # correlated: well above K = I


def test_the_code_form_is_a_rescaled_paper_form():
    # (N-1)^2/N * mean_{i != j} K_ij^2 = (N-1)^2 d / (N (d-1)) * ((1/d^2) ||K||_F^2 - 1/d): the same minimiser and
    # gradient direction, about N times larger (why the code's beta = 0.1 is a stronger pull than the paper form's)
    z = torch.randn(24, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    n, d = z.shape
    paper, code = decorrelation_loss(z, EPS), decorrelation_loss(z, EPS, "code")
    assert code.item() == pytest.approx((n - 1) ** 2 * d / (n * (d - 1)) * (paper.item() - 1 / d), rel=1e-9)


def test_gradient_steps_reduce_the_loss_of_a_layers_outputs():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 8, generator=g)
    layer = torch.nn.Linear(8, 6)
    with torch.no_grad():   # start collapsed-ish: every output row close to the first
        layer.weight.copy_(layer.weight[:1] + 0.05 * torch.randn(6, 8, generator=g))
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    values = []
    for _ in range(30):
        loss = decorrelation_loss(layer(x))
        values.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert values[0] > 0.8 and values[-1] < 0.5 * values[0]
    assert all(b <= a + 1e-7 for a, b in zip(values, values[1:]))


def test_degenerate_batches():
    one = torch.randn(1, 4, requires_grad=True)
    assert decorrelation_loss(one).item() == 0.0 and decorrelation_loss(one).requires_grad
    assert decorrelation_loss(torch.randn(5, 1), form="code").item() == 0.0
    # a dead (constant) dimension: eps keeps K finite, its row and column are zero
    z = torch.cat([torch.randn(10, 2, dtype=torch.float64), torch.ones(10, 1, dtype=torch.float64)], 1)
    k = correlation_matrix(z, 1e-8)
    assert torch.isfinite(k).all() and torch.equal(k[2], torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="form must be one of paper, code"):
        decorrelation_loss(z, form="nope")
    with pytest.raises(ValueError, match=r"N x d"):
        decorrelation_loss(torch.randn(4, 2, 2))


def test_declaration_and_trainer_read_the_run_config():
    decl = get_method("feddecorr")
    assert decl.strategy == FEDAVG_STRATEGY
    cfg = make_cfg(method="feddecorr", **{"feddecorr.beta": 0.3, "feddecorr.form": "code"})
    job = make_job(cfg, 0, 1, initial_params(cfg), make_data(0), RecordDict())
    [term] = FedDecorrTrainer(job).terms()
    assert isinstance(term, DecorrTerm) and (term.beta, term.eps, term.form) == (0.3, 1e-8, "code")
    default = make_cfg(method="feddecorr").to_dict()
    # the default is the authors' run (issue 40): their loss.py form with their coefficient 0.1
    assert (default["feddecorr.beta"], default["feddecorr.eps"], default["feddecorr.form"]) == (0.1, 1e-8, "code")
    [term] = FedDecorrTrainer(make_job(make_cfg(method="feddecorr"), 0, 1, initial_params(cfg), make_data(0),
                                       RecordDict())).terms()
    assert (term.beta, term.form) == (0.1, "code")


RECIPE = {"lr": 0.01, "momentum": 0.9, "weight-decay": 1e-5, "local-epochs": 10, "batch-size": 64}


def test_feddecorr_code_carries_the_authors_recipe_with_sources():
    """feddecorr-code: the authors' CIFAR-10 run (run_scripts/cifar10_fedavg_feddecorr.sh, main.py get_args):
    SGD lr 0.01, momentum 0.9, weight decay 1e-5, E = 10, B = 64, each value with its file; the term as feddecorr's."""
    from flcore.config import resolve_run_config

    decl = get_method("feddecorr-code")
    assert decl.strategy == FEDAVG_STRATEGY and dict(decl.recipe) == RECIPE
    assert all("bytedance/FedDecorr" in decl.recipe_sources[k] for k in RECIPE)
    assert "cifar10_fedavg_feddecorr.sh" in decl.recipe_sources["lr"]
    assert "main.py get_args" in decl.recipe_sources["batch-size"]
    flat = RunConfig.from_dict(resolve_run_config({"method": "feddecorr-code"})).to_dict()
    assert {k: flat[k] for k in RECIPE} == RECIPE
    assert (flat["feddecorr.form"], flat["feddecorr.beta"]) == ("code", 0.1)
    plain = RunConfig.from_dict(resolve_run_config({"method": "feddecorr"})).to_dict()
    assert (plain["lr"], plain["local-epochs"], plain["batch-size"]) == (0.03, 1, 32)  # feddecorr: no recipe
    user = RunConfig.from_dict(resolve_run_config({"method": "feddecorr-code", "lr": 0.05})).to_dict()
    assert (user["lr"], user["local-epochs"]) == (0.05, 10)                             # the user's value wins


def test_a_feddecorr_code_run_records_the_recipe_in_results_json(tmp_path):
    """A real run (in-process, 4 digits clients, 1 round, local steps capped for time): nothing of the recipe
    set, so results.json's run_config shows the authors' lr, momentum, weight decay, E and B."""
    import json

    from flcore.config import resolve_run_config

    values = resolve_run_config({"method": "feddecorr-code", "dataset": "digits", "model": "mlp", "seed": 3,
                                 "num-server-rounds": 1, "max-local-steps": 2, "checkpoint": False})
    values.pop("out-dir")
    run_job(values, tmp_path / "run")
    recorded = json.loads((tmp_path / "run" / "results.json").read_text())["run_config"]
    assert {k: recorded[k] for k in RECIPE} == RECIPE
    assert recorded["method"] == "feddecorr-code" and recorded["feddecorr.form"] == "code"


@pytest.mark.parametrize("key,value,allowed", [("feddecorr.beta", -0.1, ">= 0, finite"),
                                               ("feddecorr.beta", math.inf, ">= 0, finite"),
                                               ("feddecorr.eps", 0.0, "> 0, finite"),
                                               ("feddecorr.form", "paper-ish", "one of paper, code")])
def test_bad_values_are_config_errors(key, value, allowed):
    with pytest.raises(ConfigError, match=bound_error(key, value, allowed)):
        make_cfg(method="feddecorr", **{key: value})


def test_beta_zero_is_fedavg_bit_for_bit_and_beta_moves_the_model(tmp_path):
    """One round of the known-output federation (4 clients, digits): FedDecorr with beta = 0 ends with exactly
    FedAvg's parameters and metrics at the same seed; with beta = 1 it does not."""
    from flcore.config import resolve_run_config

    def run(name, **extra):
        values = resolve_run_config({**COMMON, "num-server-rounds": 1, **extra})
        values.pop("out-dir")
        return run_job(values, tmp_path / name)

    fedavg = run("fedavg", method="fedavg")
    zero = run("zero", method="feddecorr", **{"feddecorr.beta": 0.0})
    strong = run("strong", method="feddecorr", **{"feddecorr.beta": 1.0})
    assert zero.digest == fedavg.digest
    assert strong.digest.split(":")[0] != fedavg.digest.split(":")[0]
    assert not np.allclose(strong.sketch["backbone.1.weight"], fedavg.sketch["backbone.1.weight"])
