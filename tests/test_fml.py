"""FML (Shen et al., arXiv 2006.16765; flcore/methods/fml.py): the mutual-learning losses by hand, one joint
step of the local and meme models computed by hand, the local model kept in the client state across rounds,
and the reductions: beta = 1 trains the meme model as FedAvg does (bit for bit), alpha = 1 trains the local
model as ``local`` does."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_app.trainers.fml import FMLTrainer, kl_to, mutual_loss
from flcore.declaration import FEDAVG_STRATEGY
from flcore.methods.fml import STATE_FML_LOCAL
from flcore.registry import get_method
from tests._baselines_util import bound_error, initial_params, make_cfg, make_data, make_job, make_model
from tests._pfl_basic_util import column, job, params_digest

ONE_STEP = {"batch_size": 1000, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "local_epochs": 1}


def perturbed(params: dict, scale: float = 0.05, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: (v + scale * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in params.items()}


def test_kl_by_hand():
    """Two samples, two classes: KL(p_t || p) = (1/B) sum_b sum_c p_t log(p_t / p), the target detached."""
    target = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])      # p_t = (1/2, 1/2), (3/4, 1/4)
    logits = torch.tensor([[math.log(4.0), 0.0], [0.0, 0.0]], requires_grad=True)  # p = (4/5, 1/5), (1/2, 1/2)
    want = 0.5 * ((0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2))
                  + (0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)))
    value = kl_to(target, logits)
    assert value.item() == pytest.approx(want, rel=1e-6)
    value.backward()                                  # d/dlogits = (p - p_t) / B
    torch.testing.assert_close(logits.grad, torch.tensor([[0.3, -0.3], [-0.25, 0.25]]) / 2)
    assert kl_to(logits.detach(), logits.detach()).item() == pytest.approx(0.0, abs=1e-7)


def test_mutual_loss_is_the_convex_mix_of_ce_and_kl():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 3, generator=g), torch.randn(5, 3, generator=g)
    y = torch.tensor([0, 1, 2, 1, 0])
    ce, kl = F.cross_entropy(a, y).item(), kl_to(b, a).item()
    assert mutual_loss(a, b, y, 0.3).item() == pytest.approx(0.3 * ce + 0.7 * kl, rel=1e-6)
    assert mutual_loss(a, b, y, 1.0).item() == pytest.approx(ce, rel=1e-6)
    assert mutual_loss(a, b, y, 0.0).item() == pytest.approx(kl, rel=1e-6)


def manual_kl(target_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    pt = torch.softmax(target_logits, 1)
    return (pt * (torch.log(pt) - torch.log_softmax(logits, 1))).sum(1).mean()


def grads_at(cfg, params: dict, other: dict, data, weight: float) -> dict[str, torch.Tensor]:
    """grad of weight CE + (1 - weight) KL(p_other || p) at ``params`` over all of the client's data, the KL
    written out by hand (not through kl_to)."""
    model, ref = make_model(cfg), make_model(cfg)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in params.items()})
    ref.load_state_dict({k: torch.as_tensor(v) for k, v in other.items()})
    logits, _ = model.forward_features(data.x_train)
    with torch.no_grad():
        target, _ = ref.forward_features(data.x_train)
    loss = weight * F.cross_entropy(logits, data.y_train) + (1 - weight) * manual_kl(target, logits)
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("alpha,beta", [(0.5, 0.5), (0.2, 0.9), (1.0, 0.0)])
def test_one_joint_step_by_hand(alpha, beta):
    """One full-batch step from l_0 = w^0 (the initial model) and m_0 = w^t (the received model, w^0 perturbed):
    l_1 = l_0 - lr grad[alpha CE(l) + (1 - alpha) KL(p_m0 || p_l)] and
    m_1 = m_0 - lr grad[beta CE(m) + (1 - beta) KL(p_l0 || p_m)], both from the forwards before either step."""
    cfg = make_cfg(method="fml", alpha=alpha, beta=beta, **ONE_STEP)
    data, w0 = make_data(0), initial_params(cfg)
    w_t = perturbed(w0)
    trainer = FMLTrainer(make_job(cfg, 0, 1, w_t, data, RecordDict()))
    reply = trainer.run()
    local = trainer.job.state.get_arrays(STATE_FML_LOCAL)
    for name, g in grads_at(cfg, w0, w_t, data, alpha).items():
        torch.testing.assert_close(torch.as_tensor(local[name]), torch.as_tensor(w0[name]) - 0.1 * g,
                                   rtol=1e-5, atol=1e-6)
    for name, g in grads_at(cfg, w_t, w0, data, beta).items():
        torch.testing.assert_close(torch.as_tensor(reply.params[name]), torch.as_tensor(w_t[name]) - 0.1 * g,
                                   rtol=1e-5, atol=1e-6)
    for name, p in trainer.personalized().state_dict().items():   # P-FL evaluates the local model
        torch.testing.assert_close(p, torch.as_tensor(local[name]))


def test_the_local_model_survives_rounds():
    """Round 2 starts the local model where round 1 left it (alpha = 1: one more plain CE step), whatever
    global model arrives."""
    cfg = make_cfg(method="fml", alpha=1.0, **ONE_STEP)
    data, w0 = make_data(1), initial_params(cfg)
    state = RecordDict()
    FMLTrainer(make_job(cfg, 1, 1, w0, data, state)).run()
    second = FMLTrainer(make_job(cfg, 1, 2, perturbed(w0, 0.3, 5), data, state))
    l1 = {k: np.array(v) for k, v in second.job.state.get_arrays(STATE_FML_LOCAL).items()}
    second.run()
    l2 = second.job.state.get_arrays(STATE_FML_LOCAL)
    for name, g in grads_at(cfg, l1, l1, data, 1.0).items():
        torch.testing.assert_close(torch.as_tensor(l2[name]), torch.as_tensor(l1[name]) - 0.1 * g,
                                   rtol=1e-5, atol=1e-6)


def test_beta_one_is_fedavg_and_alpha_one_is_local(tmp_path):
    """The known-output federation: with beta = 1 FML's global (meme) model ends at FedAvg's parameters with
    FedAvg's G-FL, bit for bit; with alpha = 1 its P-FL (the local models on the local test splits) is
    ``local``'s, round by round; the defaults (alpha = beta = 0.5) move both."""
    extra = {"max-local-steps": 0}  # whole epochs: the models move enough to tell them apart
    fedavg, fedavg_doc = job(tmp_path, "fedavg", method="fedavg", **extra)
    meme, meme_doc = job(tmp_path, "beta1", method="fml", **{"fml.beta": 1.0}, **extra)
    solo, solo_doc = job(tmp_path, "alpha1", method="fml", **{"fml.alpha": 1.0}, **extra)
    local, local_doc = job(tmp_path, "local", method="local", **extra)
    fml, fml_doc = job(tmp_path, "fml", method="fml", **extra)
    assert params_digest(meme) == params_digest(fedavg)
    assert column(meme_doc, "global_accuracy") == column(fedavg_doc, "global_accuracy")
    assert column(meme_doc, "global_loss") == column(fedavg_doc, "global_loss")
    assert column(solo_doc, "local_accuracy") == column(local_doc, "local_accuracy")
    assert params_digest(fml) != params_digest(fedavg)
    assert column(fml_doc, "local_accuracy") != column(local_doc, "local_accuracy")


def test_declaration_and_bounds():
    decl = get_method("fml")
    assert decl.strategy == FEDAVG_STRATEGY and decl.payload.state == (STATE_FML_LOCAL,)
    with pytest.raises(Exception, match=bound_error("fml.alpha", 1.5, ">= 0, <= 1, finite")):
        make_cfg(method="fml", alpha=1.5)
    with pytest.raises(Exception, match=bound_error("fml.beta", -0.1, ">= 0, <= 1, finite")):
        make_cfg(method="fml", beta=-0.1)
