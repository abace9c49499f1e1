"""pFedMe (T. Dinh et al., NeurIPS 2020; flcore/methods/pfedme.py), server side: the beta-mixing of the global
model with the sample-weighted mean of the clients' local models w_{i,R} (paper Alg. 1; the authors'
FLAlgorithms/servers/serverbase.py: persionalized_aggregate_parameters). The server keeps nothing else: the
personalized models theta_i stay on the clients."""

from __future__ import annotations

from collections import OrderedDict
from typing import Mapping

import numpy as np

from flcore.methods.pfedme import PFedMeConfig
from strategies.aggregation import apply_update, deltas, weighted_average
from strategies.base import ClientUpdate, FLStrategy, Params


def beta_mix(x: Mapping[str, np.ndarray], mean: Mapping[str, np.ndarray],
             beta: float) -> "OrderedDict[str, np.ndarray]":
    """(1 - beta) x + beta mean = x + beta (mean - x) per tensor; ``mean`` itself when beta = 1."""
    if beta == 1.0:
        return OrderedDict(mean)
    return apply_update(x, deltas(x, mean), beta)


class PFedMeStrategy(FLStrategy):
    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        mean = weighted_average([u.params for u in updates], [u.num_examples for u in updates])
        return beta_mix(params, mean, self.cfg.section(PFedMeConfig).beta)
