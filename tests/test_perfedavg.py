"""Per-FedAvg (Fallah et al., NeurIPS 2020, issue 41): the MAML step (FO and HF) on a one-weight model computed by
hand, the one-step personalization P-FL evaluates (from the received global model), the step count, the run
checks, and that it learns beside FedAvg."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_app.trainers.perfedavg import PerFedAvgTrainer, adapted_copy, gradients, maml_step
from flcore.config import ConfigError
from flcore.registry import FEDAVG_STRATEGY, get_method
from tests._baselines_util import initial_params, make_cfg, make_data, make_job


class OneWeight(torch.nn.Module):
    """logits = [w x, 0]: CE's derivative is mean((s(w x) - [y = 0]) x), its second mean(s (1 - s) x^2)."""

    def __init__(self, w: float) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([w], dtype=torch.float64))


def fwd(model, x, y):
    return torch.stack([model.w * x, torch.zeros_like(x)], 1), x


def sig(a):
    return 1.0 / (1.0 + math.exp(-a))


def grad(w, xs, ys):
    return sum((sig(w * x) - (y == 0)) * x for x, y in zip(xs, ys)) / len(xs)


def hess(w, xs):
    return sum(sig(w * x) * (1 - sig(w * x)) * x * x for x in xs) / len(xs)


def batch(xs, ys):
    return torch.tensor(xs, dtype=torch.float64), torch.tensor(ys)


D, D1, D2 = ([1.0, 2.0], [0, 1]), ([-1.0, 3.0], [1, 0]), ([0.5, -2.0], [0, 0])


def test_first_order_step_by_hand():
    w, alpha, beta = 0.5, 0.1, 0.2
    w_tmp = w - alpha * grad(w, *D)
    expect = w - beta * grad(w_tmp, *D1)
    model = OneWeight(w)
    maml_step(model, [model.w], [batch(*D), batch(*D1)], alpha, beta, "fo", forward=fwd)
    assert model.w.item() == pytest.approx(expect, abs=1e-12)


def test_hessian_free_step_is_the_maml_step():
    """HF: w - beta (I - alpha H(w; D'')) grad f(w_tmp; D'), H by central differences (O(delta^2) off)."""
    w, alpha, beta = 0.5, 0.1, 0.2
    g = grad(w - alpha * grad(w, *D), *D1)
    expect = w - beta * (g - alpha * hess(w, D2[0]) * g)
    model = OneWeight(w)
    maml_step(model, [model.w], [batch(*D), batch(*D1), batch(*D2)], alpha, beta, "hf", delta=1e-4, forward=fwd)
    assert model.w.item() == pytest.approx(expect, abs=1e-9)
    assert abs(expect - (w - beta * g)) > 1e-3                       # the Hessian term matters here
    with pytest.raises(ValueError, match="needs 3 batches"):
        maml_step(model, [model.w], [batch(*D), batch(*D1)], alpha, beta, "hf", forward=fwd)


def test_weight_decay_enters_every_gradient():
    model = OneWeight(0.5)
    [g], _ = gradients(model, [model.w], batch(*D), fwd, weight_decay=0.1)
    assert g.item() == pytest.approx(grad(0.5, *D) + 0.05, abs=1e-12)


def test_personalized_model_is_one_step_from_the_received_global_model():
    cfg = make_cfg(method="perfedavg", batch_size=24)
    data = make_data(0, n=24)
    params = initial_params(cfg)
    job = make_job(cfg, 0, 1, params, data, RecordDict())
    trainer = PerFedAvgTrainer(job)
    stats = trainer.fit()
    # n = 24, B = 24: one batch per epoch, two per FO step -> at least one step
    assert stats.steps == 1
    pers = trainer.personalized()
    ref = make_job(cfg, 0, 1, params, data, RecordDict()).model
    F.cross_entropy(ref(data.x_train), data.y_train).backward()          # the one batch is the whole set
    for name, p in pers.named_parameters():
        expect = torch.from_numpy(params[name]) - 0.01 * dict(ref.named_parameters())[name].grad
        torch.testing.assert_close(p.detach(), expect, rtol=1e-5, atol=1e-7)
    assert not pers.training
    # the trained model is untouched by the evaluation copy
    assert not torch.equal(dict(job.model.named_parameters())[name], p)


def test_step_count_and_run_checks():
    cfg = make_cfg(method="perfedavg", batch_size=4, local_epochs=2)        # 24 samples: 6 batches per epoch
    job = make_job(cfg, 0, 1, initial_params(cfg), make_data(0, n=24), RecordDict())
    assert PerFedAvgTrainer(job).fit().steps == 6                           # 2 * 6 / 2
    hf = make_cfg(method="perfedavg", batch_size=4, local_epochs=2, **{"perfedavg.variant": "hf"})
    job = make_job(hf, 0, 1, initial_params(hf), make_data(0, n=24), RecordDict())
    assert PerFedAvgTrainer(job).fit().steps == 4                           # 2 * 6 / 3
    assert get_method("perfedavg").strategy == FEDAVG_STRATEGY
    assert (cfg.momentum, cfg.weight_decay) == (0.0, 0.0)                   # the recipe
    with pytest.raises(ConfigError, match="'momentum' must be 0"):
        make_cfg(method="perfedavg", momentum=0.5)


def test_adapted_copy_is_deterministic():
    cfg = make_cfg(method="perfedavg")
    data = make_data(2)
    params = initial_params(cfg)
    job = make_job(cfg, 0, 1, params, data, RecordDict())
    a = adapted_copy(job.model, job.global_params, data.x_train, data.y_train, 8, 0.05,
                     torch.Generator().manual_seed(3), PerFedAvgTrainer(job).forward)
    b = adapted_copy(job.model, job.global_params, data.x_train, data.y_train, 8, 0.05,
                     torch.Generator().manual_seed(3), PerFedAvgTrainer(job).forward)
    for (_, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q)
    assert any(not np.allclose(p.detach().numpy(), params[k]) for k, p in a.named_parameters())


@pytest.mark.slow
def test_it_learns_beside_fedavg(tmp_path):
    """digits, 10 clients, Dirichlet(0.1), 15 rounds, beta = lr 0.05: the one-step-adapted models (P-FL) beat
    the same run's global model on the clients (the personalization works) and stay within 0.2 of FedAvg's
    local accuracy; the global model is well above chance (0.1). Measured 2026-12-01 (tests/_learning_util.py,
    means of the last 3 rounds): FedAvg G-FL 0.808 / P-FL 0.879; Per-FedAvg (FO) 0.601 / 0.716, its unadapted
    global model on the local splits 0.521."""
    from tests._learning_util import fedavg_doc, final, run
    fedavg, per = fedavg_doc(), run(tmp_path, "perfedavg")
    assert final(per, "local_accuracy") >= final(fedavg, "local_accuracy") - 0.2
    assert final(per, "global_accuracy") > 0.4
    assert final(per, "local_accuracy") > final(per, "client_accuracy_mean")
