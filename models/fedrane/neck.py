"""FedRANE's client side: LRA, local relational augmentation (seed 000, Sec. 3.3), as the model's neck.

Per graph of n feature rows Z (n x d; a training minibatch, or a test sample with its support set):
  1. P = Pearson correlation of the n rows of Z                                    (Sec. 3.3)
  2. SLIM subspace weights B with a nuclear-norm penalty                           (Eq. 2-4)
         min_B 1/2 ||P - P B||_F^2 + lambda_G ||B||_*   s.t. diag(B) = 0,
     solved by alternating closed forms (``lra-graph = alternating``) or the authors' one-shot
     EASE form (``lra-graph = closed-form``).
  3. A = (|B| + |B^T|) / 2; neighbours N_i: the edges A_ij that the cut keeps (below)  (Sec. 3.3)
  4. L steps of attentive message passing over N_i                                 (Eq. 5-6)
         h_i^{l+1} = [h_i^l +] sum_{j in N_i} a_ij W^l h_j^l,
         a_ij = softmax_{j in N_i} ((W_r^l h_i)^T (W_s^l h_j) / sqrt(d)),   Z_hat = h^L.
     The residual term h_i^l (``fedrane.lra-residual``, default on) is ours: the paper's Eq. 5 omits it, and so
     does the GAT the authors' code runs (graph_models.py GAT.forward; only a commented-out line of another layer
     adds its input back). Without it Z_hat_i is built from the *other* samples
     only (diag(A) = 0); centrally on digits the literal form stayed at the chance-level loss ln 10 for 8
     epochs on the complete graph, while the residual form trains.
  5. Contrastive discrimination L_CD over [Z; Z_hat] with Pearson similarity        (Eq. 7)
     (used by client_app/trainers/fedrane.py: loss = CE(head(Z_hat), y) + lambda_CD L_CD, Eq. 9).

Every graph function accepts leading batch dimensions (..., n, n) and treats each graph on its own (a
graph's result never depends on another graph of the batch, convergence tests included).

Neighbourhoods (``fedrane.lra-cut``, ``fedrane.lra-topk``): the paper mines "sparse" relations with SLIM but its
Eq. 2 has no sparsity term (only the nuclear norm), and neither SLIM form yields exact zeros, so its literal
N_i = {j : A_ij > 0} is every other node (``lra-cut = none``: the complete graph, where the SLIM solve changes
nothing). Our default ``row-mean`` keeps A_ij > mean_{j' != i} A_ij': the relations stronger than node i's
average one. It has no parameter, does not depend on the graph's size, and lets a node's degree follow its
relations (a sample unlike the rest keeps few neighbours: the paper's concern about minority samples
contaminated by the majority). ``lra-topk`` = k additionally keeps at most the k strongest per node.
docs/FEDRANE.md has the measured densities.

The graph (steps 1-3) is built without gradient: it only selects the neighbour sets, which have zero
derivative; gradients reach the extractor through message passing and L_CD. It is computed in float64.

Evaluation (``fedrane.lra-eval``):
  * ``inductive`` (default): each test sample x gets its own graph over S + {x}, S a fixed support set of
    training data (the client's own training rows for P-FL and the client-side evaluation, a seeded sample
    of the clients' training pool for the server's G-FL; see models/evaluation.py), so a prediction never
    depends on the other test samples. |S| = ``lra-support-size`` (0: batch-size - 1: test graphs have the
    training graphs' size). The support features F(S) are recomputed with the evaluated model's weights.
  * ``transductive``: the graph spans up to ``lra-eval-batch`` test samples (a prediction depends on its
    batch companions; the figure moves with the batch size).
  * ``identity``: G is skipped (predictor on F's features), as in the authors' code; only consistent with
    training when ``lra-alpha`` > 0 mixes Z into the predictor's input (h = alpha Z + (1 - alpha) Z_hat).
The neck counts the density of the graphs it builds (``LRANeck.stats``), for results.json.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import nn
import torch.nn.functional as F

from flcore.config import RunConfig
from flcore.methods.fedrane import FedRANEConfig, rane_config
from models.heads import make_hyperspherical
from models.fedrane.graph_attention import GATLayer


# ============================================================================ pure functions: the graph
def pearson_matrix(a: torch.Tensor, b: torch.Tensor | None = None, eps: float = 1e-8) -> torch.Tensor:
    """Pearson correlation between the rows of ``a`` and the rows of ``b`` (default ``a``): (..., n_a, n_b).

    Each row is centred over its features and scaled to unit norm (a constant row gets similarity 0 to
    everything, itself included). Differentiable.
    """
    ua = unit_rows(a, eps)
    ub = ua if b is None else unit_rows(b, eps)
    return ua @ ub.mT


def unit_rows(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Rows centred over the last dimension and scaled to unit norm (Pearson's building block)."""
    x = x - x.mean(dim=-1, keepdim=True)
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def _zero_diagonal(b: torch.Tensor) -> torch.Tensor:
    torch.diagonal(b, dim1=-2, dim2=-1).zero_()
    return b


def _eye_like(p: torch.Tensor) -> torch.Tensor:
    return torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)


def slim_objective(p: torch.Tensor, b: torch.Tensor, lam: float) -> float:
    """Eq. 2: 1/2 ||P - P B||_F^2 + lambda ||B||_* (nuclear norm = sum of singular values)."""
    fit = 0.5 * float(torch.linalg.matrix_norm(p - p @ b) ** 2)
    return fit + lam * float(torch.linalg.svdvals(b).sum())


def slim_b_step(p: torch.Tensor, lam: float, phi: torch.Tensor) -> torch.Tensor:
    """Exact minimiser of 1/2 ||P - P B||^2 + lambda/2 tr(B^T Phi B) s.t. diag(B) = 0, for fixed Phi.

    The problem separates over columns b_j: with S = P^T P + lambda Phi and H = S^{-1},
    b_j = H (P^T P)_j - mu_j H e_j with mu_j chosen so that b_jj = 0, i.e.
    B = H P^T P - H Diag(diag(H P^T P) / diag(H)).
    For Phi = I this is exactly the paper's Eq. 4, B_ij = -H_ij / H_jj (i != j), with
    H = (P^T P + lambda I)^{-1}.
    """
    ptp = p.mT @ p
    h = _spd_inverse(ptp + lam * phi)
    hp = h @ ptp
    diag_h = torch.diagonal(h, dim1=-2, dim2=-1)
    b = hp - h * (torch.diagonal(hp, dim1=-2, dim2=-1) / diag_h).unsqueeze(-2)
    return _zero_diagonal(b)  # zero up to round-off already


def _spd_inverse(s: torch.Tensor) -> torch.Tensor:
    """Inverse of symmetric positive-definite matrices (Cholesky; a plain inverse for any matrix where
    round-off breaks it, chosen per matrix)."""
    chol, info = torch.linalg.cholesky_ex(0.5 * (s + s.mT))
    inv = torch.cholesky_inverse(chol)
    bad = info != 0
    if bool(bad.any()):
        plain = torch.linalg.inv(s)
        inv = torch.where(bad[..., None, None], plain, inv) if inv.dim() > 2 else plain
    return inv


def inverse_sqrt_gram(b: torch.Tensor, eps: float) -> torch.Tensor:
    """Phi = (B B^T)^{-1/2} with the eigenvalues of B B^T clamped at eps * (largest eigenvalue)."""
    evals, evecs = torch.linalg.eigh(b @ b.mT)
    floor = (evals.amax(dim=-1, keepdim=True) * eps).clamp_min(torch.finfo(b.dtype).tiny)
    return (evecs * evals.clamp_min(floor).rsqrt().unsqueeze(-2)) @ evecs.mT


def slim_alternating(p: torch.Tensor, lam: float, iters: int = 5, eps: float = 1e-6,
                     rtol: float = 1e-6) -> torch.Tensor:
    """SLIM weights with the nuclear-norm penalty (Eq. 2) by alternating closed forms (Eq. 3-4).

    Starts from Phi = I (the paper's Eq. 4), then alternates Phi = (B B^T)^{-1/2} and the exact B-step
    of :func:`slim_b_step` until B changes by less than ``rtol`` (relative) or ``iters`` B-steps; with
    a batch of graphs, each graph stops on its own. Each step after the first is a majorise-minimise
    step of Eq. 2, since for any Phi > 0 ||B||_* <= 1/2 tr(B^T Phi B) + 1/2 tr(Phi^{-1}), with equality at
    Phi = (B B^T)^{-1/2}; so the objective does not increase (up to the eigenvalue clamp). Note: the paper
    writes the penalty as lambda tr(B^T Phi B), whose stationarity gives lambda (Phi + Phi^T) = 2 lambda Phi;
    we use the weight lambda Phi that makes each step a majorisation of Eq. 2 with the paper's lambda_G.
    """
    b = slim_b_step(p, lam, _eye_like(p))
    active = torch.ones(p.shape[:-2], dtype=torch.bool, device=p.device)
    for _ in range(iters - 1):
        phi = inverse_sqrt_gram(b, eps)
        b_new = slim_b_step(p, lam, phi)
        change = torch.linalg.matrix_norm(b_new - b) / torch.linalg.matrix_norm(b).clamp_min(1e-300)
        b = torch.where(active[..., None, None], b_new, b) if b.dim() > 2 else b_new
        active = active & (change >= rtol)
        if not bool(active.any()):
            break
    return b


def slim_closed_form(p: torch.Tensor, lam: float) -> torch.Tensor:
    """The authors' code (EASE): H = (P + lambda I)^{-1}, B_ij = -H_ij / H_jj, diag(B) = 0."""
    h = _spd_inverse(p + lam * _eye_like(p))
    b = -h / torch.diagonal(h, dim1=-2, dim2=-1).unsqueeze(-2)
    return _zero_diagonal(b)


def relational_adjacency(b: torch.Tensor) -> torch.Tensor:
    """A = (|B| + |B^T|) / 2 (symmetric, non-negative, zero diagonal when diag(B) = 0)."""
    return 0.5 * (b.abs() + b.abs().mT)


def neighbour_mask(a: torch.Tensor, topk: int = 0, cut: str = "none") -> torch.Tensor:
    """N_i as a boolean mask (..., n, n), diagonal excluded: the j with A_ij > 0 (``cut = none``, the paper's
    literal N_i) or A_ij > mean_{j' != i} A_ij' (``cut = row-mean``), then at most the ``topk`` largest A_ij
    of those per row (0: all).

    A node without neighbours (e.g. a graph of one) gets itself as its only neighbour, so that the
    attention softmax is defined.
    """
    n = a.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=a.device)
    mask = (a > 0) & ~eye
    if cut == "row-mean":
        if n > 1:
            off = a.masked_fill(eye, 0.0)
            mask &= off > off.sum(dim=-1, keepdim=True) / (n - 1)
    elif cut != "none":
        raise ValueError(f"unknown lra-cut '{cut}'")
    if 0 < topk < n - 1:
        candidates = a.masked_fill(~mask, float("-inf"))
        thresh = torch.topk(candidates, topk, dim=-1).values[..., -1:]
        mask &= candidates >= thresh
    lonely = ~mask.any(dim=-1)
    return mask | (eye & lonely.unsqueeze(-1))


def graph_density(mask: torch.Tensor) -> torch.Tensor:
    """Per node, the share of the other n - 1 nodes that are its neighbours (..., n); 0 for a graph of one."""
    n = mask.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=mask.device)
    return (mask & ~eye).sum(dim=-1).double() / max(n - 1, 1)


@torch.no_grad()
def graph_mask(z: torch.Tensor, cfg: FedRANEConfig) -> torch.Tensor:
    """Steps 1-3 for feature rows z (..., n, d): the boolean neighbour masks (..., n, n)."""
    return mask_from_pearson(pearson_matrix(z.detach().double()), cfg)


def complete_mask(p: torch.Tensor) -> torch.Tensor:
    """N_i under ``lra-cut = none`` without a SLIM solve (..., n, n): every other node, except that a node whose
    Pearson row is all zero (a constant feature row) is cut off from all and keeps only itself.

    Why this is the SLIM path's mask: with every A_ij > 0 an edge, the solve matters only through exact zeros
    of A = (|B| + |B^T|) / 2. A zero Pearson row/column makes (P^T P + lambda Phi) block-diagonal, so B_ij =
    B_ji = 0 between that node and every other (Eq. 4, and each alternation keeps the blocks); between nodes
    with non-zero rows B has no structural zero, so A_ij > 0. The two differ only by round-off: the alternating
    solve's eigendecompositions give a constant row relations of ~1e-16 of the others' instead of exact zeros
    (so it stayed linked to every node); here it is isolated, as in exact arithmetic and as the closed form
    gives it (tests/test_fedrane_code.py).
    """
    return mask_of_alive((p != 0).any(dim=-1))


def mask_of_alive(alive: torch.Tensor) -> torch.Tensor:
    """:func:`complete_mask` from its nodes' flags (..., n): True where the node's Pearson row is non-zero
    (its centred features are), i.e. exactly where ``p_ii`` > 0."""
    n = alive.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=alive.device)
    mask = alive.unsqueeze(-1) & alive.unsqueeze(-2) & ~eye
    lonely = ~mask.any(dim=-1)
    return mask | (eye & lonely.unsqueeze(-1))


def uses_complete_graph(cfg: FedRANEConfig) -> bool:
    """lra-cut = none without a top-k cap: the neighbour sets need no SLIM solve (:func:`complete_mask`)."""
    return cfg.lra_cut == "none" and cfg.lra_topk == 0


def mask_from_pearson(p: torch.Tensor, cfg: FedRANEConfig) -> torch.Tensor:
    """Steps 2-3 from the Pearson matrices (..., n, n). Under ``lra-cut = none`` without a top-k cap the SLIM
    weights decide nothing but structural zeros: :func:`complete_mask` (no solve)."""
    if uses_complete_graph(cfg):
        return complete_mask(p)
    if cfg.lra_graph == "closed-form":
        b = slim_closed_form(p, cfg.lra_lambda_g)
    else:
        b = slim_alternating(p, cfg.lra_lambda_g, cfg.lra_slim_iters, cfg.lra_slim_eps)
    return neighbour_mask(relational_adjacency(b), cfg.lra_topk, cfg.lra_cut)


batch_graph = graph_mask  # a minibatch's graph (n, d) -> (n, n)


@torch.no_grad()
def support_graphs(z_support: torch.Tensor, z_query: torch.Tensor, cfg: FedRANEConfig) -> torch.Tensor:
    """One graph per query row over [support rows; that query] (q, s + 1, s + 1): exactly
    ``graph_mask(cat(z_support, z_query[i:i+1]))`` for every i, built from the support's Pearson block
    once."""
    us = unit_rows(z_support.detach().double())
    uq = unit_rows(z_query.detach().double())
    q, s = uq.shape[0], us.shape[0]
    if uses_complete_graph(cfg):   # the same masks from the rows' flags, without the (q, s+1, s+1) Pearson blocks
        alive = torch.cat([(us != 0).any(dim=-1).expand(q, s), (uq != 0).any(dim=-1).unsqueeze(-1)], dim=-1)
        return mask_of_alive(alive)
    p = torch.empty(q, s + 1, s + 1, dtype=us.dtype, device=us.device)
    p[:, :s, :s] = us @ us.T
    cross = uq @ us.T                                   # (q, s)
    p[:, s, :s] = cross
    p[:, :s, s] = cross
    p[:, s, s] = (uq * uq).sum(dim=-1)
    return mask_from_pearson(p, cfg)


# ============================================================================ pure function: the loss
def cosine_matrix(a: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Cosine similarity between the rows of ``a`` (rows scaled to unit norm, not centred)."""
    u = a / a.norm(dim=-1, keepdim=True).clamp_min(eps)
    return u @ u.mT


def contrastive_discrimination(z: torch.Tensor, z_hat: torch.Tensor, tau: float = 0.8,
                               symmetric: bool = False, similarity: str = "pearson") -> torch.Tensor:
    """L_CD, Eq. 7: InfoNCE over the 2B rows of [Z; Z_hat] with Pearson similarity.

    L = -1/B sum_{i=1}^{B} log( exp(s(z_i, z_hat_i)/tau) / sum_{j != i, j <= 2B} exp(s(zbar_i, zbar_j)/tau) )
    (anchors z_i, positive z_hat_i, the other 2(B-1) rows negatives). ``symmetric`` also uses the rows
    of Z_hat as anchors and averages over all 2B (SimCLR, the authors' code). ``similarity``: pearson (Eq. 7)
    or cosine (the authors' code).
    """
    bsz = z.shape[0]
    zz = torch.cat([z, z_hat], dim=0)
    if similarity not in ("pearson", "cosine"):
        raise ValueError(f"unknown L_CD similarity '{similarity}' (pearson or cosine)")
    logits = (pearson_matrix(zz) if similarity == "pearson" else cosine_matrix(zz)) / tau
    n = 2 * bsz
    logits = logits.masked_fill(torch.eye(n, dtype=torch.bool, device=z.device), float("-inf"))
    target = torch.cat([torch.arange(bsz, n), torch.arange(0, bsz)]).to(z.device)
    rows = n if symmetric else bsz
    return F.cross_entropy(logits[:rows], target[:rows])


# ============================================================================ the module
class AttentiveMessagePassing(nn.Module):
    """One step of Eq. 5-6: h_i' = sum_{j in N_i} a_ij W h_j, a = masked softmax of (W_r h_i)^T (W_s h_j)/sqrt(d).

    Works on one graph (n, d) or a batch of graphs (..., n, d) with masks (..., n, n). W starts as the
    identity (so initially h_i' is an attention-weighted mean of the neighbours' features); W_r, W_s take
    PyTorch's default initialisation.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Linear(dim, dim, bias=False)
        self.w_r = nn.Linear(dim, dim, bias=False)
        self.w_s = nn.Linear(dim, dim, bias=False)
        with torch.no_grad():
            self.w.weight.copy_(torch.eye(dim))
        self.scale = 1.0 / math.sqrt(dim)

    def attention(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = (self.w_r(h) @ self.w_s(h).mT) * self.scale
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.attention(h, mask) @ self.w(h)


class GraphStats:
    """Running sums of the graph densities the neck built since the last :meth:`pop` (train and eval apart).

    One object per neck for its whole life, so that a pooled client model (client_app/model_pool.py) looks
    unchanged; whoever reads it pops it.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, list[float]] = {"train": [0.0, 0.0, 0.0], "eval": [0.0, 0.0, 0.0]}

    def add(self, phase: str, density: torch.Tensor, nodes: int) -> None:
        """``density``: the density of the counted nodes (one value each); ``nodes``: graph size."""
        s = self.sums[phase]
        s[0] += float(density.sum())
        s[1] += float(density.numel())
        s[2] += float(nodes) * float(density.numel())

    def mean(self, phase: str) -> tuple[float, float] | None:
        """(mean density, mean graph size) over the counted nodes, None if none."""
        total, count, nodes = self.sums[phase]
        return (total / count, nodes / count) if count else None

    def pop(self, phase: str) -> tuple[float, float] | None:
        out = self.mean(phase)
        self.sums[phase] = [0.0, 0.0, 0.0]
        return out


class LRANeck(nn.Module):
    """G: Z -> Z_hat by relational graph + L message-passing steps; the federated part of LRA."""

    def __init__(self, dim: int, cfg: FedRANEConfig, support_size: int = 64) -> None:
        super().__init__()
        self.cfg = cfg
        layer = GATLayer if cfg.lra_gnn == "gat" else AttentiveMessagePassing
        self.layers = nn.ModuleList(layer(dim) for _ in range(cfg.lra_steps))
        # the generator of training-time dropout (fedrane.lra-dropout): the trainer sets its job's seeded one
        self.generator: torch.Generator | None = None
        # rows of training data an inductive evaluation needs (the evaluation-support protocol of
        # models/evaluation.py: eval_support_size / set_eval_support / pop_eval_stats)
        self.eval_support_size = support_size if cfg.lra_eval == "inductive" else 0
        self.support: tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]] | None = None
        self.stats = GraphStats()

    # --------------------------------------------------------------------------- message passing
    def propagate(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """h^L from h^0 = z over the given graph(s) (Eq. 5)."""
        h = z
        for layer in self.layers:
            h = h + layer(h, mask) if self.cfg.lra_residual else layer(h, mask)
            h = self.dropout(h)
        return F.normalize(h, dim=-1) if self.cfg.lra_out_norm else h

    def dropout(self, h: torch.Tensor) -> torch.Tensor:
        """Inverted dropout with rate ``lra-dropout`` in training, masks drawn from :attr:`generator`."""
        p = self.cfg.lra_dropout
        if not self.training or p == 0.0:
            return h
        if self.generator is None:
            raise RuntimeError("LRA dropout (fedrane.lra-dropout > 0) in training needs the trainer's seeded "
                               "generator on neck.generator")
        keep = torch.rand(h.shape, generator=self.generator, device=self.generator.device) >= p
        return h * keep.to(h.device, h.dtype) / (1.0 - p)

    def augment(self, z: torch.Tensor) -> torch.Tensor:
        """Z_hat = h^L for a minibatch, whose rows are the graph's nodes (training, transductive)."""
        mask = graph_mask(z, self.cfg)
        self.stats.add("train" if self.training else "eval", graph_density(mask), z.shape[0])
        return self.propagate(z, mask)

    def augment_inductive(self, z: torch.Tensor) -> torch.Tensor:
        """Z_hat of each row of ``z`` from its own graph over [Z_S; z_i] (Z_S = F(support) with the current
        weights): row i's result does not depend on any other row of ``z``."""
        if self.support is None:
            raise RuntimeError("LRA inductive evaluation (fedrane.lra-eval = 'inductive') needs a support set of "
                               "training data: attach one with models.evaluation.eval_support / set_eval_support, "
                               "or set fedrane.lra-eval to 'transductive' or 'identity'")
        x_s, features = self.support
        z_s = features(x_s).to(z.dtype)
        s = z_s.shape[0]
        masks = support_graphs(z_s, z, self.cfg)                        # (q, s + 1, s + 1)
        self.stats.add("eval", graph_density(masks)[:, s], s + 1)       # the test node's own neighbourhood
        nodes = torch.cat([z_s.unsqueeze(0).expand(z.shape[0], s, z.shape[1]), z.unsqueeze(1)], dim=1)
        return self.propagate(nodes, masks)[:, s]

    def mix(self, z: torch.Tensor, z_hat: torch.Tensor) -> torch.Tensor:
        """Predictor input alpha Z + (1 - alpha) Z_hat (alpha = 0: Z_hat, the paper)."""
        a = self.cfg.lra_alpha
        return z_hat if a == 0.0 else a * z + (1.0 - a) * z_hat

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.mix(z, self.augment(z))
        mode = self.cfg.lra_eval
        if mode == "identity":
            return z
        if mode == "inductive":
            return self.mix(z, self.augment_inductive(z))
        step = self.cfg.lra_eval_batch
        return torch.cat([self.mix(zc, self.augment(zc)) for zc in z.split(step)]) if z.shape[0] else z

    # --------------------------------------------------------------------------- evaluation protocol
    def set_eval_support(self, x: torch.Tensor | None,
                         features: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """Attach (rows of training data, the model's feature extractor) for inductive evaluation; None detaches."""
        if x is None:
            self.support = None
            return
        if features is None or x.shape[0] == 0:
            raise ValueError("an LRA support set needs at least one row of training data and the model's "
                             "feature extractor")
        self.support = (x, features)

    def pop_eval_stats(self) -> dict[str, Any]:
        """What the evaluations since the last call built: mode, mean density of the evaluated samples' graph
        neighbourhoods, mean graph size (|S| + 1 inductive; the batch size transductive)."""
        got = self.stats.pop("eval")
        if got is None:
            return {}
        return {"lra_eval": self.cfg.lra_eval, "lra_graph_density": got[0], "lra_graph_nodes": got[1]}


def support_size(cfg: RunConfig) -> int:
    """|S| of inductive evaluation: ``fedrane.lra-support-size``, or batch-size - 1 when it is 0 (at least 1)."""
    size = rane_config(cfg).lra_support_size
    return size if size > 0 else max(cfg.batch_size - 1, 1)


def add_lra_neck(model: nn.Module, cfg: RunConfig) -> None:
    """Model hook (flcore/registry.py): install LRA as ``model.neck`` (federated with the rest); with
    ``hypersphere`` also unit-norm features and the fixed orthogonal classifier (models/heads.py)."""
    rane = rane_config(cfg)
    if rane.hypersphere:
        if cfg.head != "linear":
            raise ValueError(f"method '{cfg.method}' with hypersphere = true fixes its own orthogonal classifier; "
                             f"run-config key 'head' must be 'linear' (the default), got '{cfg.head}'")
        make_hyperspherical(model, cfg.seed, rane.hypersphere_scale)
    model.neck = LRANeck(int(model.feature_dim), rane, support_size(cfg))
