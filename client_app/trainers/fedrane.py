"""FedRANE's client (LRA, seed 000, Alg. 1 l. 10-20): local objective L = CE(predictor(Z_hat), y) + lambda_CD L_CD.

The LRA module itself is the model's neck (models/fedrane/neck.py, installed by the ``add_lra_neck`` model hook),
so it is federated with the rest of the model. This trainer changes only how a training step computes
its outputs (Z, Z_hat both kept) and adds the contrastive-discrimination term (Eq. 7, Eq. 9) to the one
local loop. P-FL ("local-accuracy") is the base trainer's evaluation of the trained model; under inductive
evaluation (``lra-eval = inductive``, fedrane-repaired's default) each local test sample is evaluated against a fixed support set of this client's
training data (a seeded choice of its rows, the same every round). It reports the mean graph density of
its training graphs and, when it has a local test split and evaluates through the graph, of its P-FL evaluation
graphs.

With ``mixup-weight`` > 0 (fedrane-code: the authors' clientFedRANE.py train_raw) each batch also yields a
mixed batch x_mix = lam x + (1 - lam) x[perm], lam ~ Beta(mixup-alpha, mixup-alpha), perm a random permutation
(both from a generator seeded by (seed, round, client)); F runs once over [x; x_mix], the mixed rows go through
G with their own L_CD term, and the loss gains mixup-weight * (lam CE(o, y) + (1 - lam) CE(o, y[perm])) with o the
mixed rows' predictor input (``mixup-logits = features``, as train_raw) or the classifier's logits on it.

The authors' optimizer (fedrane-code; keys of the method's section): ``drop-last`` skips each epoch's partial
batch; ``persistent-optimizer`` keeps one SGD per client across rounds, its momentum buffers stored in the client
state (``fedrane-optimizer``, by parameter name) and loaded into the next round's optimizer before its first
step, so round t + 1's first step continues round t's buffer (clientFedRANE.py ClientFedRANE.__init__ builds
``self.optimizer`` once; clientbase.py set_parameters overwrites only the parameters' data); ``lr-step-epochs``
= s > 0 runs StepLR(step_size = s E, gamma): the k-th local training of this client (k = 0, 1, ..., counted in
the client state ``fedrane-lr-schedule``) uses lr gamma^floor(k / (s E)) (train_raw steps the scheduler once).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from client_app.trainers.base import Trainer, TrainJob, TrainReply
from client_app.state import ClientState
from client_app.training import LossTerm, OptimConfig, Step, TrainStats, local_train, make_optimizer
from flcore.methods.fedrane import (CD_LOSS, EVAL_DENSITY, MIXUP_LOSS, STATE_OPTIMIZER, STATE_SCHEDULE,
                                    TRAIN_DENSITY)
from models.base import FLModel
from models.evaluation import eval_support
from models.device_sum import DeviceSum
from models.fedrane.neck import LRANeck, contrastive_discrimination

log = logging.getLogger(__name__)


class ContrastiveTerm(LossTerm):
    """lambda_CD * L_CD(Z, Z_hat) for the minibatch the trainer's forward just produced (``z_hat``).

    It holds the neck, not the trainer: no reference cycle, so a finished trainer frees the model at once and
    the ClientApp's model pool can reuse it (a trainer keeps no reference past its message: client_app/model_pool.py).
    """

    def __init__(self, neck: LRANeck) -> None:
        self.neck = neck
        self.z_hat: torch.Tensor | None = None
        self.mixed: tuple[torch.Tensor, torch.Tensor] | None = None   # (Z_mix, Z_mix_hat) with mixup
        self.running = DeviceSum()

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        cfg = self.neck.cfg
        z_hat, self.z_hat = self.z_hat, None
        mixed, self.mixed = self.mixed, None
        if cfg.lra_lambda_cd == 0 or z_hat is None or step.features.shape[0] < 2:
            return None  # a batch of one has no negatives
        cd = contrastive_discrimination(step.features, z_hat, cfg.lra_tau, cfg.lra_cd_symmetric,
                                        cfg.lra_cd_similarity)
        self.running.add(cd)
        if mixed is not None:
            cd = cd + contrastive_discrimination(mixed[0], mixed[1], cfg.lra_tau, cfg.lra_cd_symmetric,
                                                 cfg.lra_cd_similarity)
        return cfg.lra_lambda_cd * cd


class MixupTerm(LossTerm):
    """mixup-weight * (lam CE(o, y_a) + (1 - lam) CE(o, y_b)) for the mixed batch the trainer's forward made."""

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self.pending: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float] | None = None
        self.running = DeviceSum()

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor | None:
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        logits, y_a, y_b, lam = pending
        term = lam * F.cross_entropy(logits, y_a) + (1.0 - lam) * F.cross_entropy(logits, y_b)
        self.running.add(term)
        return self.weight * term


def mix_batch(x: torch.Tensor, rng: np.random.Generator, alpha: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(lam x + (1 - lam) x[perm], perm, lam) with lam ~ Beta(alpha, alpha) and perm uniform (the authors'
    btLoss.py mixup_data)."""
    lam = float(rng.beta(alpha, alpha))
    # non-blocking: a copy from pageable host memory to a GPU without it waits for the device's queue every step
    perm = torch.from_numpy(rng.permutation(x.shape[0])).to(x.device, non_blocking=True)
    return lam * x + (1.0 - lam) * x[perm], perm, lam


def step_lr(lr: float, trainings: int, step_size: int, gamma: float) -> float:
    """StepLR stepped once per local training: lr * gamma^floor(trainings / step_size) for the training that
    follows ``trainings`` earlier ones (step_size 0: constant lr)."""
    if trainings < 0:
        raise ValueError(f"step_lr: trainings must be >= 0, got {trainings}")
    return lr if step_size <= 0 else lr * gamma ** (trainings // step_size)


def load_momentum(opt: torch.optim.Optimizer, named: list[tuple[str, nn.Parameter]],
                  buffers: dict[str, np.ndarray] | None, cid: int) -> None:
    """Put the stored momentum buffers (by parameter name) into ``opt``'s state before its first step."""
    if not buffers:
        return
    for name, p in named:
        if name not in buffers:
            continue
        buf = torch.as_tensor(np.asarray(buffers[name])).to(device=p.device, dtype=p.dtype)
        if buf.shape != p.shape:
            raise ValueError(f"client {cid}: stored momentum buffer '{name}' ({STATE_OPTIMIZER}) has shape "
                             f"{tuple(buf.shape)}, the parameter {tuple(p.shape)}")
        opt.state[p]["momentum_buffer"] = buf.clone()
    unknown = sorted(set(buffers) - {n for n, _ in named})
    if unknown:
        raise ValueError(f"client {cid}: stored momentum buffers ({STATE_OPTIMIZER}) name parameters the model "
                         f"does not train: {', '.join(unknown[:5])}")


def momentum_arrays(opt: torch.optim.Optimizer, named: list[tuple[str, nn.Parameter]]) -> dict[str, np.ndarray]:
    """The optimizer's momentum buffers by parameter name (parameters without one are left out)."""
    out = {}
    for name, p in named:
        buf = opt.state.get(p, {}).get("momentum_buffer")
        if buf is not None:
            out[name] = buf.detach().cpu().numpy().copy()
    return out


def trainings_done(state: ClientState) -> int:
    """How many local trainings this client ran before (the StepLR counter, client state)."""
    rec = state.get_config(STATE_SCHEDULE)
    return int(rec["trainings"]) if rec else 0


class LRATrainer(Trainer):
    """Local training through the LRA neck with the contrastive-discrimination term."""

    def __init__(self, job: TrainJob) -> None:
        super().__init__(job)
        neck = getattr(job.model, "neck", None)
        if not isinstance(neck, LRANeck):
            raise ValueError(f"client {job.cid}: method '{job.cfg.method}' trains with LRA but the model has no "
                             "LRA neck (the method's model hook 'models.fedrane.neck:add_lra_neck' was not applied)")
        self.neck = neck
        self.cd_term = ContrastiveTerm(neck)
        cfg = neck.cfg
        self.mixup = MixupTerm(cfg.mixup_weight) if cfg.mixup_weight > 0 else None
        if self.mixup is not None and cfg.mixup_logits == "features" and job.model.feature_dim < job.data.num_classes:
            raise ValueError(f"client {job.cid}: mixup-logits = 'features' uses the {job.model.feature_dim}-d features "
                             f"as logits over {job.data.num_classes} classes; it needs feature_dim >= the number of "
                             "classes (set mixup-logits = 'classifier' or mixup-weight = 0)")
        self.rng = np.random.default_rng([job.cfg.seed, job.server_round, job.cid, 0x31])  # mixup's lam and perm

    def run(self) -> TrainReply:
        """The base sequence, with this client's training support attached for (inductive) evaluation."""
        self.neck.stats.reset()          # a pooled model may carry counts of an earlier message
        self.neck.generator = self.job.generator   # training-time dropout of the neck (fedrane.lra-dropout)
        try:
            with eval_support(self.job.model, self.job.data.x_train, (self.cfg.seed, self.job.cid)):
                return super().run()
        finally:
            self.neck.generator = None             # the pooled model is left as built (client_app/model_pool.py)

    def terms(self) -> list[LossTerm]:
        return [self.cd_term] if self.mixup is None else [self.cd_term, self.mixup]

    def optim_config(self) -> OptimConfig:
        """The run's optimizer with ``drop-last`` and the StepLR lr of this training (``lr-step-epochs``)."""
        base, cfg = super().optim_config(), self.neck.cfg
        lr = step_lr(base.lr, trainings_done(self.job.state), cfg.lr_step_epochs * base.epochs, cfg.lr_step_gamma)
        return dataclasses.replace(base, lr=lr, drop_last=cfg.drop_last)

    def fit(self) -> TrainStats:
        """Local training; with ``persistent-optimizer`` through the optimizer whose momentum buffers the client
        state carries from round to round; with ``lr-step-epochs`` the StepLR counter advances by one."""
        cfg, d, state = self.neck.cfg, self.job.data, self.job.state
        opt_cfg = self.optim_config()
        if opt_cfg.drop_last and d.num_train < opt_cfg.batch_size:
            log.warning("client %s: %s training rows < batch-size %s with %s.drop-last: no local step this round "
                        "(as in the authors' code, whose server counts only clients with at least a batch)",
                        self.job.cid, d.num_train, opt_cfg.batch_size, cfg.NAME)
        optimizer = None
        named = [(n, p) for n, p in self.job.model.named_parameters() if p.requires_grad]
        if cfg.persistent_optimizer:
            optimizer = make_optimizer([p for _, p in named], opt_cfg)
            load_momentum(optimizer, named, state.get_arrays(STATE_OPTIMIZER), self.job.cid)
        stats = local_train(self.job.model, d.x_train, d.y_train, opt_cfg, self.terms(),
                            generator=self.job.generator, forward=self.forward, optimizer=optimizer)
        if optimizer is not None:
            state.put_arrays(STATE_OPTIMIZER, momentum_arrays(optimizer, named))
        if cfg.lr_step_epochs > 0:
            state.put_config(STATE_SCHEDULE, {"trainings": trainings_done(state) + 1})
        return stats

    def before_fit(self) -> dict[str, float | int]:
        self.neck.stats.pop("eval")      # the received model's evaluation: not the P-FL figure
        return {}

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, Z) with logits = predictor(mix(Z, Z_hat)); Z_hat kept for L_CD."""
        assert isinstance(model, FLModel)
        if self.mixup is None:
            z = model.features(x)
            z_hat = self.neck.augment(z)
            self.cd_term.z_hat = z_hat
            return model.head(self.neck.mix(z, z_hat)), z
        x_mix, perm, lam = mix_batch(x, self.rng, self.neck.cfg.mixup_alpha)
        both = model.features(torch.cat([x, x_mix]))
        z, z_mix = both[: x.shape[0]], both[x.shape[0]:]
        z_hat, z_mix_hat = self.neck.augment(z), self.neck.augment(z_mix)
        self.cd_term.z_hat, self.cd_term.mixed = z_hat, (z_mix, z_mix_hat)
        o = self.neck.mix(z_mix, z_mix_hat)
        self.mixup.pending = (o if self.neck.cfg.mixup_logits == "features" else model.head(o), y, y[perm], lam)
        return model.head(self.neck.mix(z, z_hat)), z

    def extra_metrics(self, stats: TrainStats) -> dict[str, float | int]:
        out: dict[str, float | int] = {CD_LOSS: self.cd_term.running.mean()}
        if self.mixup is not None:
            out[MIXUP_LOSS] = self.mixup.running.mean()
        train = self.neck.stats.pop("train")
        if train is not None:
            out[TRAIN_DENSITY] = train[0]
        evaluated = self.neck.stats.pop("eval")   # None without a local test split (or with lra-eval = identity)
        if evaluated is not None:
            out[EVAL_DENSITY] = evaluated[0]
        return out
