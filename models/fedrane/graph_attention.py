"""The FedRANE authors' message-passing layer (``fedrane.lra-gnn = gat``), written from its description in their
code (XeniaLLL/HyperFed_and_FedRANE-master, system/flcore/trainmodel/graph_models.py: GAT, GraphAttentionLayer,
Attention): H attention heads, averaged; in each head Wh = W h, e_ij = LeakyReLU_{0.1}(a^T [Wh_i ; Wh_j]),
attention = softmax of e_ij over the neighbours j of i, output ELU(sum_j att_ij Wh_j). W and a are
Xavier-uniform initialised. Works on one graph (n, d) or a batch of graphs (..., n, d) with masks (..., n, n).

The additive score a^T [Wh_i ; Wh_j] = a_1^T Wh_i + a_2^T Wh_j is computed as the sum of two per-node scores
(the same number as the pairwise concatenation, without its (n, n, 2d) tensor).
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F


class GATHead(nn.Module):
    def __init__(self, dim: int, slope: float = 0.1) -> None:
        super().__init__()
        self.w = nn.Linear(dim, dim, bias=False)
        self.a = nn.Linear(2 * dim, 1, bias=False)
        nn.init.xavier_uniform_(self.w.weight)
        nn.init.xavier_uniform_(self.a.weight)
        self.slope = slope

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        wh = self.w(h)
        d = wh.shape[-1]
        a_src, a_dst = self.a.weight[0, :d], self.a.weight[0, d:]
        e = F.leaky_relu((wh @ a_src).unsqueeze(-1) + (wh @ a_dst).unsqueeze(-2), negative_slope=self.slope)
        att = torch.softmax(e.masked_fill(~mask, float("-inf")), dim=-1)
        return F.elu(att @ wh)


class GATLayer(nn.Module):
    """The mean of ``heads`` :class:`GATHead` outputs (the authors' GraphAttentionLayer, concat = False)."""

    def __init__(self, dim: int, heads: int = 2, slope: float = 0.1) -> None:
        super().__init__()
        self.heads = nn.ModuleList(GATHead(dim, slope) for _ in range(heads))

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.heads[0](h, mask)
        for head in self.heads[1:]:
            out = out + head(h, mask)
        return out / len(self.heads)
