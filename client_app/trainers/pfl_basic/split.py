"""A model split into shared and personal entries, the personal ones kept in the client state.

:class:`PersonalPartTrainer` loads the client's stored personal entries into the received model before local
training (at the first participation they are the received ones: the server's initialisation), trains
everything with FedAvg's local SGD, stores the personal entries again, and replies with the trained shared
entries and, for the personal ones, the values it received: they never leave the client (the server keeps
its own, strategies/methods/pfl_basic.py). P-FL evaluates the trained model: shared + personal.

- ``local``: every entry personal (each client trains its own model, never averaged).
- FedPer (Arivazhagan et al. 2019, Sec. 3): the last ``fedper.personal-layers`` layers W_P personal.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Mapping

import numpy as np
import torch

from client_app.trainers.base import Trainer, TrainJob
from client_app.training import TrainStats
from flcore.methods.pfl_basic import STATE_FEDPER, STATE_LOCAL, FedPerConfig, last_layers
from flcore.records import model_views


def state_entries(model: torch.nn.Module, names: list[str]) -> "OrderedDict[str, np.ndarray]":
    """CPU copies of the model's state-dict entries ``names`` (for the client state)."""
    sd = model.state_dict()
    return OrderedDict((n, sd[n].detach().cpu().numpy().copy()) for n in names)


def load_entries(model: torch.nn.Module, stored: Mapping[str, np.ndarray], names: list[str], what: str) -> None:
    """Copy ``stored`` into the model's entries ``names`` (exactly those, same shapes), in place."""
    if set(stored) != set(names):
        missing, extra = sorted(set(names) - set(stored)), sorted(set(stored) - set(names))
        raise KeyError(f"{what} does not match the model's personal entries: missing {missing[:3]}, "
                       f"unexpected {extra[:3]}")
    sd = model.state_dict()
    with torch.no_grad():
        for n in names:
            value = torch.as_tensor(np.asarray(stored[n]))
            if tuple(value.shape) != tuple(sd[n].shape):
                raise ValueError(f"{what}: entry '{n}' has shape {tuple(value.shape)}, the model's is "
                                 f"{tuple(sd[n].shape)}")
            sd[n].copy_(value.to(device=sd[n].device, dtype=sd[n].dtype))


class PersonalPartTrainer(Trainer):
    """FedAvg's local training on shared + personal entries; the personal ones persist in ``STATE``."""

    STATE = ""

    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        self.personal = self.personal_names(list(job.model.state_dict()))

    def personal_names(self, names: list[str]) -> list[str]:
        """The state-dict entries that stay on the client (each method's trainer says which: FedPer's last K_P
        layers, Fed-RoD's personal head, all of them for ``local``)."""
        raise TypeError(f"{type(self).__name__} must override personal_names (which state-dict entries are "
                        "personal): the base cannot know")

    def fit(self) -> TrainStats:
        stored = self.job.state.get_arrays(self.STATE)
        if stored is not None:
            load_entries(self.job.model, stored, self.personal,
                         f"client {self.job.cid}: client state '{self.STATE}'")
        stats = super().fit()
        self.job.state.put_arrays(self.STATE, state_entries(self.job.model, self.personal))
        return stats

    def reply_params(self) -> dict[str, np.ndarray]:
        out = dict(model_views(self.job.model))
        for n in self.personal:  # the received values: what is personal is not sent
            out[n] = self.job.global_params[n].detach().cpu().numpy()
        return out


class LocalTrainer(PersonalPartTrainer):
    """``local``: the whole model is the client's own."""

    STATE = STATE_LOCAL

    def personal_names(self, names: list[str]) -> list[str]:
        return list(names)


class FedPerTrainer(PersonalPartTrainer):
    """FedPer: the last K_P layers are the client's own."""

    STATE = STATE_FEDPER

    def personal_names(self, names: list[str]) -> list[str]:
        return last_layers(names, self.cfg.section(FedPerConfig).personal_layers)
