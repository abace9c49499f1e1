"""FedRANE's client side: LRA, local relational augmentation (seed 000, Sec. 3.3), as the model's neck.

Per minibatch of features Z = F(X) (B x d):
  1. P = Pearson correlation of the B rows of Z                                   (Sec. 3.3)
  2. SLIM subspace weights B with a nuclear-norm penalty                           (Eq. 2-4)
         min_B 1/2 ||P - P B||_F^2 + lambda_G ||B||_*   s.t. diag(B) = 0,
     solved by alternating closed forms (``lra-graph = alternating``) or the authors' one-shot
     EASE form (``lra-graph = closed-form``).
  3. A = (|B| + |B^T|) / 2, neighbours N_i = {j : A_ij > 0}                        (Sec. 3.3)
  4. L steps of attentive message passing over N_i                                 (Eq. 5-6)
         h_i^{l+1} = [h_i^l +] sum_{j in N_i} a_ij W^l h_j^l,
         a_ij = softmax_{j in N_i} ((W_r^l h_i)^T (W_s^l h_j) / sqrt(d)),   Z_hat = h^L.
     The residual term h_i^l (``fedrane.lra-residual``, default on) is the authors' code's (their attention layer
     adds its input back); the paper's Eq. 5 omits it. Without it, Z_hat_i is built from the *other*
     samples only (diag(A) = 0), and on the dense SLIM graph (every A_ij > 0, so N_i = all j != i
     unless ``fedrane.lra-topk`` > 0) the attention starts near uniform: Z_hat_i is then about the batch mean for
     every i and the predictor cannot tell samples apart. Centrally on digits the literal form stayed
     at the chance-level loss ln 10 for 8 epochs; the residual form trains.
  5. Contrastive discrimination L_CD over [Z; Z_hat] with Pearson similarity        (Eq. 7)
     (used by client_app/trainers/fedrane.py: loss = CE(head(Z_hat), y) + lambda_CD L_CD, Eq. 9).

Neighbourhoods: neither SLIM form yields exact zeros, so the paper's N_i = {j : A_ij > 0} is every other
sample of the batch and the graph only excludes i itself. ``fedrane.lra-topk`` = k keeps the k strongest SLIM
relations per node, which is what makes the graph matter; our experiments use k = 5 (a model trained with
the dense graph scored 0.69 G-FL on digits under dense relational evaluation and 0.82 under top-5).

The graph (steps 1-3) is built without gradient: it only selects the neighbour sets, which have zero
derivative; gradients reach the extractor through message passing and L_CD. It is computed in float64.

Evaluation (``fedrane.lra-eval``): the paper's network is F -> G -> predictor, so by default (``relational``) the
neck runs at evaluation too, over whatever batch it is given: the server's central evaluation passes
test batches of 512 (fixed order), P-FL passes a client's local test split. Predictions then depend on
the other samples of the batch (transductive). ``identity`` skips G at evaluation, as the authors'
code does (predictor on F's features); it is only consistent with training when ``fedrane.lra-alpha`` > 0
mixes Z into the predictor's input (h = alpha Z + (1 - alpha) Z_hat; the code's ``reg_graph_aug``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F

from flcore.config import RunConfig
from flcore.methods.fedrane import FedRANEConfig


# ============================================================================ pure functions: the graph
def pearson_matrix(a: torch.Tensor, b: torch.Tensor | None = None, eps: float = 1e-8) -> torch.Tensor:
    """Pearson correlation between the rows of ``a`` and the rows of ``b`` (default ``a``): (n_a, n_b).

    Each row is centred over its features and scaled to unit norm (a constant row gets similarity 0 to
    everything, itself included). Differentiable.
    """
    def unit(x: torch.Tensor) -> torch.Tensor:
        x = x - x.mean(dim=1, keepdim=True)
        return x / x.norm(dim=1, keepdim=True).clamp_min(eps)

    ua = unit(a)
    ub = ua if b is None else unit(b)
    return ua @ ub.T


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
    ptp = p.T @ p
    h = _spd_inverse(ptp + lam * phi)
    hp = h @ ptp
    b = hp - h * (torch.diagonal(hp) / torch.diagonal(h)).unsqueeze(0)
    return b.fill_diagonal_(0.0)  # zero up to round-off already


def _spd_inverse(s: torch.Tensor) -> torch.Tensor:
    """Inverse of a symmetric positive-definite matrix (Cholesky; plain inverse if round-off breaks it)."""
    chol, info = torch.linalg.cholesky_ex(0.5 * (s + s.T))
    if int(info) != 0:
        return torch.linalg.inv(s)
    return torch.cholesky_inverse(chol)


def inverse_sqrt_gram(b: torch.Tensor, eps: float) -> torch.Tensor:
    """Phi = (B B^T)^{-1/2} with the eigenvalues of B B^T clamped at eps * (largest eigenvalue)."""
    evals, evecs = torch.linalg.eigh(b @ b.T)
    floor = max(float(evals.max()) * eps, torch.finfo(b.dtype).tiny)
    return (evecs * evals.clamp_min(floor).rsqrt().unsqueeze(0)) @ evecs.T


def slim_alternating(p: torch.Tensor, lam: float, iters: int = 5, eps: float = 1e-6,
                     rtol: float = 1e-6) -> torch.Tensor:
    """SLIM weights with the nuclear-norm penalty (Eq. 2) by alternating closed forms (Eq. 3-4).

    Starts from Phi = I (the paper's Eq. 4), then alternates Phi = (B B^T)^{-1/2} and the exact B-step
    of :func:`slim_b_step` until B changes by less than ``rtol`` (relative) or ``iters`` B-steps.
    Each step after the first is a majorise-minimise step of Eq. 2, since for any Phi > 0
    ||B||_* <= 1/2 tr(B^T Phi B) + 1/2 tr(Phi^{-1}), with equality at Phi = (B B^T)^{-1/2}; so the
    objective does not increase (up to the eigenvalue clamp). Note: the paper writes the penalty as
    lambda tr(B^T Phi B), whose stationarity gives lambda (Phi + Phi^T) = 2 lambda Phi; we use the
    weight lambda Phi that makes each step a majorisation of Eq. 2 with the paper's lambda_G.
    """
    n = p.shape[0]
    eye = torch.eye(n, dtype=p.dtype, device=p.device)
    b = slim_b_step(p, lam, eye)
    for _ in range(iters - 1):
        phi = inverse_sqrt_gram(b, eps)
        b_new = slim_b_step(p, lam, phi)
        change = torch.linalg.matrix_norm(b_new - b) / torch.linalg.matrix_norm(b).clamp_min(1e-300)
        b = b_new
        if float(change) < rtol:
            break
    return b


def slim_closed_form(p: torch.Tensor, lam: float) -> torch.Tensor:
    """The authors' code (EASE): H = (P + lambda I)^{-1}, B_ij = -H_ij / H_jj, diag(B) = 0."""
    n = p.shape[0]
    h = _spd_inverse(p + lam * torch.eye(n, dtype=p.dtype, device=p.device))
    b = -h / torch.diagonal(h).unsqueeze(0)
    return b.fill_diagonal_(0.0)


def relational_adjacency(b: torch.Tensor) -> torch.Tensor:
    """A = (|B| + |B^T|) / 2 (symmetric, non-negative, zero diagonal when diag(B) = 0)."""
    return 0.5 * (b.abs() + b.abs().T)


def neighbour_mask(a: torch.Tensor, topk: int = 0) -> torch.Tensor:
    """N_i = {j : A_ij > 0}, optionally only the ``topk`` largest A_ij per row. Diagonal excluded.

    A node without neighbours (e.g. a batch of one) gets itself as its only neighbour, so that the
    attention softmax is defined.
    """
    n = a.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=a.device)
    mask = (a > 0) & ~eye
    if 0 < topk < n - 1:
        thresh = torch.topk(a.masked_fill(eye, float("-inf")), topk, dim=1).values[:, -1:]
        mask &= a >= thresh
    lonely = ~mask.any(dim=1)
    return mask | (eye & lonely.unsqueeze(1))


@torch.no_grad()
def batch_graph(z: torch.Tensor, cfg: FedRANEConfig) -> torch.Tensor:
    """Steps 1-3 for a minibatch of features: the boolean neighbour mask (B x B)."""
    p = pearson_matrix(z.detach().double())
    if cfg.lra_graph == "closed-form":
        b = slim_closed_form(p, cfg.lra_lambda_g)
    else:
        b = slim_alternating(p, cfg.lra_lambda_g, cfg.lra_slim_iters, cfg.lra_slim_eps)
    return neighbour_mask(relational_adjacency(b), cfg.lra_topk)


# ============================================================================ pure function: the loss
def contrastive_discrimination(z: torch.Tensor, z_hat: torch.Tensor, tau: float = 0.8,
                               symmetric: bool = False) -> torch.Tensor:
    """L_CD, Eq. 7: InfoNCE over the 2B rows of [Z; Z_hat] with Pearson similarity.

    L = -1/B sum_{i=1}^{B} log( exp(s(z_i, z_hat_i)/tau) / sum_{j != i, j <= 2B} exp(s(zbar_i, zbar_j)/tau) )
    (anchors z_i, positive z_hat_i, the other 2(B-1) rows negatives). ``symmetric`` also uses the rows
    of Z_hat as anchors and averages over all 2B (SimCLR, the authors' code).
    """
    bsz = z.shape[0]
    zz = torch.cat([z, z_hat], dim=0)
    logits = pearson_matrix(zz) / tau
    n = 2 * bsz
    logits = logits.masked_fill(torch.eye(n, dtype=torch.bool, device=z.device), float("-inf"))
    target = torch.cat([torch.arange(bsz, n), torch.arange(0, bsz)]).to(z.device)
    rows = n if symmetric else bsz
    return F.cross_entropy(logits[:rows], target[:rows])


# ============================================================================ the module
class AttentiveMessagePassing(nn.Module):
    """One step of Eq. 5-6: h_i' = sum_{j in N_i} a_ij W h_j, a = masked softmax of (W_r h_i)^T (W_s h_j)/sqrt(d).

    W starts as the identity (so initially h_i' is an attention-weighted mean of the neighbours'
    features); W_r, W_s take PyTorch's default initialisation.
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
        scores = (self.w_r(h) @ self.w_s(h).T) * self.scale
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=1)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.attention(h, mask) @ self.w(h)


class LRANeck(nn.Module):
    """G: Z -> Z_hat by relational graph + L message-passing steps; the federated part of LRA."""

    def __init__(self, dim: int, cfg: FedRANEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(AttentiveMessagePassing(dim) for _ in range(cfg.lra_steps))

    def augment(self, z: torch.Tensor) -> torch.Tensor:
        """Z_hat = h^L for a minibatch (Eq. 5)."""
        mask = batch_graph(z, self.cfg)
        h = z
        for layer in self.layers:
            h = h + layer(h, mask) if self.cfg.lra_residual else layer(h, mask)
        return h

    def mix(self, z: torch.Tensor, z_hat: torch.Tensor) -> torch.Tensor:
        """Predictor input alpha Z + (1 - alpha) Z_hat (alpha = 0: Z_hat, the paper)."""
        a = self.cfg.lra_alpha
        return z_hat if a == 0.0 else a * z + (1.0 - a) * z_hat

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if not self.training and self.cfg.lra_eval == "identity":
            return z
        return self.mix(z, self.augment(z))


def add_lra_neck(model: nn.Module, cfg: RunConfig) -> None:
    """Model hook (flcore/registry.py): install LRA as ``model.neck`` (federated with the rest)."""
    model.neck = LRANeck(int(model.feature_dim), cfg.section(FedRANEConfig))
