"""FedBR client: local learning bias reduction (Guo, Tang & Lin, ICML 2023; seed 003, Algorithm 1).

Model = feature extractor phi (``model.backbone``), classifier omega (``model.head``), plus the projection
head P_theta in ``model.extras["proj"]`` (added by models/extras.py: ``add_fedbr_projection``); all three are
averaged.
Every local step k, inside the one loop (client_app/training.py), with the pseudo batch D_p:

  Max step (Alg. 1 line 8, Eq. 2), theta only:   theta <- theta - eta * grad_theta(-L_con)
      (plain SGD with the run's weight decay, as the authors' code; ``fedbr.max-momentum`` adds momentum)
  Min step (Alg. 1 lines 10-11, Eq. 3), phi and omega:
      CE(omega(phi(x)), y) + lambda * CE_soft(omega(phi(x_p)), y~_p) + mu * L_con(theta after the max step)

How this maps onto the loop's hooks (terms are called in list order):
  PseudoBatch.before_step  builds this step's pseudo batch (Mixture redraws its local partners every step)
                           and phi_g(x_p) (cached while x_p is unchanged, e.g. a whole round for RSM);
  PseudoBatch.loss         phi_i(x_p) once per step, shared by the other terms;
  MaxStep.loss             the max step on detached features with its own optimizer over theta. phi does not
                           change between the max step and the min step's forward, so doing it after the
                           forward is exactly Alg. 1 (max step on phi^{k-1}, then min step with theta^k) and
                           saves a second forward of the real batch;
  ContrastiveTerm.loss     mu * L_con (component 2, feature debiasing);
  PseudoClassTerm.loss     lambda * CE_soft on the pseudo batch (component 1, classifier debiasing).
The min step's optimizer gets every parameter except theta (``params=`` of local_train), and theta's
``requires_grad`` is off outside the max step, so the min step cannot change theta.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from client_app.trainers.base import Trainer, frozen_copy
from client_app.trainers.fedbr.pseudo_data import (contrastive_loss, mixture_pseudo_data, mixup, rsm_pseudo_data,
                                                   similarities, soft_cross_entropy)
from client_app.trainers.fedbr.shared import proxy_set, set_seed as _seed, shared_rsm
from client_app.training import LossTerm, Step, TrainStats, forward_features, local_train
from flcore.methods.fedbr import (CON_AFTER_MAX, CON_BEFORE_MAX, CON_END, NUM_CLIENTS, PSEUDO_CE, SIM_GLOBAL,
                                  SIM_REAL, STATE_KEY, br_config)
from models.base import FLModel

# (x, y) of the step's real batch, or None before the round -> (x_p, y~_p)
PseudoMaker = Callable[[torch.Tensor | None, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]


# ------------------------------------------------------------------------------------------------ loss terms
class PseudoBatch(LossTerm):
    """This step's pseudo batch x_p, its target y~_p, phi_g(x_p) and phi_i(x_p) (shared by the other terms).

    ``global_once``: phi_g is computed on the round's first pseudo batch only and reused at every step, even
    when Mixture redraws x_p (the authors' code caches it so); by default it is phi_g of the current x_p (Eq. 5).
    """

    def __init__(self, make: PseudoMaker, per_step: bool, need_global: bool, global_once: bool = False) -> None:
        self.make, self.per_step, self.need_global, self.global_once = make, per_step, need_global, global_once
        self.x: torch.Tensor | None = None  # x_p
        self.q: torch.Tensor | None = None  # y~_p
        self.g: torch.Tensor | None = None  # phi_g(x_p)
        self.z: torch.Tensor | None = None  # phi_i(x_p)
        self._global: FLModel | None = None

    def _refresh(self, x: torch.Tensor | None = None, y: torch.Tensor | None = None) -> None:
        self.x, self.q = self.make(x, y)
        if self.need_global and not (self.global_once and self.g is not None):
            assert self._global is not None  # frozen at begin when need_global
            with torch.no_grad():
                self.g = self._global.features(self.x)

    def begin(self, model: nn.Module) -> None:
        self.g = None
        if self.need_global:
            assert isinstance(model, FLModel)
            self._global = frozen_copy(model)  # phi_g = the round's received extractor
        if not self.per_step:
            self._refresh()  # fixed for the whole round: phi_g(x_p) computed once

    def before_step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.per_step:
            self._refresh(x, y)

    def loss(self, model: nn.Module, step: Step) -> None:
        assert isinstance(model, FLModel) and self.x is not None
        self.z = model.features(self.x)  # phi_i(x_p), with graph
        return None

    def end(self, model: nn.Module) -> None:
        self.x = self.q = self.g = self.z = None
        self._global = None


class MaxStep(LossTerm):
    """Alg. 1 line 8 / Eq. (2): one SGD step on theta that maximises L_con (minimises -L_con)."""

    def __init__(self, pb: PseudoBatch, tau1: float, tau2: float, pairing: str, lr: float, momentum: float,
                 weight_decay: float) -> None:
        self.pb, self.tau1, self.tau2, self.pairing = pb, tau1, tau2, pairing
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.sum = 0.0
        self.count = 0

    def begin(self, model: nn.Module) -> None:
        assert isinstance(model, FLModel)
        self.proj = model.extras["proj"]
        self.params = list(self.proj.parameters())
        self.opt = torch.optim.SGD(self.params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def loss(self, model: nn.Module, step: Step) -> None:
        pb = self.pb
        assert pb.z is not None  # PseudoBatch.loss ran before this term
        for p in self.params:
            p.requires_grad_(True)
        try:
            with torch.enable_grad():
                l_con = contrastive_loss(self.proj(pb.z.detach()), self.proj(pb.g), self.proj(step.features.detach()),
                                         self.tau1, self.tau2, self.pairing)
                grads = torch.autograd.grad(-l_con, self.params)
            for p, g in zip(self.params, grads):
                p.grad = g
            self.opt.step()
        finally:
            self.opt.zero_grad(set_to_none=True)
            for p in self.params:
                p.requires_grad_(False)
        self.sum += float(l_con.detach())
        self.count += 1
        return None


class ContrastiveTerm(LossTerm):
    """mu * L_con in the min step (component 2); gradients reach phi through phi_i(x_p) and phi_i(x).

    Also measures the mechanism: the two cosine similarities inside L_con (f1: pseudo local vs pseudo global,
    f2: pseudo local vs real local) and, at the end of local training, L_con of the final theta and phi on the
    last step's batches (the min steps should have lowered it below the max steps' values).
    """

    def __init__(self, pb: PseudoBatch, mu: float, tau1: float, tau2: float, pairing: str) -> None:
        self.pb, self.mu, self.tau1, self.tau2, self.pairing = pb, mu, tau1, tau2, pairing
        self.sum = self.sim_global = self.sim_real = 0.0
        self.count = 0
        self.end_value: float | None = None
        self._last: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor:
        assert isinstance(model, FLModel)
        assert self.pb.x is not None and self.pb.g is not None  # need_global: phi_g(x_p) is made with x_p
        proj = model.extras["proj"]
        a, g, c = proj(self.pb.z), proj(self.pb.g), proj(step.features)
        l_con = contrastive_loss(a, g, c, self.tau1, self.tau2, self.pairing)
        with torch.no_grad():
            s1, s2 = similarities(a, g, c, self.pairing)
        self.sum += float(l_con.detach())
        self.sim_global += s1
        self.sim_real += s2
        self.count += 1
        self._last = (self.pb.x, self.pb.g, step.x)
        return self.mu * l_con

    def end(self, model: nn.Module) -> None:
        if self._last is None:
            return
        x_p, g, x = self._last
        assert isinstance(model, FLModel)
        proj = model.extras["proj"]
        with torch.no_grad():
            self.end_value = float(contrastive_loss(proj(model.features(x_p)), proj(g), proj(model.features(x)),
                                                    self.tau1, self.tau2, self.pairing))
        self._last = None


class PseudoClassTerm(LossTerm):
    """lambda * CE_soft(omega(phi(x_p)), y~_p) in the min step (component 1)."""

    def __init__(self, pb: PseudoBatch, lam: float) -> None:
        self.pb, self.lam = pb, lam
        self.sum = 0.0
        self.count = 0

    def loss(self, model: nn.Module, step: Step) -> torch.Tensor:
        assert isinstance(model, FLModel) and self.pb.q is not None
        ce = soft_cross_entropy(model.head(model.neck(self.pb.z)), self.pb.q)
        self.sum += float(ce.detach())
        self.count += 1
        return self.lam * ce


# ------------------------------------------------------------------------------------------------ trainer
class FedBRTrainer(Trainer):
    """Local training of FedBR: the base loop plus the max/min-step terms above."""

    def __init__(self, job) -> None:
        super().__init__(job)
        self.fb = br_config(job.cfg)  # fedbr.* or, for fedbr-code, fedbr-code.*
        self._mix: tuple[torch.Tensor, float] | None = None
        self._terms: list[LossTerm] = []
        self._gen = torch.Generator().manual_seed(_seed(job.cfg.seed, job.cid, job.server_round, 13))

    # --- pseudo-data -----------------------------------------------------------------------------
    def pseudo_source(self) -> tuple[PseudoMaker, bool]:
        """(function of the step's batch returning (x_p, y~_p), whether it must be called every step)."""
        fb, job, d = self.fb, self.job, self.job.data
        shape = tuple(d.x_train.shape[1:])
        if fb.pseudo == "rsm":
            if fb.rsm_scope == "shared":
                xs, qs = shared_rsm(job.cfg, fb, int(job.config.get(NUM_CLIENTS, 0)), job.server_round, job.cid,
                                    d.x_train)
                x, q = xs.to(d.x_train.device), qs.to(d.x_train.device)
            else:
                x, q = self._rsm(fb.pseudo_refresh == "once")
            return (lambda xb, yb: (x, q)), False
        proxy = proxy_set(job.cfg, fb, shape, job.server_round).to(d.x_train.device)
        from_batch = fb.mixture_partners == "batch"

        def make(xb: torch.Tensor | None, yb: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
            if from_batch and xb is not None:
                assert yb is not None  # the step's batch: x with its y
                xs, ys = xb, yb
            else:
                xs, ys = d.x_train, d.y_train
            return mixture_pseudo_data(proxy, xs, ys, d.num_classes, fb.mixture_k, self._gen)
        return make, fb.mixture_k > 0

    def _rsm(self, once: bool) -> tuple[torch.Tensor, torch.Tensor]:
        fb, job, d = self.fb, self.job, self.job.data
        size = fb.pseudo_count(job.cfg.batch_size)
        want = (size, *d.x_train.shape[1:])
        if once:
            stored = job.state.get_arrays(STATE_KEY)
            if stored is not None and tuple(stored["x"].shape) == want:
                return (torch.from_numpy(stored["x"]).to(d.x_train.device),
                        torch.from_numpy(stored["q"]).to(d.x_train.device))
        gen = torch.Generator().manual_seed(_seed(job.cfg.seed, job.cid, 0 if once else job.server_round, 17))
        x, q = rsm_pseudo_data(d.x_train, size, fb.rsm_size, d.num_classes, gen)
        if once:
            job.state.put_arrays(STATE_KEY, {"x": x.detach().cpu().numpy(), "q": q.detach().cpu().numpy()})
        return x, q

    # --- hooks -----------------------------------------------------------------------------------
    def terms(self) -> list[LossTerm]:
        fb = self.fb
        if not fb.uses_pseudo:
            return []
        make, per_step = self.pseudo_source()
        pb = PseudoBatch(make, per_step, need_global=fb.feature_debias, global_once=fb.global_features == "round")
        terms: list[LossTerm] = [pb]
        if fb.runs_max_step:
            oc = self.optim_config()
            terms.append(MaxStep(pb, fb.tau1, fb.tau2, fb.pairing, fb.proj_lr or oc.lr,
                                 fb.max_momentum, oc.weight_decay))
        if fb.feature_debias:
            terms.append(ContrastiveTerm(pb, fb.mu, fb.tau1, fb.tau2, fb.pairing))
        if fb.classifier_debias:
            terms.append(PseudoClassTerm(pb, fb.lambda_))
        return terms

    def forward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fb.mixup:
            x, perm, lam = mixup(x, self.fb.mixup_alpha, self._gen)
            self._mix = (perm, lam)
        return forward_features(model, x)

    def criterion(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self._mix is None:
            return F.cross_entropy(logits, y)
        perm, lam = self._mix
        return lam * F.cross_entropy(logits, y) + (1.0 - lam) * F.cross_entropy(logits, y[perm])

    def min_step_params(self) -> list[nn.Parameter]:
        """phi and omega (everything trainable except P_theta)."""
        return [p for name, p in self.job.model.named_parameters()
                if p.requires_grad and not name.startswith("extras.proj.")]

    def fit(self) -> TrainStats:
        model, d = self.job.model, self.job.data
        if "proj" not in model.extras:
            raise RuntimeError(f"client {self.job.cid}: FedBR needs model.extras['proj'] "
                               "(models.extras.add_fedbr_projection is the method's model hook)")
        proj_params = list(model.extras["proj"].parameters())
        params = self.min_step_params()
        self._terms = self.terms()
        for p in proj_params:
            p.requires_grad_(False)
        try:
            return local_train(model, d.x_train, d.y_train, self.optim_config(), self._terms,
                               generator=self.job.generator, forward=self.forward, criterion=self.criterion,
                               params=params)
        finally:
            for p in proj_params:
                p.requires_grad_(True)
                p.grad = None

    def extra_metrics(self, stats: TrainStats) -> dict[str, float | int]:
        out: dict[str, float | int] = {}
        for term in self._terms:
            if isinstance(term, MaxStep) and term.count:
                out[CON_BEFORE_MAX] = term.sum / term.count
            elif isinstance(term, ContrastiveTerm) and term.count:
                out.update({CON_AFTER_MAX: term.sum / term.count, SIM_GLOBAL: term.sim_global / term.count,
                            SIM_REAL: term.sim_real / term.count})
                if term.end_value is not None:
                    out[CON_END] = term.end_value
            elif isinstance(term, PseudoClassTerm) and term.count:
                out[PSEUDO_CE] = term.sum / term.count
        return out
