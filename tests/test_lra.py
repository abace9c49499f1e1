"""FedRANE's LRA (models/fedrane/): Pearson graph and SLIM solutions (relation_graph.py), message passing, L_CD,
the neck (neck.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flcore.config import ConfigError, RunConfig, resolve_run_config
from flcore.methods.fedrane import FedRANEConfig
from models import build_model
from models.fedrane.neck import AttentiveMessagePassing, LRANeck, contrastive_discrimination
from models.fedrane.predictor import MLPPredictor
from models.fedrane.relation_graph import (batch_graph, graph_density, inverse_sqrt_gram, neighbour_mask,
                                           pearson_matrix, relational_adjacency, slim_alternating, slim_b_step,
                                           slim_closed_form, slim_objective, slim_paper_b_step)
from models.heads import LinearHead
from tests._baselines_util import bound_error, run_config_keys


def features(n: int = 24, d: int = 10, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(3, d, generator=g) * 2
    return torch.relu(centres[torch.arange(n) % 3] + torch.randn(n, d, generator=g)).double()


def test_pearson_matrix_matches_numpy_corrcoef():
    z = features()
    np.testing.assert_allclose(pearson_matrix(z).numpy(), np.corrcoef(z.numpy()), atol=1e-12)
    a, b = z[:5], z[5:9]
    np.testing.assert_allclose(pearson_matrix(a, b).numpy(), np.corrcoef(a.numpy(), b.numpy())[:5, 5:], atol=1e-12)
    const = torch.ones(2, 4, dtype=torch.float64)  # zero-variance rows: similarity 0, no NaN
    assert torch.equal(pearson_matrix(const), torch.zeros(2, 2, dtype=torch.float64))


def test_closed_form_hand_computed_2x2():
    # P = [[1, r], [r, 1]]: H = (P + lam I)^-1 has H_12/H_22 = -r/(1+lam), so B_12 = B_21 = r/(1+lam)
    r, lam = 0.6, 0.1
    p = torch.tensor([[1.0, r], [r, 1.0]], dtype=torch.float64)
    b = slim_closed_form(p, lam)
    np.testing.assert_allclose(b.numpy(), [[0.0, r / 1.1], [r / 1.1, 0.0]], atol=1e-12)


def test_b_step_with_identity_phi_is_paper_eq4():
    p = pearson_matrix(features())
    lam = 0.1
    n = p.shape[0]
    h = torch.linalg.inv(p.T @ p + lam * torch.eye(n, dtype=p.dtype))
    eq4 = -h / torch.diagonal(h).unsqueeze(0)
    eq4.fill_diagonal_(0.0)
    b = slim_b_step(p, lam, torch.eye(n, dtype=p.dtype))
    np.testing.assert_allclose(b.numpy(), eq4.numpy(), atol=1e-10)


def test_b_step_is_the_constrained_minimiser():
    # 1/2 ||P - PB||^2 + lam/2 tr(B^T Phi B) on {diag(B) = 0}: no zero-diagonal perturbation decreases it
    p = pearson_matrix(features(n=12))
    lam = 0.1
    g = torch.Generator().manual_seed(1)
    x = torch.randn(12, 12, generator=g, dtype=torch.float64)
    phi = x @ x.T / 12 + 0.5 * torch.eye(12, dtype=torch.float64)   # any symmetric PD Phi

    def obj(b: torch.Tensor) -> float:
        return float(0.5 * torch.linalg.matrix_norm(p - p @ b) ** 2 + 0.5 * lam * torch.trace(b.T @ phi @ b))

    b = slim_b_step(p, lam, phi)
    assert torch.all(torch.diagonal(b) == 0)
    base = obj(b)
    for _ in range(10):
        e = torch.randn(12, 12, generator=g, dtype=torch.float64).fill_diagonal_(0.0)
        assert obj(b + 1e-3 * e) > base and obj(b - 1e-3 * e) > base


def test_alternating_slim_zero_diagonal_and_decreasing_eq2_objective():
    p = pearson_matrix(features(n=32, d=8))
    lam = 0.1
    f0 = slim_objective(p, torch.zeros_like(p), lam)                     # B = 0: 1/2 ||P||^2
    assert f0 == pytest.approx(0.5 * float(torch.linalg.matrix_norm(p) ** 2))
    values = [slim_objective(p, slim_alternating(p, lam, iters=i, rtol=0.0, update="majorize"), lam)
              for i in range(1, 8)]
    b = slim_alternating(p, lam, iters=7, rtol=0.0, update="majorize")
    assert torch.all(torch.diagonal(b) == 0)
    assert values[-1] < 0.5 * f0                                          # far below B = 0
    assert values[-1] < values[0]                                         # below the paper's Eq. 4 (Phi = I)
    assert all(b2 <= b1 * (1 + 1e-9) for b1, b2 in zip(values[1:], values[2:]))  # monotone MM steps


def test_paper_b_step_is_eq4_as_written_with_phi_plus_phi_transpose():
    # Eq. 4: H = (P^T P + lam (Phi + Phi^T))^-1, B_ij = -H_ij / H_jj, B_ii = 0, for a non-symmetric Phi
    p = pearson_matrix(features(n=10))
    lam = 0.1
    g = torch.Generator().manual_seed(4)
    phi = torch.randn(10, 10, generator=g, dtype=torch.float64) * 0.1 + torch.eye(10, dtype=torch.float64)
    h = np.linalg.inv(p.numpy().T @ p.numpy() + lam * (phi.numpy() + phi.numpy().T))
    expect = -h / np.diag(h)[None, :]
    np.fill_diagonal(expect, 0.0)
    np.testing.assert_allclose(slim_paper_b_step(p, lam, phi).numpy(), expect, atol=1e-10)
    eye10 = torch.eye(10, dtype=torch.float64)     # Phi = I: the constrained minimiser with weight 2 lam
    np.testing.assert_allclose(slim_paper_b_step(p, lam, eye10).numpy(), slim_b_step(p, 2 * lam, eye10).numpy(),
                               atol=1e-10)
    # the alternation: B_1 from Phi = I, then Phi_1 = (B_1 B_1^T)^-1/2 and B_2 by Eq. 4 again
    b1 = slim_paper_b_step(p, lam, eye10)
    b2 = slim_paper_b_step(p, lam, inverse_sqrt_gram(b1, 1e-6))
    np.testing.assert_allclose(slim_alternating(p, lam, iters=2, rtol=0.0).numpy(), b2.numpy(), atol=1e-12)
    assert not np.allclose(b2.numpy(), slim_alternating(p, lam, iters=2, rtol=0.0, update="majorize").numpy())


def test_inverse_sqrt_gram_and_clamp():
    g = torch.Generator().manual_seed(3)
    b = torch.randn(6, 6, generator=g, dtype=torch.float64)
    phi = inverse_sqrt_gram(b, 1e-12)
    np.testing.assert_allclose((phi @ (b @ b.T) @ phi).numpy(), np.eye(6), atol=1e-8)   # Phi^2 = (BB^T)^-1
    rank1 = torch.outer(torch.ones(4, dtype=torch.float64), torch.arange(1.0, 5.0, dtype=torch.float64))
    assert torch.all(torch.isfinite(inverse_sqrt_gram(rank1, 1e-6)))    # singular BB^T: still finite


def test_adjacency_and_neighbour_mask():  # cut = none: the paper's literal N_i = {j : A_ij > 0}
    b = torch.tensor([[0.0, -2.0, 0.0, 1.0], [1.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.0, 0.0]])
    a = relational_adjacency(b)
    expect = torch.tensor([[0.0, 1.5, 0.0, 2.0], [1.5, 0.0, 0.25, 0.0], [0.0, 0.25, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    assert torch.equal(a, expect)
    m = neighbour_mask(a)
    assert m.tolist() == [[False, True, False, True], [True, False, True, False],
                          [False, True, False, False], [True, False, False, False]]
    top1 = neighbour_mask(a, topk=1)
    assert top1.tolist() == [[False, False, False, True], [True, False, False, False],
                             [False, True, False, False], [True, False, False, False]]
    lonely = neighbour_mask(torch.zeros(1, 1))                           # a batch of one attends to itself
    assert lonely.tolist() == [[True]]


@torch.no_grad()
def test_message_passing_respects_the_mask():
    torch.manual_seed(0)
    layer = AttentiveMessagePassing(5).double()
    h = torch.randn(6, 5, dtype=torch.float64)
    mask = torch.zeros(6, 6, dtype=torch.bool)
    mask[0, [1, 2]] = True
    mask[1:, 0] = True
    att = layer.attention(h, mask)
    assert torch.all(att[~mask] == 0)
    np.testing.assert_allclose(att.sum(1).numpy(), 1.0, atol=1e-12)
    out = layer(h, mask)
    # node 0 only hears 1 and 2: moving nodes 3-5 leaves its message unchanged
    h2 = h.clone()
    h2[3:] += 10.0
    assert torch.allclose(layer(h2, mask)[0], out[0])
    # Eq. 5 with W = I at init: h_0' = a_01 h_1 + a_02 h_2
    np.testing.assert_allclose(out[0].numpy(), (att[0, 1] * h[1] + att[0, 2] * h[2]).numpy(), atol=1e-12)
    # the attention is the masked softmax of (W_r h_i)^T (W_s h_j) / sqrt(d)
    s = (layer.w_r(h)[0] @ layer.w_s(h)[[1, 2]].T) / math.sqrt(5)
    np.testing.assert_allclose(att[0, [1, 2]].numpy(), torch.softmax(s, 0).numpy(), atol=1e-12)


def test_contrastive_loss_hand_computed():
    # Rows are centred already, so Pearson = cosine: s(z1,z2) = 1/2, s(z1,zh1) = 1, s(z1,zh2) = 1/2,
    # s(z2,zh1) = 1/2, s(z2,zh2) = -1/2, s(zh1,zh2) = 1/2.
    z = torch.tensor([[1.0, 0.0, -1.0], [0.0, 1.0, -1.0]])
    z_hat = torch.tensor([[2.0, 0.0, -2.0], [1.0, -1.0, 0.0]])
    tau = 0.8
    e = lambda s: math.exp(s / tau)  # noqa: E731
    l1 = -math.log(e(1.0) / (e(0.5) + e(1.0) + e(0.5)))      # anchor z1: others z2, zh1 (+), zh2
    l2 = -math.log(e(-0.5) / (e(0.5) + e(0.5) + e(-0.5)))    # anchor z2: others z1, zh1, zh2 (+)
    assert float(contrastive_discrimination(z, z_hat, tau)) == pytest.approx((l1 + l2) / 2, rel=1e-6)
    # anchors zh1, zh2 see the same similarity multisets here, so the symmetric form has the same value
    assert float(contrastive_discrimination(z, z_hat, tau, symmetric=True)) == pytest.approx((l1 + l2) / 2, rel=1e-6)


def test_contrastive_loss_prefers_aligned_views():
    z = features(n=16).float()
    aligned = contrastive_discrimination(z, 2.0 * z + 0.1)              # Pearson-identical views
    shuffled = contrastive_discrimination(z, z[torch.randperm(16, generator=torch.Generator().manual_seed(0))])
    assert float(aligned) < float(shuffled)


def cfg(**over) -> RunConfig:
    base = {"method": "fedrane", "dataset": "digits", "model": "convnet"}
    return RunConfig.from_dict(resolve_run_config({**base, **run_config_keys("fedrane", over)}))


def test_model_hook_installs_federated_neck():
    model = build_model(cfg(), (1, 8, 8), 10)
    assert isinstance(model.neck, LRANeck)
    assert any(k.startswith("neck.layers.0.w_r") for k in model.state_dict())   # travels with the model
    plain = build_model(cfg(method="fedrane-no-lra"), (1, 8, 8), 10)
    assert isinstance(plain.neck, torch.nn.Identity)
    again = build_model(cfg(), (1, 8, 8), 10)                                    # seeded: same init
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    # the paper's predictor (default): Linear(d, d), ReLU, Linear(d, C), also without LRA; the repair: linear
    for m in (model, plain):
        assert isinstance(m.head, MLPPredictor)
        assert (m.head.hidden.in_features, m.head.hidden.out_features, m.head.out.out_features) == (64, 64, 10)
    z = torch.randn(5, 64)
    assert torch.allclose(model.head(z), model.head.out(torch.relu(model.head.hidden(z))))
    wide = build_model(cfg(lra_predictor_hidden=32), (1, 8, 8), 10)
    assert wide.head.hidden.out_features == 32
    assert isinstance(build_model(cfg(lra_predictor="linear"), (1, 8, 8), 10).head, LinearHead)
    assert isinstance(build_model(cfg(method="fedrane-repaired"), (1, 8, 8), 10).head, LinearHead)
    with pytest.raises(ValueError, match="lra-predictor = 'linear'"):
        build_model(cfg(hypersphere=True), (1, 8, 8), 10)


def test_neck_train_and_eval_modes():
    torch.manual_seed(0)
    z = torch.relu(torch.randn(20, 64))
    neck = build_model(cfg(lra_eval="transductive"), (1, 8, 8), 10).neck
    neck.train()
    out = neck(z)
    assert out.shape == z.shape and torch.all(torch.isfinite(out))
    neck.eval()
    assert torch.allclose(neck(z), out)                       # transductive: the training graph over the batch
    one = neck(z[:1])                                         # a batch of one: finite, attends to itself
    assert torch.all(torch.isfinite(one))
    ident = build_model(cfg(), (1, 8, 8), 10).neck.eval()      # the default: no graph at evaluation
    assert torch.equal(ident(z), z)
    inductive = build_model(cfg(lra_eval="inductive"), (1, 8, 8), 10).neck.eval()  # needs a support set
    with pytest.raises(RuntimeError, match="needs a support set of training data"):
        inductive(z)
    mixed = LRANeck(64, FedRANEConfig(lra_alpha=0.25))
    zh = mixed.augment(z)
    assert torch.allclose(mixed(z), 0.25 * z + 0.75 * zh)
    literal = LRANeck(64, FedRANEConfig())                     # the default, Eq. 5 exactly: no residual term
    mask = batch_graph(z, literal.cfg)
    assert torch.allclose(literal.augment(z), literal.layers[0](z, mask))
    residual = LRANeck(64, FedRANEConfig(lra_residual=True))   # the repair: h + messages
    assert torch.allclose(residual.augment(z), z + residual.layers[0](z, batch_graph(z, residual.cfg)))


def test_gradients_reach_extractor_and_attention():
    model = build_model(cfg(), (1, 8, 8), 10)
    x = torch.randn(16, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    z = model.features(x)
    z_hat = model.neck.augment(z)
    loss = model.head(z_hat).logsumexp(1).mean() + contrastive_discrimination(z, z_hat)
    loss.backward()
    for name in ("neck.layers.0.w_r.weight", "neck.layers.0.w_s.weight", "neck.layers.0.w.weight"):
        assert float(dict(model.named_parameters())[name].grad.abs().sum()) > 0
    assert float(next(model.backbone.parameters()).grad.abs().sum()) > 0


def test_batch_graph_cuts_and_topk():
    z = features(n=30)
    dense = batch_graph(z, FedRANEConfig())                   # default: the paper's N_i = {j : A_ij > 0}
    assert not torch.any(torch.diagonal(dense))
    assert int(dense.sum()) == 30 * 29                        # SLIM weights are dense: N_i = all j != i
    repaired = FedRANEConfig(lra_cut="row-mean", lra_slim_update="majorize")  # fedrane-repaired's graph
    sparse = batch_graph(z, repaired)                         # the relations above the node's mean
    a = relational_adjacency(slim_alternating(pearson_matrix(z), 0.1, 5, 1e-6, update="majorize"))
    off = a.masked_fill(torch.eye(30, dtype=torch.bool), 0.0)
    assert torch.equal(sparse, off > off.sum(1, keepdim=True) / 29)
    density = float(graph_density(sparse).mean())
    assert 0.1 < density < 0.6                                # a real cut, not the complete graph
    capped = batch_graph(z, FedRANEConfig(lra_topk=4, lra_graph="closed-form", lra_cut="none"))
    assert torch.all(capped.sum(1) >= 4) and not torch.any(torch.diagonal(capped))
    both = batch_graph(z, FedRANEConfig(lra_topk=2, lra_cut="row-mean", lra_slim_update="majorize"))
    assert torch.all(both.sum(1) <= 2) and torch.all(both <= sparse)


def test_config_errors_name_the_key():
    for key, value, allowed in (("fedrane.lra-graph", "knn", "one of alternating, closed-form"),
                                ("fedrane.lra-eval", "relational", "one of inductive, transductive, identity"),
                                ("fedrane.lra-cut", "knn", "one of row-mean, none"),
                                ("fedrane.lra-eval-batch", 1024, ">= 2, <= 512"),
                                ("fedrane.lra-support-size", -1, ">= 0"),
                                ("fedrane.lra-tau", 0.0, "> 0, finite"),
                                ("fedrane.lra-alpha", 1.5, ">= 0, <= 1, finite"),
                                ("fedrane.lra-steps", 0, ">= 1")):
        with pytest.raises(ConfigError, match=bound_error(key, value, allowed)):
            FedRANEConfig.parse({key: value})
