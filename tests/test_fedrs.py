"""FedRS (Li & Zhan, KDD 2021) and its restricted softmax as a common key composing with any method (issue 41):
the per-class scales (paper and authors'-code forms, by hand), the restricted forward, that alpha = 0 stops
every update of a missing class's classifier row, alpha = 1 being FedAvg (fedrs) and SCAFFOLD (scaffold) bit
for bit, and the key reaching a subclass trainer's own forward."""

import math

import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_app.trainers.base import Trainer
from client_app.trainers.fedetf import ETFTrainer
from client_app.training import restricted_forward, restricted_softmax_scale
from flcore.config import ConfigError
from flcore.registry import BASE_TRAINER, FEDAVG_STRATEGY, get_method
from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job
from tests.known_outputs import COMMON, run_job


def test_scales_by_hand():
    counts = [6, 0, 3, 0, 1]
    # paper: 1 for a held class, alpha for a missing one
    assert restricted_softmax_scale(counts, 0.5).tolist() == [1.0, 0.5, 1.0, 0.5, 1.0]
    # authors' code: alpha + (1 - alpha) n_c / max n = 0.5 + 0.5 * (1, 0, .5, 0, 1/6)
    torch.testing.assert_close(restricted_softmax_scale(counts, 0.5, "code"),
                               torch.tensor([1.0, 0.5, 0.75, 0.5, 0.5 + 0.5 / 6]))
    assert restricted_softmax_scale(counts, 0.0).tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]
    # alpha = 1 (every scale 1) and a client without samples: no restriction at all
    assert restricted_softmax_scale(counts, 1.0) is None and restricted_softmax_scale([0, 0], 0.3) is None
    with pytest.raises(ValueError, match="restricted-softmax-form"):
        restricted_softmax_scale(counts, 0.5, "soft")


def test_restricted_forward_scales_the_logits_only():
    model = torch.nn.Linear(3, 4)
    model.forward_features = lambda x: (model(x), x)          # (logits, features) like an FLModel
    x = torch.randn(5, 3)
    scale = torch.tensor([1.0, 0.5, 1.0, 0.0])
    logits, feats = restricted_forward(lambda m, a, b: m.forward_features(a), scale)(model, x, None)
    torch.testing.assert_close(logits, model(x) * scale)
    assert feats is x


def test_alpha_zero_stops_the_missing_classes_rows():
    """With alpha = 0 the logit of a missing class is 0 whatever its weights: its classifier row gets no
    gradient; at alpha = 0.5 it gets a smaller one than under the plain softmax (the paper's point)."""
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 3, bias=False)
    z, y = torch.randn(8, 4), torch.tensor([0, 2, 0, 2, 0, 2, 0, 2])      # class 1 missing

    def grad_row1(alpha):
        head.zero_grad()
        scale = restricted_softmax_scale(torch.bincount(y, minlength=3).tolist(), alpha)
        logits = head(z) if scale is None else head(z) * scale
        F.cross_entropy(logits, y).backward()
        return head.weight.grad[1].norm().item()

    plain, half, zero = grad_row1(1.0), grad_row1(0.5), grad_row1(0.0)
    assert zero == 0.0 and 0.0 < half < plain


def test_the_key_wraps_any_trainers_forward():
    data = make_data(0)                       # 3 classes; drop class 2 from the training labels
    keep = data.y_train != 2
    from client_app.trainers.base import ClientData
    data = ClientData(data.x_train[keep], data.y_train[keep], data.x_test, data.y_test, data.num_classes)
    cfg = make_cfg(method="fedavg", **{"restricted-softmax-alpha": 0.25})
    job = make_job(cfg, 0, 1, initial_params(cfg), data, RecordDict())
    x = data.x_train[:4]
    raw, _ = job.model.forward_features(x)
    logits, _ = Trainer(job).forward(job.model, x, data.y_train[:4])
    torch.testing.assert_close(logits, raw * torch.tensor([1.0, 1.0, 0.25]))
    plain = make_cfg(method="fedavg")
    assert Trainer(make_job(plain, 0, 1, initial_params(plain), data, RecordDict())).forward.__func__ is Trainer.forward


def test_declaration_and_bounds():
    decl = get_method("fedrs")
    assert (decl.strategy, decl.trainer) == (FEDAVG_STRATEGY, BASE_TRAINER)
    assert decl.recipe == {"restricted-softmax-alpha": 0.5}
    assert make_cfg(method="fedrs").restricted_softmax_alpha == 0.5            # the recipe
    assert make_cfg(method="fedavg").restricted_softmax_alpha == 1.0           # off for every other method
    assert make_cfg(method="fedrs", **{"restricted-softmax-alpha": 0.9}).restricted_softmax_alpha == 0.9
    for key, value, allowed in [("restricted-softmax-alpha", 1.5, ">= 0, <= 1, finite"),
                                ("restricted-softmax-alpha", -0.1, ">= 0, <= 1, finite"),
                                ("restricted-softmax-form", "soft", "one of paper, code")]:
        with pytest.raises(ConfigError, match=bound_error(key, value, allowed)):
            make_cfg(method="fedavg", **{key: value})


def _run(tmp_path, name, **extra):
    from flcore.config import resolve_run_config
    values = resolve_run_config({**COMMON, "num-server-rounds": 1, "dirichlet-alpha": 0.1, **extra})
    values.pop("out-dir")
    return run_job(values, tmp_path / name)


def test_alpha_one_is_fedavg_and_scaffold_bit_for_bit(tmp_path):
    """One round of the known-output federation at Dirichlet(0.1) (classes missing on every client): FedRS with
    alpha = 1 ends with FedAvg's parameters and metrics; SCAFFOLD with the key at 1 is SCAFFOLD; alpha = 0.5
    moves both."""
    fedavg = _run(tmp_path, "fedavg", method="fedavg")
    assert _run(tmp_path, "fedrs1", method="fedrs", **{"restricted-softmax-alpha": 1.0}).digest == fedavg.digest
    fedrs = _run(tmp_path, "fedrs", method="fedrs")
    assert fedrs.digest.split(":")[0] != fedavg.digest.split(":")[0]
    scaffold = _run(tmp_path, "scaffold", method="scaffold")
    assert _run(tmp_path, "scaffold1", method="scaffold", **{"restricted-softmax-alpha": 1.0}).digest == scaffold.digest
    rs = _run(tmp_path, "scaffoldrs", method="scaffold", **{"restricted-softmax-alpha": 0.5})
    assert rs.digest.split(":")[0] != scaffold.digest.split(":")[0]
    # the code form differs from the paper form (a held but rare class is restricted too)
    code = _run(tmp_path, "code", method="fedrs", **{"restricted-softmax-form": "code"})
    assert code.digest.split(":")[0] != fedrs.digest.split(":")[0]


def test_it_composes_with_a_method_whose_trainer_has_its_own_forward():
    """FedETF's trainer overrides forward (its memory vectors): the key scales that forward's logits too."""
    assert ETFTrainer.forward is not Trainer.forward
    data = make_data(1)
    counts = data.class_counts()
    cfg = make_cfg(method="fedetf", **{"restricted-softmax-alpha": 0.5})
    job = make_job(cfg, 0, 1, initial_params(cfg), data, RecordDict())
    trainer = ETFTrainer(job)
    x, y = data.x_train[:5], data.y_train[:5]
    raw, _ = ETFTrainer.forward(trainer, job.model, x, y)
    got, _ = trainer.forward(job.model, x, y)
    expect = torch.tensor([1.0 if n > 0 else 0.5 for n in counts])
    torch.testing.assert_close(got, raw * expect)
    assert not math.isnan(float(got.sum()))


@pytest.mark.slow
def test_it_learns_beside_fedavg(tmp_path):
    """digits, 10 clients, Dirichlet(0.1), 15 rounds (tests/_learning_util.py; means of the last 3 rounds): FedRS
    (alpha 0.5) and SCAFFOLD/RS learn, their global models within 0.15 of FedAvg's and SCAFFOLD's and well above
    chance (0.1); FedRS's local models stay within 0.1 of FedAvg's on the local splits (SCAFFOLD/RS's do not: a
    model trained with the restricted softmax is less biased to its own classes, which its skewed local test
    rewards). Measured 2026-12-01: G-FL / P-FL FedAvg 0.808 / 0.879, FedRS 0.705 / 0.869, SCAFFOLD 0.698 / 0.846,
    SCAFFOLD/RS 0.726 / 0.638."""
    from tests._learning_util import fedavg_doc, final, run
    fedavg, fedrs = fedavg_doc(), run(tmp_path, "fedrs")
    scaffold, scaffold_rs = run(tmp_path, "scaffold"), run(tmp_path, "scaffold", **{"restricted-softmax-alpha": 0.5})
    assert final(fedrs, "global_accuracy") >= final(fedavg, "global_accuracy") - 0.15
    assert final(scaffold_rs, "global_accuracy") >= final(scaffold, "global_accuracy") - 0.15
    assert final(fedrs, "global_accuracy") > 0.5 and final(scaffold_rs, "global_accuracy") > 0.5
    assert final(fedrs, "local_accuracy") >= final(fedavg, "local_accuracy") - 0.1
