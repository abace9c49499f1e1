"""Local Mixup (issue 41; Zhang et al., ICLR 2018): the mix and its loss on hand-computed values, the sampler's
draws, alpha = 0 being FedAvg bit for bit, and it learning on digits Dirichlet(0.1) beside FedAvg."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_app.trainers.mixup import MixupTrainer, mix_inputs, mixup_loss, sampler_for
from flcore.config import ConfigError, resolve_run_config
from flcore.registry import FEDAVG_STRATEGY, get_method
from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job
from tests._learning_digits import best_accuracy, fedavg_best_accuracy, run_digits
from tests.known_outputs import COMMON, run_job


def test_mix_inputs_by_hand():
    x = torch.tensor([[0.0, 2.0], [4.0, 6.0]])
    # 0.25 * x + 0.75 * x[[1, 0]] = [[3, 5], [1, 3]]
    torch.testing.assert_close(mix_inputs(x, 0.25, torch.tensor([1, 0])), torch.tensor([[3.0, 5.0], [1.0, 3.0]]))
    torch.testing.assert_close(mix_inputs(x, 1.0, torch.tensor([1, 0])), x)   # lam = 1: the plain batch
    with pytest.raises(ValueError, match="permutation has shape"):
        mix_inputs(x, 0.5, torch.tensor([0, 1, 0]))


def test_mixup_loss_by_hand_and_as_a_soft_target():
    # logits (0, 0, ln 2): p = (1/4, 1/4, 1/2); CE(y=0) = ln 4, CE(y=2) = ln 2
    logits = torch.tensor([[0.0, 0.0, math.log(2.0)]], dtype=torch.float64)
    y, partner = torch.tensor([0]), torch.tensor([2])
    value = mixup_loss(logits, y, partner, 0.25)
    assert value.item() == pytest.approx(0.25 * math.log(4) + 0.75 * math.log(2), abs=1e-12)   # = 1.25 ln 2
    # CE is linear in the target: the same as CE against lam e_y + (1 - lam) e_y'
    g = torch.Generator().manual_seed(0)
    z = torch.randn(5, 4, generator=g, dtype=torch.float64)
    ya, yb = torch.randint(0, 4, (5,), generator=g), torch.randint(0, 4, (5,), generator=g)
    soft = 0.3 * F.one_hot(ya, 4).double() + 0.7 * F.one_hot(yb, 4).double()
    torch.testing.assert_close(mixup_loss(z, ya, yb, 0.3), F.cross_entropy(z, soft))


def test_sampler_draws_beta_lams_and_is_reproducible():
    s1, s2 = sampler_for(1.0, torch.Generator().manual_seed(5)), sampler_for(1.0, torch.Generator().manual_seed(5))
    model = torch.nn.Identity()
    model.forward_features = lambda x: (x, x)   # the sampler only needs (logits, z) back
    x, y = torch.arange(8.0).view(4, 2), torch.arange(4)
    for _ in range(3):
        a, b = s1.forward(model, x, y), s2.forward(model, x, y)
        torch.testing.assert_close(a[0], b[0])
        assert torch.equal(s1.partner, s2.partner) and sorted(s1.partner.tolist()) == [0, 1, 2, 3]
    lams = np.array([s1.rng.beta(1.0, 1.0) for _ in range(4000)])
    # Beta(1, 1) is uniform on [0, 1]: mean 1/2, variance 1/12
    assert lams.min() >= 0 and lams.max() <= 1
    assert abs(lams.mean() - 0.5) < 0.02 and abs(lams.var() - 1 / 12) < 0.01
    small = sampler_for(0.05, torch.Generator().manual_seed(5))
    ext = np.array([small.rng.beta(0.05, 0.05) for _ in range(2000)])
    assert np.mean((ext < 0.05) | (ext > 0.95)) > 0.8   # alpha -> 0: lam concentrates at 0 and 1


def test_declaration_and_trainer_read_the_run_config():
    decl = get_method("mixup")
    assert decl.strategy == FEDAVG_STRATEGY
    assert make_cfg(method="mixup").to_dict()["mixup.alpha"] == 1.0
    cfg = make_cfg(method="mixup", **{"mixup.alpha": 0.4})
    job = make_job(cfg, 0, 1, initial_params(cfg), make_data(0), RecordDict())
    stats = MixupTrainer(job).fit()
    assert stats.steps == 3 and math.isfinite(stats.mean_loss)   # 24 samples, batch 8


def test_bad_alpha_is_a_config_error():
    with pytest.raises(ConfigError, match=bound_error("mixup.alpha", -0.5, ">= 0, finite")):
        make_cfg(method="mixup", **{"mixup.alpha": -0.5})


def test_alpha_zero_is_fedavg_bit_for_bit_and_alpha_moves_the_model(tmp_path):
    def run(name, **extra):
        values = resolve_run_config({**COMMON, "num-server-rounds": 1, **extra})
        values.pop("out-dir")
        return run_job(values, tmp_path / name)

    fedavg = run("fedavg", method="fedavg")
    zero = run("zero", method="mixup", **{"mixup.alpha": 0.0})
    mixed = run("mixed", method="mixup")
    assert zero.digest == fedavg.digest
    assert mixed.digest.split(":")[0] != fedavg.digest.split(":")[0]
    assert not np.allclose(mixed.sketch["backbone.1.weight"], fedavg.sketch["backbone.1.weight"])


def test_mixup_learns_on_digits_dirichlet_01_beside_fedavg(tmp_path):
    """digits, Dirichlet(0.1), 8 clients, 12 rounds (tests/_learning_digits.py; ~2 s): measured 2026-12-01
    FedAvg 0.836, Mixup (alpha 1) 0.721 best G-FL accuracy. Mixup must learn (> 0.6, chance 0.1) and stay within
    0.2 of FedAvg (on this short run the mixed targets slow it; FedBR's Table 1 has it level with FedAvg)."""
    fedavg = fedavg_best_accuracy()
    mixup = best_accuracy(run_digits(tmp_path / "mixup", method="mixup"))
    assert mixup > 0.6 and mixup > fedavg - 0.2
