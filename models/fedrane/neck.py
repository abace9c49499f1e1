"""FedRANE's LRA, local relational augmentation (seed 000, Sec. 3.3; docs/METHODS.md), as the model's neck: built
on both sides (the clients train it, the server evaluates the global model through it).

Per graph of n feature rows Z (n x d; a training minibatch, or a test sample with its support set):
  1-3. the relation graph over the rows: Pearson correlations, SLIM weights, neighbour sets N_i
     (models/fedrane/relation_graph.py)
  4. L steps of attentive message passing over N_i                                 (Eq. 5-6)
         h_i^{l+1} = [h_i^l +] sum_{j in N_i} a_ij W^l h_j^l,
         a_ij = softmax_{j in N_i} ((W_r^l h_i)^T (W_s^l h_j) / sqrt(d)),   Z_hat = h^L.
     The default is Eq. 5 as written, without the residual term h_i^l, as the GAT the authors' code runs
     (graph_models.py GAT.forward). Then Z_hat_i is built from the *other* samples only (diag(A) = 0); centrally
     on digits that literal form stayed at the chance-level loss ln 10 for 8 epochs on the complete graph, while
     the residual form trains: the residual (``lra-residual = true``) is our repair, fedrane-repaired's default.
  5. Contrastive discrimination L_CD over [Z; Z_hat] with Pearson similarity        (Eq. 7)
     (used by client_app/trainers/fedrane.py: loss = CE(predictor(Z_hat), y) + lambda_CD L_CD, Eq. 9).
The predictor (the model's head) is the paper's multi-layer perceptron by default (models/fedrane/predictor.py,
``lra-predictor``), installed by the model hook below with the neck.

Evaluation (``fedrane.lra-eval``):
  * ``identity`` (default): G is skipped (predictor on F's features): the paper states no evaluation graph, and
    the authors' code evaluates without one (serverFedRANE.py FedRANE.evaluate, clientFedRANE.py test_metrics).
    With ``lra-alpha`` = 0 the predictor is trained on Z_hat only, so it then sees another input at test time.
  * ``inductive`` (our repair, fedrane-repaired): each test sample x gets its own graph over S + {x}, S a fixed
    support set of training data (the client's own training rows for P-FL and the client-side evaluation, a
    seeded sample of the clients' training pool for the server's G-FL; see models/evaluation.py), so a
    prediction never depends on the other test samples. |S| = ``lra-support-size`` (0: batch-size - 1: test graphs
    have the training graphs' size). The support features F(S) are recomputed with the evaluated model's weights.
  * ``transductive``: the graph spans up to ``lra-eval-batch`` test samples (a prediction depends on its
    batch companions; the figure moves with the batch size).
The neck counts the density of the graphs it builds (``LRANeck.stats``), for results.json.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Callable

import torch
from torch import nn
import torch.nn.functional as F

from flcore.config import RunConfig
from flcore.methods.fedrane import FedRANEConfig, rane_config
from models.base import FLModel
from models.heads import LinearHead, make_hyperspherical
from models.device_sum import DeviceSum
from models.fedrane.graph_attention import GATLayer
from models.fedrane.predictor import MLPPredictor, cnn_model
from models.fedrane.relation_graph import (eye, graph_density, graph_mask, off_diagonal, pearson_matrix,
                                          support_graphs)


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
    logits = logits.masked_fill(eye(n, torch.bool, z.device), float("-inf"))
    rows = n if symmetric else bsz
    return F.cross_entropy(logits[:rows], positives(bsz, rows, z.device))


@lru_cache(maxsize=64)
def positives(bsz: int, rows: int, device: torch.device) -> torch.Tensor:
    """L_CD's targets for the first ``rows`` anchors of [Z; Z_hat]: row i's positive is row i + B (i < B), row
    i - B otherwise. A constant per (B, rows, device), made once and never written to."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.cat([torch.arange(bsz, 2 * bsz), torch.arange(0, bsz)])[:rows].to(device)


def clear_constants() -> None:
    """Forget the cached constants (eye, off-diagonal masks, L_CD targets): a benchmark that counts a step's
    operations as the difference of two runs starts both from the same empty caches."""
    eye.cache_clear()
    off_diagonal.cache_clear()
    positives.cache_clear()


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
    unchanged; whoever reads it pops it. The density sum stays on the graphs' device (models/device_sum.py) and
    is read once, by :meth:`mean`: building a graph costs no host synchronisation. The counts come from shapes.
    """

    def __init__(self) -> None:
        self.sums: dict[str, tuple[DeviceSum, list[float]]] = {}
        self.reset()

    def reset(self) -> None:
        for phase in ("train", "eval"):
            self._clear(phase)

    def _clear(self, phase: str) -> None:
        self.sums[phase] = (DeviceSum(), [0.0, 0.0])  # density sum; [counted nodes, node-weighted graph size]

    def add(self, phase: str, density: torch.Tensor, nodes: int) -> None:
        """``density``: the density of the counted nodes (float64, one value each); ``nodes``: graph size."""
        total, counts = self.sums[phase]
        total.add(density.sum())
        counts[0] += float(density.numel())
        counts[1] += float(nodes) * float(density.numel())

    def mean(self, phase: str) -> tuple[float, float] | None:
        """(mean density, mean graph size) over the counted nodes, None if none."""
        total, (count, nodes) = self.sums[phase]
        return (total.value() / count, nodes / count) if count else None

    def pop(self, phase: str) -> tuple[float, float] | None:
        out = self.mean(phase)
        self._clear(phase)
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
        # non-blocking: the mask is drawn on the generator's device (the CPU); a blocking copy to a GPU would
        # wait for the device's queue every step
        return h * keep.to(h.device, non_blocking=True).to(h.dtype) / (1.0 - p)

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


def add_predictor(model: FLModel, cfg: RunConfig) -> None:
    """Model hook of FedRANE's network without the neck (fedrane-no-lra) and first part of :func:`add_lra_neck`:
    with ``flat-features`` and model = convnet the authors' CNNModel extractor (models/fedrane/predictor.py);
    with ``hypersphere`` unit-norm features and the fixed orthogonal classifier (models/heads.py); else the
    predictor ``lra-predictor`` (mlp: the paper's multi-layer perceptron; linear: the model's linear head)."""
    rane = rane_config(cfg)
    if rane.flat_features and getattr(model, "backbone_name", None) == "convnet":
        model.backbone, model.feature_dim = cnn_model(tuple(model.input_shape))
        model.head = LinearHead(int(model.feature_dim), int(model.num_classes))
    if rane.hypersphere:
        if cfg.head != "linear":
            raise ValueError(f"method '{cfg.method}' with hypersphere = true fixes its own orthogonal classifier; "
                             f"run-config key 'head' must be 'linear' (the default), got '{cfg.head}'")
        if rane.lra_predictor != "linear":
            raise ValueError(f"method '{cfg.method}': hypersphere = true fixes a linear orthogonal classifier; "
                             f"set {rane.NAME}.lra-predictor = 'linear' (got '{rane.lra_predictor}')")
        make_hyperspherical(model, cfg.seed, rane.hypersphere_scale)
    elif rane.lra_predictor == "mlp":
        if cfg.head != "linear":
            raise ValueError(f"method '{cfg.method}' with {rane.NAME}.lra-predictor = 'mlp' puts its own predictor "
                             f"on the features; run-config key 'head' must be 'linear' (the default), got "
                             f"'{cfg.head}' (or set {rane.NAME}.lra-predictor = 'linear')")
        model.head = MLPPredictor(int(model.feature_dim), int(model.num_classes), rane.lra_predictor_hidden)


def add_lra_neck(model: FLModel, cfg: RunConfig) -> None:
    """Model hook (flcore/registry.py): :func:`add_predictor`, then LRA as ``model.neck`` (federated with the
    rest)."""
    add_predictor(model, cfg)
    model.neck = LRANeck(int(model.feature_dim), rane_config(cfg), support_size(cfg))
