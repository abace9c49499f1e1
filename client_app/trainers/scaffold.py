"""SCAFFOLD (Karimireddy et al., ICML 2020), client side (paper Alg. 1, lines 7-13).

Each local step uses the corrected gradient g_i(y) - c_i + c (a :class:`ControlVariateTerm` in the one
loop). After K local steps with learning rate eta_l the client updates its control variate:
    option I:  c_i+ = g_i(x)                                   (full local gradient at the server model)
    option II: c_i+ = c_i - c + (x - y_i) / (K eta_l)          (reuses the local updates; the default)
With heavy-ball momentum beta (torch SGD, buffer reset every round) K steps move the model by eta_l S(K, beta)
times a constant gradient (:func:`momentum_step_sum`; S = K for beta = 0), so option II divides by eta_l S
instead of K eta_l: otherwise c_i overestimates the gradient ~1/(1-beta) times (10x at beta = 0.9) and the
corrected steps diverge. beta = 0 is exactly the paper's formula. The client returns y_i (the arrays) and
delta c_i = c_i+ - c_i (record ``scaffold-delta-c``). c_i lives in the client's persistent state
(``scaffold-c-i``); c arrives from the server (record ``scaffold-c``). Control variates cover the model's
trainable parameters, keyed by state-dict name.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from flcore.named_arrays import Tensors
from client_app.trainers.base import Trainer, TrainJob
from client_app.trainers.param_tensors import (ControlVariateTerm, full_gradient, momentum_step_sum,
                                               received_tensors, stored_tensors, to_numpy, trainable_copy)
from client_app.training import LossTerm, TrainStats
from flcore.methods.scaffold import DELTA_C, SERVER_C, STATE_C_I, ScaffoldConfig
from flcore.records import params_to_record



def option2_variate(c_i: Mapping[str, torch.Tensor], c: Mapping[str, torch.Tensor],
                    x: Mapping[str, torch.Tensor], y: Mapping[str, torch.Tensor],
                    steps: int, lr: float, momentum: float = 0.0) -> Tensors:
    """SCAFFOLD option II (Alg. 1 line 12): c_i+ = c_i - c + (x - y_i) / (eta_l * S(K, beta))."""
    if steps <= 0 or lr <= 0:
        raise ValueError(f"option II needs steps > 0 and lr > 0, got steps={steps}, lr={lr}")
    scale = lr * momentum_step_sum(steps, momentum)
    return OrderedDict((k, c_i[k] - c[k] + (x[k] - y[k]) / scale) for k in c_i)


class ScaffoldTrainer(Trainer):
    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        self.option = job.cfg.section(ScaffoldConfig).option
        self.c = received_tensors(job, SERVER_C, "the server control variate c")
        self.c_i = stored_tensors(job, STATE_C_I)  # zero at first participation (Alg. 1 initialisation)
        self.delta_c: Tensors | None = None

    def terms(self) -> list[LossTerm]:
        return [ControlVariateTerm(OrderedDict((k, self.c[k] - self.c_i[k]) for k in self.c))]

    def fit(self) -> TrainStats:
        x, opt, d = trainable_copy(self.job.model), self.optim_config(), self.job.data
        if self.option == "I":
            new_c_i = full_gradient(self.job.model, d.x_train, d.y_train, list(self.c), opt.batch_size, self.forward)
        stats = super().fit()
        if self.option == "II":  # without a local step there is nothing to learn c_i from: c_i stays
            new_c_i = (option2_variate(self.c_i, self.c, x, trainable_copy(self.job.model), stats.steps, opt.lr,
                                       opt.momentum) if stats.steps > 0 else self.c_i)
        self.delta_c = OrderedDict((k, new_c_i[k] - self.c_i[k]) for k in self.c_i)
        self.job.state.put_arrays(STATE_C_I, to_numpy(new_c_i))
        return stats

    def extra_records(self) -> dict[str, ArrayRecord | ConfigRecord | MetricRecord]:
        if self.delta_c is None:
            raise RuntimeError(f"client {self.job.cid}: SCAFFOLD extra_records() called before fit()")
        return {DELTA_C: params_to_record(to_numpy(self.delta_c))}
