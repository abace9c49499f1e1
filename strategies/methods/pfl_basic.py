"""The basic P-FL baselines' server (flcore/methods/pfl_basic.py): FedAvg over the shared part only.

A client of these methods replies with its trained shared entries and, for its personal entries, the values
it received (they never leave the client: its state holds them). The server averages the shared entries by
sample size (FedAvg, McMahan et al. 2017) and keeps its own values of the personal ones:

    local    shared = {}                      the server's model stays at its initialisation
    FedPer   shared = all but the last K_P    (FedPer Sec. 3: W_B averaged, W_P personal)
    FedBABU  shared = the body                (FedBABU Sec. 4: the head is never updated nor aggregated;
                                               update-part 'full': everything, FedAvg)
With everything shared the aggregation is FedAvg's, bit for bit.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from flcore.methods.pfl_basic import FedBABUConfig, FedPerConfig, head_names, last_layers
from strategies.aggregation import weighted_average
from strategies.base import ClientUpdate, FLStrategy, Params


def shared_average(params: Params, updates: list[ClientUpdate], shared: set[str]) -> "OrderedDict[str, np.ndarray]":
    """The sample-size weighted mean of the updates on the ``shared`` entries; ``params``' own values elsewhere."""
    if not shared:
        return OrderedDict((k, np.asarray(v)) for k, v in params.items())
    avg = weighted_average([{k: u.params[k] for k in params if k in shared} for u in updates],
                           [u.num_examples for u in updates])
    return OrderedDict((k, avg[k] if k in shared else np.asarray(v)) for k, v in params.items())


class SharedPartStrategy(FLStrategy):
    """FedAvg over :meth:`personal`'s complement; the personal entries keep the server's values."""

    def personal(self, names: list[str]) -> list[str]:
        return []

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        personal = set(self.personal(list(params)))
        if not personal:
            return super().aggregate(server_round, params, updates)
        return shared_average(params, updates, set(params) - personal)


class LocalStrategy(SharedPartStrategy):
    """``local``: nothing is shared, so nothing is aggregated."""

    def personal(self, names: list[str]) -> list[str]:
        return list(names)


class FedPerStrategy(SharedPartStrategy):
    """FedPer: the last ``fedper.personal-layers`` layers are personal."""

    def personal(self, names: list[str]) -> list[str]:
        return last_layers(names, self.cfg.section(FedPerConfig).personal_layers)


class FedBABUStrategy(SharedPartStrategy):
    """FedBABU: the head (frozen at its init on every client) is not aggregated."""

    def personal(self, names: list[str]) -> list[str]:
        return head_names(names) if self.cfg.section(FedBABUConfig).update_part == "body" else []
