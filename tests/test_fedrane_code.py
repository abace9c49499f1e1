"""FedRANE as the authors' code runs it (method fedrane-code, keys fedrane-code.*), the paper's radius-K GNE step,
and the complete-graph path of lra-cut = none, checked by values."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from client_app.trainers.fedrane import mix_batch
from flcore.config import RunConfig, resolve_run_config
from flcore.methods.fedrane import FedRANECodeConfig, FedRANEConfig, FedRANERepairedConfig, rane_config
from models import build_model
from models.heads import OrthogonalHead
from models.fedrane.neck import LRANeck, contrastive_discrimination
from models.fedrane.relation_graph import (complete_mask, neighbour_mask, pearson_matrix, relational_adjacency,
                                           slim_alternating, slim_closed_form)
from models.fedrane.graph_attention import GATHead
from strategies.methods.fedrane.strategy import step_coefficients


def cfg_of(method: str, **over) -> RunConfig:
    return RunConfig.from_dict(resolve_run_config({"method": method, "dataset": "digits", **over}))


def test_the_code_variant_reads_its_own_section_and_the_paper_variant_is_unchanged():
    code = rane_config(cfg_of("fedrane-code"))
    paper = rane_config(cfg_of("fedrane"))
    assert isinstance(code, FedRANECodeConfig) and type(paper) is FedRANEConfig
    assert (code.lra_graph, code.lra_cut, code.lra_eval, code.lra_gnn, code.lra_cd_similarity) == \
        ("closed-form", "none", "identity", "gat", "cosine")
    assert (code.lra_lambda_cd, code.lra_dropout, code.mixup_weight, code.gne_warm_start, code.hypersphere) == \
        (0.1, 0.2, 10.0, False, True)
    assert (code.lra_predictor, code.drop_last, code.persistent_optimizer, code.lr_step_epochs,
            code.lr_step_gamma, code.flat_features, code.lra_residual) == ("linear", True, True, 150, 0.1, True, False)
    # the paper variant's defaults: the paper's text (issue 40)
    assert (paper.lra_graph, paper.lra_cut, paper.lra_eval, paper.lra_gnn, paper.mixup_weight, paper.hypersphere) \
        == ("alternating", "none", "identity", "dot", 0.0, False)
    assert (paper.lra_residual, paper.lra_predictor, paper.lra_slim_update, paper.drop_last,
            paper.persistent_optimizer, paper.lr_step_epochs, paper.flat_features) == \
        (False, "mlp", "paper", False, False, 0, False)
    # the repaired variant: the fedrane defaults before issue 40, in its own section
    fixed = rane_config(cfg_of("fedrane-repaired"))
    assert type(fixed) is FedRANERepairedConfig
    assert (fixed.lra_residual, fixed.lra_cut, fixed.lra_eval, fixed.lra_predictor, fixed.lra_slim_update) == \
        (True, "row-mean", "inductive", "linear", "majorize")
    # a fedrane-code.* key moves only the code variant
    assert rane_config(cfg_of("fedrane-code", **{"fedrane-code.mixup-weight": 2.0})).mixup_weight == 2.0
    assert rane_config(cfg_of("fedrane", **{"fedrane-code.mixup-weight": 2.0})).mixup_weight == 0.0


def test_every_code_default_that_differs_names_its_source_file():
    for spec, base in zip(FedRANECodeConfig.specs(), FedRANEConfig.specs()):
        if spec.default != base.default:
            assert "XeniaLLL/HyperFed_and_FedRANE-master" in spec.doc and ".py" in spec.doc, spec.key


def test_the_code_model_has_unit_features_a_fixed_orthogonal_classifier_and_a_gat_neck():
    cfg = cfg_of("fedrane-code", model="mlp")
    model = build_model(cfg, (64,), 10)
    z = model.features(torch.randn(5, 64) * 3)
    assert torch.allclose(z.norm(dim=1), torch.ones(5), atol=1e-6)
    assert isinstance(model.head, OrthogonalHead)
    assert isinstance(model.neck.layers[0].heads[0], GATHead) and len(model.neck.layers[0].heads) == 2
    model.eval()   # evaluation without the graph: logits = W^T z
    x = torch.randn(6, 64)
    assert torch.allclose(model(x), model.features(x) @ model.head.weight, atol=1e-6)


def test_the_gat_head_is_additive_attention_over_the_neighbours():
    torch.manual_seed(0)
    head = GATHead(4)
    h = torch.randn(3, 4)
    mask = torch.tensor([[False, True, True], [True, False, False], [True, True, False]])
    wh = head.w(h)
    a = head.a.weight[0]
    out = torch.empty(3, 4)
    for i in range(3):   # the authors' pairwise form: e_ij = LeakyReLU(a^T [Wh_i ; Wh_j]) over j in N_i
        e = torch.stack([F.leaky_relu(a @ torch.cat([wh[i], wh[j]]), 0.1) for j in range(3)])
        att = torch.softmax(e.masked_fill(~mask[i], float("-inf")), dim=0)
        out[i] = F.elu(att @ wh)
    assert torch.allclose(head(h, mask), out, atol=1e-6)


def test_cosine_contrastive_loss_by_hand():
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z_hat = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    tau = 0.5
    # anchor z_0: positive z_hat_0 (cos 1); negatives z_1 (0), z_hat_1 (0)
    expected = -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + 2.0))
    assert float(contrastive_discrimination(z, z_hat, tau, symmetric=True, similarity="cosine")) == \
        pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="similarity"):
        contrastive_discrimination(z, z_hat, tau, similarity="dot")


def test_mixup_batch_mixes_with_a_beta_draw_and_a_permutation():
    x = torch.arange(12.0).reshape(4, 3)
    mixed, perm, lam = mix_batch(x, np.random.default_rng(5), 0.5)
    rng = np.random.default_rng(5)
    lam_ref = rng.beta(0.5, 0.5)
    perm_ref = rng.permutation(4)
    assert lam == pytest.approx(lam_ref) and perm.tolist() == perm_ref.tolist()
    assert torch.allclose(mixed, lam * x + (1 - lam) * x[perm])


@pytest.mark.parametrize("solver", ["alternating", "closed-form"])
def test_the_complete_graph_path_is_the_slim_path_under_cut_none(solver):
    """Identical masks, except that a constant feature row (a dead sample) is isolated exactly, where the
    alternating solve links it to others only through round-off (its relations are ~1e-16 of the others')."""
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        z = torch.randn(3, 17, 8, generator=g, dtype=torch.float64)
        z[0, 4] = 0.0                        # a dead sample: zero features
        z[2, 7] = 1.5                        # a constant row
        p = pearson_matrix(z)
        b = slim_alternating(p, 0.1) if solver == "alternating" else slim_closed_form(p, 0.1)
        a = relational_adjacency(b)
        slow = neighbour_mask(a, 0, "none")
        fast = complete_mask(p)
        assert torch.equal(fast[1], slow[1])                               # no constant row: identical
        for graph, node in ((0, 4), (2, 7)):
            assert fast[graph, node].sum() == 1 and fast[graph, node, node]   # isolated: only itself
            assert not fast[graph, :, node].sum() > 1
            assert float(a[graph, node].max()) <= 1e-11 * float(a[graph].max())
            keep = [i for i in range(17) if i != node]
            assert torch.equal(fast[graph][keep][:, keep], slow[graph][keep][:, keep])
        if solver == "closed-form":
            assert torch.equal(fast, slow)


def test_the_radius_step_has_norm_r_and_defaults_to_k():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(30, 4))
    gram = g.T @ g
    p = np.array([0.3, 0.2, 0.4, 0.1])
    c = step_coefficients(gram, p, np.full(4, 0.25), "radius")
    assert math.sqrt(c @ gram @ c) == pytest.approx(4.0)
    c = step_coefficients(gram, p, np.full(4, 0.25), "radius", radius=2.5)
    assert math.sqrt(c @ gram @ c) == pytest.approx(2.5)
    np.testing.assert_allclose(c / c.sum(), p / p.sum())   # the same direction as the normalised step


def test_a_code_variant_round_trains_with_mixup_and_reports_it(tmp_path):
    import json

    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    cfg = RunConfig.from_dict(resolve_run_config({
        "method": "fedrane-code", "dataset": "digits", "model": "convnet", "num-server-rounds": 1,
        "max-local-steps": 2, "batch-size": 16, "checkpoint": False, "out-dir": str(tmp_path / "run")}))
    run_federation(FakeGrid(3), cfg)
    rnd = json.loads((tmp_path / "run" / "results.json").read_text())["rounds"][0]["strategy"]
    assert rnd["lra-mixup-loss-mean"] > 0 and rnd["lra-cd-loss-mean"] > 0
    assert rnd["lra-graph-density-mean"] == 1.0           # lra-cut = none: the complete graph
    assert rnd["gne-status"] in ("converged", "max-iter")


def test_support_graphs_under_cut_none_equal_the_complete_masks_of_each_query_graph():
    from models.fedrane.relation_graph import support_graphs

    cfg = FedRANEConfig(lra_cut="none")
    g = torch.Generator().manual_seed(2)
    zs = torch.randn(9, 6, generator=g)
    zs[3] = 0.0                                     # a dead support row
    zq = torch.randn(5, 6, generator=g)
    zq[1] = 2.0                                     # a constant query row
    got = support_graphs(zs, zq, cfg)
    for i in range(5):
        nodes = torch.cat([zs, zq[i:i + 1]]).double()
        assert torch.equal(got[i], complete_mask(pearson_matrix(nodes)))
    assert got[1, 9].sum() == 1 and not got[0, 3, :3].any()


def _class_separation(h: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """Mean cosine of distinct rows of the same class and of different classes."""
    h = F.normalize(h.detach(), dim=1)
    cos = h @ h.T
    same = labels[:, None] == labels[None, :]
    off = ~torch.eye(len(labels), dtype=torch.bool)
    return float(cos[same & off].mean()), float(cos[~same].mean())


def test_the_codes_neck_erases_a_batchs_class_structure_and_a_residual_keeps_it():
    """Why fedrane-code stays at chance (docs/FEDRANE.md section 5): its GAT over the complete graph, without a
    residual, sends every row of a batch to nearly the same vector, so the predictor (trained on Z_hat alone at
    lra-alpha = 0) sees no class; a residual around the message passing keeps the classes apart."""
    torch.manual_seed(0)
    centres = torch.linalg.qr(torch.randn(64, 2))[0].T * 8.0  # two orthogonal class centres
    labels = torch.arange(32) % 2
    z = F.normalize(centres[labels] + 0.3 * torch.randn(32, 64), dim=1)
    within, between = _class_separation(z, labels)
    assert within > 0.85 and abs(between) < 0.1
    seps = {}
    for residual in (False, True):
        neck = LRANeck(64, dataclasses.replace(FedRANECodeConfig(), lra_residual=residual), 31).train()
        neck.generator = torch.Generator().manual_seed(1)
        seps[residual] = _class_separation(neck.augment(z), labels)
    assert abs(seps[False][0] - seps[False][1]) < 0.02   # the code's neck: classes indistinguishable
    assert seps[True][0] - seps[True][1] > 0.5           # with a residual: far apart


def test_the_operation_counter_counts_dispatched_operations_and_host_synchronisations():
    """tests/_op_counter.py, which tests/test_fedrane.py's host-synchronisation checks rely on."""
    from tests._op_counter import OpCounter

    with OpCounter() as counter:
        a = torch.ones(3)
        (a + a).sum()
    assert counter.count == 3 and counter.syncs == 0  # ones, add, sum: nothing read to the host
    with OpCounter() as counter:
        a = torch.ones(3)
        b = a.sum()
        float(b), bool(b > 0), b.item(), int(b)    # scalar reads: 4
        a[a > 0], torch.nonzero(a)                 # shapes that depend on the values: 2
        a.tolist(), a.numpy(), a.cpu()             # host copies (no-ops on a CPU tensor, counted): 3
        a[torch.tensor([0, 2])]                    # integer indexing: no synchronisation
    assert counter.syncs == 9
    assert torch.Tensor.cpu is torch._C.TensorBase.cpu   # the counted methods are restored on exit
