"""FedMMD (issue 41; Yao et al., VCIP 2018): the MMD^2 of the authors' kernel sum on hand-computed samples, its
invariants, the floor and the detached global stream, weight = 0 being FedAvg bit for bit, and it learning on
digits Dirichlet(0.1) beside FedAvg."""

import math

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from client_app.trainers.fedmmd import FedMMDTrainer, MMDTerm, fedmmd_penalty, gaussian_kernel_sum, mmd2
from client_app.training import Step
from flcore.config import ConfigError, resolve_run_config
from flcore.methods.fedmmd import CODE_WIDTHS
from flcore.registry import FEDAVG_STRATEGY, get_method
from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job
from tests._learning_digits import best_accuracy, fedavg_best_accuracy, run_digits
from tests.known_outputs import COMMON, run_job

P = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
Q = torch.tensor([[0.0], [0.0]], dtype=torch.float64)


def test_mmd_by_hand_one_width():
    # k(a, b) = exp(-(a - b)^2 / (2 s)), s = 0.5: e = k(0, 1) = exp(-1)
    # mean K(P, P) = (2 + 2e)/4, mean K(Q, Q) = 1, mean K(P, Q) = (1 + e)/2  ->  MMD^2 = (1 - e)/2
    e = math.exp(-1.0)
    torch.testing.assert_close(gaussian_kernel_sum(P, Q, (0.5,)), torch.tensor([[1.0, 1.0], [e, e]], dtype=torch.float64))
    assert mmd2(P, Q, (0.5,)).item() == pytest.approx((1 - e) / 2, abs=1e-12)


def test_mmd_is_linear_in_the_kernel_sum_of_the_authors_widths():
    # with K a sum over widths, MMD^2 is the sum of each width's (1 - exp(-1/(2 s)))/2
    expected = sum((1 - math.exp(-1.0 / (2 * s))) / 2 for s in CODE_WIDTHS)
    assert mmd2(P, Q).item() == pytest.approx(expected, rel=1e-12)
    assert len(CODE_WIDTHS) == 19 and CODE_WIDTHS[0] == 1e-6 and CODE_WIDTHS[-1] == 1e6


def test_invariants_zero_on_equal_samples_symmetric_and_grows_with_the_shift():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 5, generator=g, dtype=torch.float64)
    b = torch.randn(16, 5, generator=g, dtype=torch.float64)
    assert mmd2(a, a).item() == pytest.approx(0.0, abs=1e-12)
    assert mmd2(a, b).item() == pytest.approx(mmd2(b, a).item(), rel=1e-12)
    assert mmd2(a, a + 0.1).item() < mmd2(a, a + 1.0).item() < mmd2(a, a + 10.0).item()
    with pytest.raises(ValueError, match="two N x d batches"):
        mmd2(a, b[:, :3])


def test_floor_weight_and_the_detached_global_stream():
    local = P.clone().requires_grad_(True)
    glob = Q.clone().requires_grad_(True)
    value = fedmmd_penalty(local, glob, weight=2.0, floor=1e-4, widths=(0.5,))
    assert value.item() == pytest.approx(2.0 * (1 - math.exp(-1.0)) / 2, abs=1e-12)
    value.backward()
    assert glob.grad is None and local.grad is not None and local.grad.abs().sum() > 0
    # equal streams: MMD^2 = 0 is raised to the floor, and the floor has no gradient
    same = P.clone().requires_grad_(True)
    floored = fedmmd_penalty(same, P, weight=3.0, floor=1e-4)
    assert floored.item() == pytest.approx(3e-4, rel=1e-12)
    floored.backward()
    assert torch.count_nonzero(same.grad) == 0


def test_the_term_compares_with_the_received_model_frozen():
    cfg = make_cfg(method="fedmmd", **{"fedmmd.weight": 1.0})
    params = initial_params(cfg)
    job = make_job(cfg, 0, 1, params, make_data(0), RecordDict())
    [term] = FedMMDTrainer(job).terms()
    assert isinstance(term, MMDTerm) and (term.weight, term.layer, term.floor) == (1.0, "logits", 1e-4)
    model = job.model
    term.begin(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)   # the local stream moves; the global stream must not
    x = job.data.x_train[:8]
    logits, z = model.forward_features(x)
    value = term.loss(model, Step(x, job.data.y_train[:8], logits, z, 0, 0))
    with torch.no_grad():
        g_logits, _ = term.global_model.forward_features(x)
    assert value.item() == pytest.approx(max(1e-4, mmd2(logits, g_logits).item()), rel=1e-9)
    for name, p in term.global_model.state_dict().items():
        torch.testing.assert_close(p, torch.as_tensor(params[name]))
    assert not any(p.requires_grad for p in term.global_model.parameters())


def test_declaration_defaults_and_bounds():
    assert get_method("fedmmd").strategy == FEDAVG_STRATEGY
    d = make_cfg(method="fedmmd").to_dict()
    assert (d["fedmmd.weight"], d["fedmmd.layer"], d["fedmmd.floor"]) == (0.1, "logits", 1e-4)
    with pytest.raises(ConfigError, match=bound_error("fedmmd.weight", -1.0, ">= 0, finite")):
        make_cfg(method="fedmmd", **{"fedmmd.weight": -1.0})
    with pytest.raises(ConfigError, match=bound_error("fedmmd.layer", "neck", "one of logits, features")):
        make_cfg(method="fedmmd", **{"fedmmd.layer": "neck"})


def test_weight_zero_is_fedavg_bit_for_bit_and_the_constraint_moves_the_model(tmp_path):
    def run(name, **extra):
        values = resolve_run_config({**COMMON, "num-server-rounds": 1, **extra})
        values.pop("out-dir")
        return run_job(values, tmp_path / name)

    fedavg = run("fedavg", method="fedavg")
    zero = run("zero", method="fedmmd", **{"fedmmd.weight": 0.0})
    strong = run("strong", method="fedmmd", **{"fedmmd.weight": 1.0, "fedmmd.layer": "features"})
    assert zero.digest == fedavg.digest
    assert strong.digest.split(":")[0] != fedavg.digest.split(":")[0]
    assert not np.allclose(strong.sketch["backbone.1.weight"], fedavg.sketch["backbone.1.weight"])


def test_fedmmd_learns_on_digits_dirichlet_01_beside_fedavg(tmp_path):
    """digits, Dirichlet(0.1), 8 clients, 12 rounds (tests/_learning_digits.py; ~4 s): measured 2026-12-01
    FedAvg 0.836, FedMMD (defaults) 0.819 best G-FL accuracy: it must learn (> 0.7) within 0.1 of FedAvg."""
    fedavg = fedavg_best_accuracy()
    fedmmd = best_accuracy(run_digits(tmp_path / "fedmmd", method="fedmmd"))
    assert fedmmd > 0.7 and fedmmd > fedavg - 0.1
