"""VHL (issue 41; Tang et al., ICML 2022): the virtual set built from the run seed on every node (same set on
every node, separable classes, no data dependence), the SupCon calibration on a hand-computed case, the joint
forward, all weights 0 being FedAvg bit for bit, and it learning on digits Dirichlet(0.1) beside FedAvg."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_app.trainers.vhl import VHLTerm, VirtualBatches, supcon, virtual_dataset
from client_app.training import Step
from flcore.config import ConfigError, resolve_run_config
from flcore.methods.vhl import VHLConfig
from flcore.registry import FEDAVG_STRATEGY, get_method
from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job
from tests._learning_digits import best_accuracy, run_digits
from tests.known_outputs import COMMON, run_job


def test_the_virtual_set_is_a_function_of_the_run_seed_only():
    x, y = virtual_dataset(3, (1, 8, 8), 10, 200)
    assert x.shape == (2000, 1, 8, 8) and y.tolist() == [c for c in range(10) for _ in range(200)]
    x2, y2 = virtual_dataset(3, (1, 8, 8), 10, 200)
    assert torch.equal(x, x2) and torch.equal(y, y2)              # every node builds the same set
    assert not torch.allclose(virtual_dataset(4, (1, 8, 8), 10, 200)[0], x)
    assert x.abs().max() <= 1.0 and 0.3 < x.std() < 1.0            # the datasets' normalised pixel range
    # the virtual classes are separable: nearest class mean labels the set almost perfectly
    flat = x.flatten(1)
    means = torch.stack([flat[y == c].mean(0) for c in range(10)])
    assert (torch.cdist(flat, means).argmin(1) == y).float().mean() > 0.95
    with pytest.raises(ValueError, match="needs classes and samples"):
        virtual_dataset(3, (4,), 0, 10)


def test_supcon_by_hand():
    # f1 = f2 = (1, 0) share a label, f3 = (0, 1) another; tau = 1. Anchors 1 and 2: s = 1 to the positive, 0 to
    # f3, log_prob = 1 - ln(e + 1); anchor 3 has no positive (0). Loss = (2/3)(ln(1 + e) - 1)
    f = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]], dtype=torch.float64)   # norms do not matter
    value = supcon(f, torch.tensor([0, 0, 1]), 1.0)
    assert value.item() == pytest.approx((2 / 3) * (math.log(1 + math.e) - 1), abs=1e-12)
    # tau = 0.5: s / tau = 2 -> (2/3)(ln(e^2 + 1) - 2)
    assert supcon(f, torch.tensor([0, 0, 1]), 0.5).item() == pytest.approx((2 / 3) * (math.log(math.e ** 2 + 1) - 2))
    assert supcon(f, torch.tensor([0, 1, 2]), 0.07).item() == 0.0   # no positives at all
    with pytest.raises(ValueError, match="N x d features and N labels"):
        supcon(f, torch.tensor([0, 1]), 1.0)


def _job(**keys):
    cfg = make_cfg(method="vhl", **keys)
    return cfg, make_job(cfg, 0, 1, initial_params(cfg), make_data(0), RecordDict())


def test_joint_forward_and_the_term_by_its_parts():
    cfg, job = _job()
    c = cfg.section(VHLConfig)
    x_v, y_v = virtual_dataset(0, (6,), 3, 4)
    batches = VirtualBatches(x_v, y_v, 5, torch.Generator().manual_seed(0))
    model, x, y = job.model, job.data.x_train[:8], job.data.y_train[:8]
    logits, z = batches.forward(model, x, y)
    ref_logits, ref_z = model.forward_features(x)          # the MLP has no batch statistics: same real half
    torch.testing.assert_close(logits, ref_logits)
    assert batches.logits_v.shape == (5, 3) and batches.labels_v.shape == (5,)
    value = VHLTerm(c, batches).loss(model, Step(x, y, logits, z, 0, 0))
    expected = (c.alpha * F.cross_entropy(batches.logits_v, batches.labels_v)
                + c.align_weight * supcon(torch.cat([z, batches.z_v]), torch.cat([y, batches.labels_v]), c.temperature)
                + c.noise_weight * supcon(batches.z_v, batches.labels_v, c.temperature))
    assert value.item() == pytest.approx(expected.item(), rel=1e-6)


def test_the_natural_features_align_with_the_virtual_ones_not_the_reverse():
    # the align term sees sg(z_v): alone (alpha = 0, noise weight 0) it gives the virtual half no gradient
    z = torch.randn(6, 4, requires_grad=True)
    zv = torch.randn(5, 4, requires_grad=True)
    loss = supcon(torch.cat([z, zv.detach()]), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1]), 0.07)
    loss.backward()
    assert zv.grad is None and z.grad.abs().sum() > 0


def test_declaration_defaults_and_bounds():
    assert get_method("vhl").strategy == FEDAVG_STRATEGY
    d = make_cfg(method="vhl").to_dict()
    assert (d["vhl.alpha"], d["vhl.align-weight"], d["vhl.noise-weight"], d["vhl.temperature"], d["vhl.per-class"],
            d["vhl.batch-size"]) == (1.0, 1.0, 0.1, 0.07, 200, 128)
    with pytest.raises(ConfigError, match=bound_error("vhl.temperature", 0.0, "> 0, finite")):
        make_cfg(method="vhl", **{"vhl.temperature": 0.0})


def test_all_weights_zero_is_fedavg_bit_for_bit_and_vhl_moves_the_model(tmp_path):
    def run(name, **extra):
        values = resolve_run_config({**COMMON, "num-server-rounds": 1, **extra})
        values.pop("out-dir")
        return run_job(values, tmp_path / name)

    fedavg = run("fedavg", method="fedavg")
    zero = run("zero", method="vhl", **{"vhl.alpha": 0.0, "vhl.align-weight": 0.0, "vhl.noise-weight": 0.0})
    vhl = run("vhl", method="vhl", **{"vhl.batch-size": 16})
    assert zero.digest == fedavg.digest
    assert vhl.digest.split(":")[0] != fedavg.digest.split(":")[0]
    assert not np.allclose(vhl.sketch["backbone.1.weight"], fedavg.sketch["backbone.1.weight"])


@pytest.mark.slow
def test_vhl_learns_on_digits_dirichlet_01_beside_fedavg(tmp_path):
    """digits, Dirichlet(0.1), 8 clients, 12 rounds (tests/_learning_digits.py; ~30 s, the 128 virtual samples
    per step): measured 2026-12-01 FedAvg 0.836, VHL (defaults) 0.897 best G-FL accuracy: it must learn (> 0.7)
    and not fall more than 0.05 below FedAvg."""
    fedavg = best_accuracy(run_digits(tmp_path / "fedavg", method="fedavg"))
    vhl = best_accuracy(run_digits(tmp_path / "vhl", method="vhl"))
    assert vhl > 0.7 and vhl > fedavg - 0.05
