"""APPLE (Luo & Wu, IJCAI 2022; flcore/methods/apple.py), client side: local training of the own core model and the
DR vector p_i through the personalized model w_p = sum_j p_j w_c^(j) (the authors' utils/models.py: ClientNet,
train_APPLE.py: train_one_round).

The model holds the own core (trainable, updated by the loop's optimizer at ``lr``); the other clients' cores
come from the message (records ``apple-core.<j>``) as fixed tensors; p_i is a tensor with its own SGD (``apple.p-lr``,
``apple.p-momentum``) stepped after the core's. Every training forward runs the model with w_p in place of its
parameters (torch.func.functional_call), so autograd gives the own core p_ii grad and p_ij <grad, w_c^(j)>.
"""

from __future__ import annotations

import copy
from typing import Mapping, Sequence

import numpy as np
import torch
from flwr.app import ConfigRecord
from torch import nn
from torch.func import functional_call

from client_app.trainers.base import Trainer
from client_app.training import LossTerm, Step, TrainStats, forward_features
from flcore.methods.apple import CORE_PREFIX, GROUP, P_SELF, STATE_P, AppleConfig, initial_p, reg_coef
from flcore.records import record_to_params


def mixed_params(p: torch.Tensor, cores: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """w_p = sum_j p[j] cores[j] per entry (ClientNet.compress), differentiable in p and in every core."""
    if p.ndim != 1 or p.shape[0] != len(cores) or not cores:
        raise ValueError(f"APPLE: p has shape {tuple(p.shape)} for {len(cores)} core model(s)")
    return {k: sum(p[j] * cores[j][k] for j in range(len(cores))) for k in cores[0]}  # type: ignore[misc]


def carried_p(stored: Mapping[str, np.ndarray] | None, cids: Sequence[int], p0: Sequence[float]) -> list[float]:
    """p_i over ``cids``: the stored value of each client id the state holds, p_0's entry for the others."""
    if stored is None:
        return list(p0)
    if set(stored) != {"p", "cids"}:
        raise ValueError(f"client state '{STATE_P}' must hold 'p' and 'cids', got {sorted(stored)}")
    old = dict(zip((int(c) for c in np.asarray(stored["cids"]).ravel()), np.asarray(stored["p"]).ravel()))
    return [float(old.get(int(c), p0[k])) for k, c in enumerate(cids)]


class _Features(nn.Module):
    """forward = the wrapped model's forward_features, so functional_call can swap its parameters."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return forward_features(self.m, x)


class DRTerm(LossTerm):
    """lambda(r) ||p - p_0||^2 (utils/losses.py: reg_loss) and p's optimizer step after the core's."""

    def __init__(self, p: torch.Tensor, p0: torch.Tensor, coef: float, opt: torch.optim.Optimizer) -> None:
        self.p, self.p0, self.coef, self.opt = p, p0, coef, opt

    def begin(self, model: nn.Module) -> None:
        self.opt.zero_grad(set_to_none=True)

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        return self.coef * torch.sum((self.p - self.p0) ** 2) if self.coef else None

    def after_step(self, model: nn.Module, step: Step) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class AppleTrainer(Trainer):
    def _setup(self) -> None:
        job, c = self.job, self.cfg.section(AppleConfig)
        if GROUP not in job.records:
            raise ValueError(f"client {job.cid}: the APPLE train message has no record '{GROUP}'")
        group = job.records[GROUP]
        if not isinstance(group, ConfigRecord):
            raise TypeError(f"client {job.cid}: record '{GROUP}' is a {type(group).__name__}, not a ConfigRecord")
        cids = group["cids"]
        if not isinstance(cids, list):
            raise TypeError(f"client {job.cid}: '{GROUP}' has cids {cids!r}, not a list")
        self.cids = [int(x) for x in cids]
        if job.cid not in self.cids:
            raise ValueError(f"client {job.cid}: not among the relayed group {self.cids}")
        self.own = self.cids.index(job.cid)
        names = [k for k, q in job.model.named_parameters() if q.requires_grad]
        self.cores: list[Mapping[str, torch.Tensor]] = []
        for j in self.cids:
            if j == job.cid:
                own = dict(job.model.named_parameters())
                self.cores.append({k: own[k] for k in names})
                continue
            key = f"{CORE_PREFIX}{j}"
            if key not in job.records:
                raise ValueError(f"client {job.cid}: the APPLE train message lacks client {j}'s core '{key}'")
            arrays = record_to_params(job.records[key])  # type: ignore[arg-type]
            missing = [k for k in names if k not in arrays]
            if missing:
                raise ValueError(f"client {job.cid}: core '{key}' lacks {missing[:3]}")
            self.cores.append({k: torch.as_tensor(np.asarray(arrays[k])).to(job.device) for k in names})
        samples = group["samples"]
        if not isinstance(samples, list):
            raise TypeError(f"client {job.cid}: '{GROUP}' has samples {samples!r}, not a list")
        p0 = initial_p([int(n) for n in samples])
        dev = job.device
        self.p0 = torch.tensor(p0, dtype=torch.float32, device=dev)
        self.p = torch.tensor(carried_p(job.state.get_arrays(STATE_P), self.cids, p0), dtype=torch.float32,
                              device=dev, requires_grad=True)
        self.p_opt = torch.optim.SGD([self.p], lr=c.p_lr, momentum=c.p_momentum)
        self.coef = reg_coef(c.mu, job.server_round - 1, self.cfg.num_server_rounds, c.reg_fraction, c.scheduler)
        self.wrapper = _Features(job.model)

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor):
        mixed = mixed_params(self.p, self.cores)
        return functional_call(self.wrapper, {f"m.{k}": v for k, v in mixed.items()}, (x,))

    def terms(self) -> list[LossTerm]:
        return [DRTerm(self.p, self.p0, self.coef, self.p_opt)]

    def fit(self) -> TrainStats:
        self._setup()
        stats = super().fit()
        self.job.state.put_arrays(STATE_P, {"p": self.p.detach().cpu().numpy().astype(np.float32),
                                            "cids": np.asarray(self.cids, dtype=np.int64)})
        return stats

    def personalized(self) -> nn.Module:
        """w_p^(i) = sum_j p_ij w_c^(j) as a model (ClientNet.compress): the P-FL model."""
        model = copy.deepcopy(self.job.model)
        with torch.no_grad():
            mixed = mixed_params(self.p.detach(), [{k: v.detach() for k, v in c.items()} for c in self.cores])
            for k, q in model.named_parameters():
                if k in mixed:
                    q.copy_(mixed[k])
        model.eval()
        return model

    def extra_metrics(self, stats: TrainStats) -> dict[str, float | int]:
        return {P_SELF: float(self.p.detach()[self.own])}
