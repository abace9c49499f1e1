"""Ditto (Li et al., ICML 2021), client side (paper Alg. 1).

A sampled client k with the round's global model w^t
    1. updates the global model by the local solver of FedAvg (Alg. 1): the base trainer's local SGD
       on F_k; the server averages these (FedAvg);
    2. updates its personal model v_k (Alg. 1) by the same number of local SGD steps on
           h_k(v; w^t) = F_k(v) + lambda/2 ||v - w^t||^2,   v <- v - eta (grad F_k(v) + lambda (v - w^t)),
       w^t the model received this round (authors' trainers_MTL/ditto.py Server.train: eff_grad = grads +
       lam * (local_model - global_model), global_model the round's).
The authors' loop interleaves one step of each on the same minibatch; the two updates do not depend on each
other (v's step reads w^t, not the moving global copy), so we run them one after the other on the same
minibatch sequence (the same generator state): the result is the interleaved one. v_k persists in the client
state (``ditto-v``); before the first participation it is the initial model w^0 (``ditto.v-init``). P-FL
evaluates v_k; the reply is the updated global model. lambda = 0: v_k is plain local training.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from client_app.trainers.base import Trainer, TrainJob
from client_app.trainers.param_tensors import ParamPenalty, param_tensors
from client_app.trainers.pfl_basic.split import load_entries, state_entries
from client_app.training import LossTerm, TrainStats, local_train
from flcore.methods.pfl_basic import STATE_DITTO_V, DittoConfig
from models import build_model


def ditto_prox(lam: float):
    """lambda/2 sum_j ||v_j - w_j||^2 over the (v_j, w_j) pairs: its gradient is lambda (v - w^t) (Ditto Sec. 3.1 objective)."""
    def penalty(pairs: list[tuple[torch.Tensor, ...]]) -> torch.Tensor:
        total = sum(((v - w) ** 2).sum() for v, w in pairs)
        assert isinstance(total, torch.Tensor), "no (v, w) pair"  # one per trainable parameter
        return 0.5 * lam * total
    return penalty


class DittoTrainer(Trainer):
    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        self.hp = job.cfg.section(DittoConfig)
        self.v: nn.Module | None = None

    def initial_v(self) -> nn.Module:
        """v_k before this round's update: the stored one, or w^0 / the received model at first participation."""
        job = self.job
        v = copy.deepcopy(job.model)  # still the received w^t here
        names = list(v.state_dict())
        stored = job.state.get_arrays(STATE_DITTO_V)
        if stored is not None:
            load_entries(v, stored, names, f"client {job.cid}: client state '{STATE_DITTO_V}'")
        elif self.hp.v_init == "initial":
            with torch.random.fork_rng(devices=[]):  # build_model seeds the global RNG: leave it as it was
                w0 = build_model(self.cfg, tuple(job.data.x_train.shape[1:]), job.data.num_classes)
            v.load_state_dict(w0.state_dict())
        return v

    def fit(self) -> TrainStats:
        job, d = self.job, self.job.data
        v = self.initial_v()
        w_t = param_tensors(v, job.global_params, f"client {job.cid}: the received global model")
        batches = job.generator.get_state()
        stats = super().fit()                      # 1. the global model's local update (FedAvg's)
        order = torch.Generator()
        order.set_state(batches)                   # 2. v_k on the same minibatches
        terms: list[LossTerm] = [ParamPenalty(ditto_prox(self.hp.lam), w_t)] if self.hp.lam > 0 else []
        local_train(v, d.x_train, d.y_train, self.optim_config(), terms, generator=order, forward=self.forward)
        job.state.put_arrays(STATE_DITTO_V, state_entries(v, list(v.state_dict())))
        self.v = v
        return stats

    def personalized(self) -> nn.Module:
        if self.v is None:
            raise RuntimeError(f"client {self.job.cid}: Ditto's personalized() called before fit()")
        return self.v
