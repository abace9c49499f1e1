"""FedRANE's relation graphs (seed 000, Sec. 3.3), steps 1-3 of LRA (models/fedrane/neck.py): which samples of
a graph exchange messages.

Per graph of n feature rows Z (n x d; a training minibatch, or a test sample with its support set):
  1. P = Pearson correlation of the n rows of Z                                    (Sec. 3.3)
  2. SLIM subspace weights B with a nuclear-norm penalty                           (Eq. 2-4)
         min_B 1/2 ||P - P B||_F^2 + lambda_G ||B||_*   s.t. diag(B) = 0,
     solved by alternating closed forms (``lra-graph = alternating``; B-step ``lra-slim-update``: Eq. 4 as
     written, or our majorise-minimise step) or the authors' one-shot EASE form (``lra-graph = closed-form``).
  3. A = (|B| + |B^T|) / 2; neighbours N_i: the edges A_ij that the cut keeps (below)  (Sec. 3.3)

Every graph function accepts leading batch dimensions (..., n, n) and treats each graph on its own (a
graph's result never depends on another graph of the batch, convergence tests included).

Neighbourhoods (``fedrane.lra-cut``, ``fedrane.lra-topk``): the paper mines "sparse" relations with SLIM but its
Eq. 2 has no sparsity term (only the nuclear norm), and neither SLIM form yields exact zeros, so its literal
N_i = {j : A_ij > 0} is every other node (``lra-cut = none``: the complete graph, where the SLIM solve changes
nothing): the default, as the paper writes it. Our repair ``row-mean`` (fedrane-repaired) keeps
A_ij > mean_{j' != i} A_ij': the relations stronger than node i's average one. It has no parameter, does not depend on the graph's size, and lets a node's degree follow its
relations (a sample unlike the rest keeps few neighbours: the paper's concern about minority samples
contaminated by the majority). ``lra-topk`` = k additionally keeps at most the k strongest per node.
docs/FEDRANE.md has the measured densities.

The graph (steps 1-3) is built without gradient: it only selects the neighbour sets, which have zero
derivative; gradients reach the extractor through message passing and L_CD. It is computed in float64.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from flcore.methods.fedrane import FedRANEConfig


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


@lru_cache(maxsize=64)
def eye(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The (n, n) identity, made once per (n, dtype, device) and shared: a constant, never written to (every
    caller builds new tensors from it). Built outside inference mode, so that autograd may save it."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.eye(n, dtype=dtype, device=device)


@lru_cache(maxsize=64)
def off_diagonal(n: int, device: torch.device) -> torch.Tensor:
    """``~eye(n)`` as a boolean (n, n) constant, cached as :func:`eye`."""
    with torch.inference_mode(False), torch.no_grad():
        return ~eye(n, torch.bool, device)


def _eye_like(p: torch.Tensor) -> torch.Tensor:
    return eye(p.shape[-1], p.dtype, p.device)


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


def slim_paper_b_step(p: torch.Tensor, lam: float, phi: torch.Tensor) -> torch.Tensor:
    """Eq. 4 as the paper writes it, for fixed Phi: H = (P^T P + lambda (Phi + Phi^T))^{-1}, B_ij = -H_ij / H_jj
    (i != j), B_ii = 0. For Phi = c I it is the exact minimiser of Eq. 3 under diag(B) = 0 (:func:`slim_b_step`
    with the weight 2 lambda c); for other Phi it is the paper's closed form, not that minimiser."""
    h = _spd_inverse(p.mT @ p + lam * (phi + phi.mT))
    b = -h / torch.diagonal(h, dim1=-2, dim2=-1).unsqueeze(-2)
    return _zero_diagonal(b)


def slim_alternating(p: torch.Tensor, lam: float, iters: int = 5, eps: float = 1e-6,
                     rtol: float = 1e-6, update: str = "paper") -> torch.Tensor:
    """SLIM weights with the nuclear-norm penalty (Eq. 2) by alternating B- and Phi-updates (Eqs. 3-4).

    Starts from Phi = I, then alternates the B-step and Phi = (B B^T)^{-1/2} until B changes by less than
    ``rtol`` (relative) or ``iters`` B-steps; with a batch of graphs, each graph stops on its own. B-step
    (``update``):

    * ``paper`` (fedrane.lra-slim-update's default): Eq. 4 as written, H = (P^T P + lambda (Phi + Phi^T))^{-1},
      B_ij = -H_ij / H_jj (:func:`slim_paper_b_step`): the stationarity of Eq. 3's lambda tr(B^T Phi B) gives
      lambda (Phi + Phi^T).
    * ``majorize`` (ours before issue 40, fedrane-repaired): the exact minimiser of 1/2 ||P - PB||^2 +
      lambda/2 tr(B^T Phi B) under diag(B) = 0 (:func:`slim_b_step`). Since ||B||_* <= 1/2 tr(B^T Phi B) +
      1/2 tr(Phi^{-1}) for any Phi > 0, with equality at Phi = (B B^T)^{-1/2}, each step after the first is a
      majorise-minimise step of Eq. 2 with the paper's lambda_G: the objective does not increase (up to the
      eigenvalue clamp). The paper's form weighs the penalty twice (2 lambda Phi for symmetric Phi).
    """
    if update not in ("paper", "majorize"):
        raise ValueError(f"unknown lra-slim-update '{update}' (paper or majorize)")
    step = slim_paper_b_step if update == "paper" else slim_b_step
    b = step(p, lam, _eye_like(p))
    active = torch.ones(p.shape[:-2], dtype=torch.bool, device=p.device)
    for _ in range(iters - 1):
        phi = inverse_sqrt_gram(b, eps)
        b_new = step(p, lam, phi)
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
    diag = eye(n, torch.bool, a.device)
    mask = (a > 0) & off_diagonal(n, a.device)
    if cut == "row-mean":
        if n > 1:
            off = a.masked_fill(diag, 0.0)
            mask &= off > off.sum(dim=-1, keepdim=True) / (n - 1)
    elif cut != "none":
        raise ValueError(f"unknown lra-cut '{cut}'")
    if 0 < topk < n - 1:
        candidates = a.masked_fill(~mask, float("-inf"))
        thresh = torch.topk(candidates, topk, dim=-1).values[..., -1:]
        mask &= candidates >= thresh
    return with_lonely_loops(mask)


def graph_density(mask: torch.Tensor) -> torch.Tensor:
    """Per node, the share of the other n - 1 nodes that are its neighbours (..., n); 0 for a graph of one."""
    n = mask.shape[-1]
    # the neighbour counts summed straight into float64: the same integers as an int64 sum cast to double
    return (mask & off_diagonal(n, mask.device)).sum(dim=-1, dtype=torch.float64) / max(n - 1, 1)


@torch.no_grad()
def graph_mask(z: torch.Tensor, cfg: FedRANEConfig) -> torch.Tensor:
    """Steps 1-3 for feature rows z (..., n, d): the boolean neighbour masks (..., n, n)."""
    return mask_from_pearson(pearson_matrix(z.double()), cfg)  # no_grad: no detach needed


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
    mask = alive.unsqueeze(-1) & alive.unsqueeze(-2) & off_diagonal(n, alive.device)
    return with_lonely_loops(mask)


def with_lonely_loops(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (..., n, n, diagonal all False, a fresh tensor: written in place) with a self-loop for each node
    that has no neighbour, so that its attention softmax is defined: ``mask | (eye & lonely)``, by writing the
    diagonal (fewer operations than the or of an (n, n) product)."""
    lonely = ~mask.any(dim=-1)
    torch.diagonal(mask, dim1=-2, dim2=-1).copy_(lonely)
    return mask


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
        b = slim_alternating(p, cfg.lra_lambda_g, cfg.lra_slim_iters, cfg.lra_slim_eps,
                             update=cfg.lra_slim_update)
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
