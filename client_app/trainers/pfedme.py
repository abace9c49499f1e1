"""pFedMe (T. Dinh et al., NeurIPS 2020; flcore/methods/pfedme.py), client side (paper Alg. 1, Eq. 8; the
authors' FLAlgorithms/users/userpFedMe.py: UserpFedMe.train and optimizers/fedoptimizer.py: pFedMeOptimizer).

The model holds theta (the personalized model); w, the client's copy of the global model, is a set of tensors
beside it. Per local round (one minibatch D): K inner steps on theta, then one step of w towards theta. The
reply carries w (buffers such as BatchNorm's statistics: the model's, i.e. theta's forward passes); theta is
stored as client state ``pfedme-theta`` and is the model the base evaluates for P-FL."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F

from client_app.trainers.base import Trainer
from client_app.trainers.param_tensors import param_tensors, to_numpy, trainable_copy
from client_app.training import TrainStats, minibatches
from flcore.methods.pfedme import STATE_THETA, PFedMeConfig
from flcore.records import model_views


def theta_step(theta: torch.Tensor, grad: torch.Tensor, w: torch.Tensor, personal_lr: float, lamda: float,
               mu: float = 0.0) -> torch.Tensor:
    """theta <- theta - eta_p (grad + lambda (theta - w) + mu theta), in place (one of the K inner steps)."""
    return theta.sub_(personal_lr * (grad + lamda * (theta - w) + mu * theta))


def local_step(w: torch.Tensor, theta: torch.Tensor, lr: float, lamda: float) -> torch.Tensor:
    """w <- w - eta lambda (w - theta), in place (paper Eq. 8 with theta ~ theta_i(w))."""
    return w.sub_(lr * lamda * (w - theta))


class PFedMeTrainer(Trainer):
    w: "OrderedDict[str, torch.Tensor] | None" = None

    def fit(self) -> TrainStats:
        c, opt, d, model = self.cfg.section(PFedMeConfig), self.optim_config(), self.job.data, self.job.model
        params = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
        w = trainable_copy(model)                                    # w_{i,0} = x_t
        stored = self.job.state.get_arrays(STATE_THETA)
        if c.theta_init == "personal" and stored is not None:
            theta0 = param_tensors(model, stored, f"client {self.job.cid}: client state '{STATE_THETA}'")
            with torch.no_grad():
                for k, p in params:
                    p.copy_(theta0[k])
        stats = TrainStats()
        model.train()
        done = False
        for _ in range(opt.epochs):
            for xb, yb in minibatches(d.x_train, d.y_train, opt.batch_size, self.job.generator):
                for _ in range(c.k_steps):
                    logits, _ = self.forward(model, xb, yb)
                    loss = F.cross_entropy(logits, yb)
                    model.zero_grad(set_to_none=True)
                    loss.backward()
                    with torch.no_grad():
                        for k, p in params:
                            if p.grad is not None:
                                theta_step(p, p.grad, w[k], c.personal_lr, c.lamda, opt.weight_decay)
                with torch.no_grad():
                    for k, p in params:
                        local_step(w[k], p, opt.lr, c.lamda)
                stats.steps += 1
                stats.num_examples += int(xb.shape[0])
                stats.losses.add(loss.detach())
                if opt.max_steps and stats.steps >= opt.max_steps:
                    done = True
                    break
            if done:
                break
        model.zero_grad(set_to_none=True)
        self.w = w
        self.job.state.put_arrays(STATE_THETA, to_numpy(trainable_copy(model)))
        return stats

    def reply_params(self) -> dict[str, np.ndarray]:
        """w_{i,R} for the trainable parameters, the model's other entries (buffers) as they are."""
        if self.w is None:
            raise RuntimeError(f"client {self.job.cid}: pFedMe reply_params() called before fit()")
        out = dict(model_views(self.job.model))
        out.update((k, v.detach().cpu().numpy()) for k, v in self.w.items())
        return out
