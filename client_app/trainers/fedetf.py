"""Neural-collapse FL, client side: training on h = f + alpha * mu_y (global memory vectors, GMV).

Seed 004 (Huang et al., "Neural Collapse Inspired Federated Learning with Non-iid Data"), Alg. 1, Sec. 4.2.
The fixed simplex-ETF classifier W* is the model's head (``models/heads.py``, a frozen buffer built from
the run seed); this trainer adds the memory vectors:

    f = F_theta(x)                                  backbone output (what GMV is built from)
    h = f + alpha * mu_y^{t-1}   if t >= R_warm    else h = f
    logits = W*^T h  (head(neck(h))),  loss = CE(logits, y)

Only the local *training* forward uses mu_y (it needs the label); evaluation and inference use h = f.
After training, the client reports the per-class mean of its backbone features f and the class counts
(record ``class-means``); the server averages them into mu^t (``strategies/methods/fedetf.py``).

Which features make the class means (``fedetf.gmv-features``):
  ``train`` (default, Alg. 1): the detached f computed in the training forward passes of the last local epoch,
      i.e. (1/|D_kj|) sum_{i in D_kj} f_{i,k}^t with f_{i,k}^t = F_{theta_k^t}(x_{i,k}) as the minibatch loop
      computes it (the model in training mode, each sample under the parameters of its own step). Alg. 1 shows
      one pass over the data; with E > 1 epochs the last pass's f is the latest f_{i,k}^t of every sample. A
      class a capped last epoch (``max-local-steps``) never reached counts as absent for that client;
  ``final`` (our option, the default before issue 40): one no-grad eval-mode pass of the trained local model
      theta_k^t over the local training set, i.e. (1/|D_kj|) sum_{i in D_kj} F_{theta_k^t}(x_i) with the model
      the client returns.
Both use f (before the memory vector is added), never h: mu is a memory of the features, and adding
alpha*mu to the features it is averaged from would feed mu back into itself.
"""

from __future__ import annotations


import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from client_app.trainers.base import Trainer, TrainJob
from client_app.training import LossTerm, Step, TrainStats
from flcore.methods.fedetf import ACTIVE_KEY, MEANS_RECORD, MEMORY_RECORD, REPORT_KEY, FedETFConfig
from flcore.records import params_to_record, record_to_params


# ------------------------------------------------------------------------------------------ pure math
def add_memory(f: torch.Tensor, y: torch.Tensor, mu: torch.Tensor, valid: torch.Tensor,
               alpha: float) -> torch.Tensor:
    """h_i = f_i + alpha * mu_{y_i} (seed 004, Alg. 1 / Sec. 4.2).

    ``mu`` is (C, d), ``valid`` a (C,) bool mask: a class without a memory vector yet gets h_i = f_i.
    ``mu`` is a constant (no gradient flows into it).
    """
    if mu.shape[0] != valid.shape[0] or mu.shape[1] != f.shape[1]:
        raise ValueError(f"memory vectors of shape {tuple(mu.shape)} (mask {tuple(valid.shape)}) do not fit "
                         f"features of shape {tuple(f.shape)}")
    m = mu.detach().to(f.dtype) * valid.to(f.dtype).unsqueeze(1)
    return f + alpha * m[y]


def class_feature_sums(f: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-class sum of the rows of f in float64 (C, d), per-class counts (C,) int64)."""
    sums = torch.zeros(num_classes, f.shape[1], dtype=torch.float64, device=f.device)
    sums.index_add_(0, y, f.detach().to(torch.float64))
    counts = torch.bincount(y, minlength=num_classes)[:num_classes].to(torch.int64)
    return sums, counts


def class_feature_means(f: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Client k's class means m_kc = (1/|D_kc|) sum_{i in D_kc} f_i (the summand of mu_c, Alg. 1) and
    counts |D_kc|. Classes the client lacks get a zero row and count 0 (the server skips them)."""
    sums, counts = class_feature_sums(f, y, num_classes)
    return _means(sums, counts)


def _means(sums: torch.Tensor, counts: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    c = counts.to(torch.float64).clamp(min=1).unsqueeze(1)
    return (sums / c).cpu().numpy(), counts.cpu().numpy().astype(np.int64)


@torch.no_grad()
def model_features(model, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Backbone features f = F(x) of the model in eval mode (training mode restored afterwards)."""
    was_training = model.training
    model.eval()
    out = torch.cat([model.features(x[i:i + batch_size]) for i in range(0, x.shape[0], batch_size)])
    model.train(was_training)
    return out


class LastEpochClassMeans(LossTerm):
    """Accumulates the detached training features f per class, keeping only the last epoch seen."""

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.epoch = -1
        self.sums: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None

    def loss(self, model, step: Step) -> None:
        sums, counts = class_feature_sums(step.features, step.y, self.num_classes)
        if step.epoch != self.epoch or self.sums is None:
            self.epoch, self.sums, self.counts = step.epoch, sums, counts
        else:
            assert self.counts is not None  # set with self.sums
            self.sums += sums
            self.counts += counts
        return None

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if self.sums is None or self.counts is None:
            raise RuntimeError("no training step was run, so there are no training features to average")
        return _means(self.sums, self.counts)


# ------------------------------------------------------------------------------------------ trainer
def read_memory(record: ArrayRecord, num_classes: int, feature_dim: int, cid: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(mu, valid) from the server's ``etf-memory`` record, checked against the model's shapes."""
    arrays = record_to_params(record)
    if "mu" not in arrays or "valid" not in arrays:
        raise ValueError(f"client {cid}: record '{MEMORY_RECORD}' needs arrays 'mu' and 'valid', "
                         f"got {sorted(arrays)}")
    mu, valid = np.asarray(arrays["mu"]), np.asarray(arrays["valid"])
    if mu.shape != (num_classes, feature_dim) or valid.shape != (num_classes,):
        raise ValueError(f"client {cid}: memory vectors have shape {mu.shape} / mask {valid.shape}, the model "
                         f"needs ({num_classes}, {feature_dim}) / ({num_classes},)")
    if not np.all(np.isfinite(mu)):
        raise ValueError(f"client {cid}: memory vectors contain NaN or Inf")
    return (torch.as_tensor(mu, dtype=torch.float32, device=device),
            torch.as_tensor(valid.astype(bool), device=device))


class ETFTrainer(Trainer):
    """FedAvg's local SGD on CE(W*^T (f + alpha mu_y), y); reports class means of f when asked."""

    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        self.ecfg = job.cfg.section(FedETFConfig)
        model = job.model
        self.gmv_active = bool(job.config.get(ACTIVE_KEY, False))
        self.report = bool(job.config.get(REPORT_KEY, False))
        self.mu: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None
        if self.gmv_active:
            record = job.records.get(MEMORY_RECORD)
            if not isinstance(record, ArrayRecord):
                raise ValueError(f"client {job.cid}: round {job.server_round} asks for GMV training "
                                 f"('{ACTIVE_KEY}') but the message has no '{MEMORY_RECORD}' array record")
            self.mu, self.valid = read_memory(record, model.num_classes, model.feature_dim, job.cid, job.device)
        self.tracker = (LastEpochClassMeans(model.num_classes)
                        if self.report and self.ecfg.gmv_features == "train" else None)

    def terms(self) -> list[LossTerm]:
        return [self.tracker] if self.tracker is not None else []

    def forward(self, model, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = model.features(x)
        h = f
        if self.mu is not None and self.valid is not None:
            h = add_memory(f, y, self.mu, self.valid, self.ecfg.alpha)
        return model.head(model.neck(h)), f

    def extra_metrics(self, stats: TrainStats) -> dict[str, float | int]:
        return {"gmv-active": int(self.mu is not None)}

    def extra_records(self) -> dict[str, ArrayRecord | ConfigRecord | MetricRecord]:
        if not self.report:
            return {}
        d = self.job.data
        if self.tracker is not None:
            means, counts = self.tracker.result()
        else:
            means, counts = class_feature_means(model_features(self.job.model, d.x_train), d.y_train,
                                                d.num_classes)
        return {MEANS_RECORD: params_to_record({"means": means.astype(np.float32), "counts": counts})}
