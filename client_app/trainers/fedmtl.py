"""FedMTL (MOCHA's primal, flcore/methods/fedmtl.py), client side: local SGD on
CE(w_t) + lambda (Omega_tt / 2 ||w_t||^2 + <w_t, u_t>), whose gradient in w_t is lambda (W Omega)_t (the
regulariser lambda/2 tr(W Omega W^T) with the other columns fixed)."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
from torch import nn

from client_app.trainers.base import Trainer
from client_app.training import LossTerm, Step
from flcore.methods.fedmtl import COUPLING, OMEGA_TT, FedMTLConfig
from flcore.records import record_to_params


def coupling_penalty(params: Mapping[str, torch.Tensor], coupling: Mapping[str, torch.Tensor], omega_tt: float,
                     lam: float) -> torch.Tensor:
    """lambda (Omega_tt / 2 ||w||^2 + <w, u>) over the entries of ``params``."""
    total = sum((omega_tt / 2 * (p * p).sum() + (p * coupling[k]).sum()) for k, p in params.items())
    return lam * total  # type: ignore[return-value]


class CouplingTerm(LossTerm):
    def __init__(self, coupling: Mapping[str, torch.Tensor], omega_tt: float, lam: float) -> None:
        self.coupling, self.omega_tt, self.lam = coupling, omega_tt, lam

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        if not self.lam:
            return None
        params = {k: p for k, p in model.named_parameters() if p.requires_grad}
        return coupling_penalty(params, self.coupling, self.omega_tt, self.lam)


class FedMTLTrainer(Trainer):
    def terms(self) -> list[LossTerm]:
        job, lam = self.job, self.cfg.section(FedMTLConfig).lam
        if COUPLING not in job.records or OMEGA_TT not in job.config:
            raise ValueError(f"client {job.cid}: the FedMTL train message lacks record '{COUPLING}' or config "
                             f"'{OMEGA_TT}'")
        arrays = record_to_params(job.records[COUPLING])  # type: ignore[arg-type]
        names = [k for k, p in job.model.named_parameters() if p.requires_grad]
        missing = [k for k in names if k not in arrays]
        if missing:
            raise ValueError(f"client {job.cid}: record '{COUPLING}' lacks {missing[:3]}")
        coupling = {k: torch.as_tensor(np.asarray(arrays[k])).to(job.device) for k in names}
        return [CouplingTerm(coupling, float(job.config[OMEGA_TT]), lam)]
