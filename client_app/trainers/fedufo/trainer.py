"""FedUFO client (Zhang et al., ICCV 2021, seed 002; docs/METHODS.md, FedUFO): prior and posterior phases.

A round reaches a client as up to two messages (the ClientApp sets ``job.phase`` from the action):
    "train.prior"     : train the prior w~_k from theta_t on local data with CE only; keep it in client
                        state and return it with this client's class counts and theta_t's accuracy on
                        the training data (dynamic sampling's default ranking; no local test split needed).
    "train.posterior" : the relay carries the other members' priors ("fedufo.prior.<cid>") and the group
                        ("fedufo.group": member ids and class proportions p_j); train the posterior w_k.
    "train"           : a posterior round without relay (CGL only, or UAD against a frozen D in stage
                        two): nothing from other clients is needed.
Posterior objective (paper Eqs. 11-12), one local loop with pluggable terms:
    stage one: CE + L_uniform (D frozen) for the round's local epochs, then D on L^d_cls with the model
               frozen (``fedufo.disc-schedule = "paper"``, Sec. 3.4), or one D step after every model step
               ("alternating");
    stage two: CE + L_uniform + L_cgr + lambda * L_cgl (D frozen unless ``fedufo.disc-train-stage-two``).
The discriminator D (2 FC + ReLU, hidden = feature width, ``fedufo.num-clients`` outputs) lives in
``model.extras["disc"]`` (only when UAD is on) so the server averages it with the model. D's output size must
be known when the server builds the initial model, before any client registers, hence the run-config key;
the strategy checks that every registered client id is below it and sends the registered ids
("fedufo-clients"): Eqs. 4-5 use only their outputs, so K is the federation's size as in the paper.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord
from torch import nn

from client_app.trainers.base import Trainer, frozen_copy
from client_app.trainers.fedufo.loss_terms import (CGLTerm, CGRTerm, CrossEntropyMeter, DiscriminatorPhase, DiscriminatorTerm,
                                             LiveOutputs, PriorBank, UniformTerm, _Meter, model_only_params,
                                             set_trainable)
from client_app.training import LossTerm, OptimConfig, TrainStats, evaluate, local_train
from flcore.config import ConfigError
from flcore.methods.fedufo import (CGR_ENTROPY, CGR_MAX_PROB, CLIENTS_KEY, COUNTS_KEY, DISC_PREFIX, DISC_STEPS,
                                   GLOBAL_TRAIN_ACCURACY, GROUP_KEY, PRIOR_KEY, STAGE_KEY, STATE_PRIOR, STATE_PRIOR_ROUND,
                                   FedUFOConfig, active_terms, needs_relay)
from flcore.records import model_params, record_to_params
from models.base import FLModel

log = logging.getLogger("noniid_fl")



# ===================================================================================== the trainer
class FedUFOTrainer(Trainer):
    def __init__(self, job) -> None:
        super().__init__(job)
        self.ufo = job.cfg.section(FedUFOConfig)
        if STAGE_KEY not in job.config:
            raise KeyError(f"client {job.cid}: the FedUFO message's config lacks '{STAGE_KEY}' (the FedUFO strategy "
                           "sends the round's stage; see docs/PROTOCOL.md)")
        self.stage = int(job.config[STAGE_KEY])
        self.outputs: LiveOutputs | None = None
        if "uad" in self.ufo.losses:
            if CLIENTS_KEY not in job.config:
                raise KeyError(f"client {job.cid}: the FedUFO message's config lacks '{CLIENTS_KEY}' (the registered "
                               "client ids, D's live outputs; see docs/PROTOCOL.md)")
            self.outputs = LiveOutputs(list(job.config[CLIENTS_KEY]), self.ufo.num_clients, job.device)
            self.outputs.column(job.cid)  # this client must be one of them
        self.meters: dict[str, _Meter] = {}
        self.disc_updates: DiscriminatorTerm | DiscriminatorPhase | None = None
        self.num_priors = 0
        self.prior_retrained = 0
        if not 0 <= job.cid < self.ufo.num_clients:
            raise ConfigError(f"client {job.cid}: id outside the discriminator's outputs; run-config key "
                              f"'fedufo.num-clients' ({self.ufo.num_clients}) must exceed every client id")

    @property
    def disc(self) -> nn.Module:
        return self.job.model.extras["disc"]

    # ------------------------------------------------------------------ phases
    def before_fit(self) -> dict[str, float | int]:
        """theta_t's accuracy on this client's training data, in the first reply of the client's round (prior
        or single-phase train): what dynamic sampling ranks by default; it needs no local test split."""
        if self.job.phase not in ("train.prior", "train"):
            return {}
        d = self.job.data
        _, acc = evaluate(self.job.model, d.x_train, d.y_train)
        return {GLOBAL_TRAIN_ACCURACY: acc}

    def fit(self) -> TrainStats:
        phase = self.job.phase
        if phase == "train.prior":
            return self._fit_prior()
        if phase in ("train.posterior", "train"):
            return self._fit_posterior()
        raise ValueError(f"client {self.job.cid}: FedUFO has no phase '{phase}' "
                         "(expected train.prior, train.posterior or train)")

    def _local(self, model: FLModel, terms: list[LossTerm], optim: OptimConfig) -> TrainStats:
        d = self.job.data
        disc = model.extras["disc"] if "disc" in model.extras else nn.Identity()
        set_trainable(disc, False)  # D is frozen while the model trains (Sec. 3.4)
        try:
            return local_train(model, d.x_train, d.y_train, optim, terms, generator=self.job.generator,
                               forward=self.forward, params=model_only_params(model))
        finally:
            set_trainable(disc, True)

    def _prior_optim(self) -> OptimConfig:
        base = self.optim_config()
        epochs = self.ufo.prior_epochs or base.epochs
        return OptimConfig(base.lr, epochs, base.batch_size, base.momentum, base.weight_decay, base.max_steps)

    def _disc_optim(self, per_step: bool = False) -> OptimConfig:
        """D's SGD: the model's momentum and weight decay, lr ``fedufo.disc-lr`` (0: lr); the paper schedule's
        phase runs ``fedufo.disc-epochs`` epochs (0: local-epochs) under the max-local-steps cap."""
        base, ufo = self.optim_config(), self.ufo
        epochs = base.epochs if per_step else (ufo.disc_epochs or base.epochs)
        return OptimConfig(ufo.disc_lr or base.lr, epochs, base.batch_size, base.momentum, base.weight_decay,
                           0 if per_step else base.max_steps)

    def _own_prior_needed(self) -> bool:
        return "cgr" in active_terms(self.stage, self.ufo) or self.ufo.posterior_init == "prior"

    def _fit_prior(self) -> TrainStats:
        """Step 1 of Fig. 2: w~_k from theta_t with CE on local data only; kept for the posterior phase."""
        stats = self._local(self.job.model, [], self._prior_optim())
        if self._own_prior_needed():
            self.job.state.put_arrays(STATE_PRIOR, dict(model_params(self.job.model)))
            self.job.state.put_config(STATE_PRIOR_ROUND, {"round": int(self.job.server_round)})
        return stats

    def _own_prior(self) -> dict[str, np.ndarray]:
        """This client's prior of this round from client state, or retrained if the state was lost."""
        meta = self.job.state.get_config(STATE_PRIOR_ROUND)
        stored = self.job.state.get_arrays(STATE_PRIOR)
        if meta is not None and stored and int(meta["round"]) == self.job.server_round:
            return stored
        if self.job.phase == "train.posterior":
            log.warning("client %s round %s: own prior not in client state; retraining it",
                        self.job.cid, self.job.server_round)
        self.prior_retrained = 1
        prior = copy.deepcopy(self.job.model)
        prior.load_state_dict(self.job.global_params)
        self._local(prior, [], self._prior_optim())
        return dict(model_params(prior))

    def _prior_model(self, params: dict[str, np.ndarray], who: str) -> nn.Module:
        model = frozen_copy(self.job.model)
        model.load_state_dict(self.job.global_params)
        expected = [k for k in model.state_dict() if not k.startswith(DISC_PREFIX)]
        missing = [k for k in expected if k not in params]
        if missing:
            raise ValueError(f"client {self.job.cid}: prior of {who} lacks tensors {missing[:3]}")
        model.load_state_dict({k: torch.as_tensor(np.asarray(params[k])) for k in expected}, strict=False)
        return model.to(self.job.device)

    def _relay(self) -> tuple[list[int], list[nn.Module], torch.Tensor]:
        """(other member ids, their prior models, proportions (J, C) ordered as [others..., self])."""
        if GROUP_KEY not in self.job.records:
            raise ValueError(f"client {self.job.cid}: stage {self.stage} posterior needs the relay record "
                             f"'{GROUP_KEY}' but the message has only {sorted(self.job.records)}")
        record = self.job.records[GROUP_KEY]
        if not isinstance(record, ConfigRecord):
            raise TypeError(f"client {self.job.cid}: relay record '{GROUP_KEY}' is a {type(record).__name__}, "
                            "not a ConfigRecord")
        group = dict(record)
        members, classes = group["cids"], group["num-classes"]
        if not isinstance(members, list) or isinstance(classes, list):
            raise TypeError(f"client {self.job.cid}: relay record '{GROUP_KEY}' has cids {members!r} and "
                            f"num-classes {classes!r}: expected a list and a number")
        cids = [int(c) for c in members]
        num_classes = int(classes)
        props = np.asarray(group["proportions"], dtype=np.float64).reshape(len(cids), num_classes)
        if self.job.cid not in cids:
            raise ValueError(f"client {self.job.cid}: not listed in the relay group {cids}")
        others, models, rows = [], [], []
        for row, cid in enumerate(cids):
            if cid == self.job.cid:
                continue
            key = f"{PRIOR_KEY}{cid}"
            if key not in self.job.records:
                raise ValueError(f"client {self.job.cid}: relay lacks the prior of member {cid} ('{key}')")
            prior = self.job.records[key]
            if not isinstance(prior, ArrayRecord):
                raise TypeError(f"client {self.job.cid}: prior '{key}' is a {type(prior).__name__}, not an ArrayRecord")
            models.append(self._prior_model(dict(record_to_params(prior)), f"member {cid}"))
            others.append(cid)
            rows.append(row)
        rows.append(cids.index(self.job.cid))
        return others, models, torch.as_tensor(props[rows], dtype=torch.float32, device=self.job.device)

    def _fit_posterior(self) -> TrainStats:
        """Step 3 of Fig. 2: the posterior w_k under the stage's objective (Eqs. 11 / 12)."""
        job, ufo = self.job, self.ufo
        terms_on = active_terms(self.stage, ufo)
        if job.phase == "train" and needs_relay(self.stage, ufo):
            raise ValueError(f"client {job.cid}: stage {self.stage} with fedufo-losses='{ufo.losses_}' "
                             "needs the prior/relay exchange (train.prior, train.posterior), got a plain 'train'")
        global_model = None
        if "cgl" in terms_on:
            global_model = frozen_copy(job.model)
        own_prior = self._own_prior() if self._own_prior_needed() else None
        if ufo.posterior_init == "prior" and own_prior is not None:
            job.model.load_state_dict({k: torch.as_tensor(v) for k, v in own_prior.items()
                                       if not k.startswith(DISC_PREFIX)}, strict=False)
        self.meters["ce"] = CrossEntropyMeter()
        terms: list[LossTerm] = [self.meters["ce"]]
        others: list[int] = []
        prior_models: list[nn.Module] = []
        props: torch.Tensor | None = None
        if needs_relay(self.stage, ufo):
            others, prior_models, props = self._relay()
            self.num_priors = len(others)
        train_disc = "disc" in terms_on
        alternating = train_disc and ufo.disc_schedule == "alternating"
        bank: PriorBank | None = None
        if "cgr" in terms_on or alternating:  # the priors' outputs are needed at every model step
            models = list(prior_models)
            if "cgr" in terms_on:
                assert own_prior is not None and props is not None
                models.append(self._prior_model(own_prior, "this client"))
            bank = PriorBank(models, len(others))
            terms.append(bank)
        if "uad" in terms_on:
            assert self.outputs is not None
            self.meters["uniform"] = UniformTerm(self.disc, self.outputs)
            terms.append(self.meters["uniform"])
        if "cgr" in terms_on:
            assert bank is not None and props is not None
            self.meters["cgr"] = CGRTerm(bank, props, ufo.cgr_target, ufo.kl_direction)
            terms.append(self.meters["cgr"])
        if "cgl" in terms_on:
            assert global_model is not None  # frozen above when cgl is on
            self.meters["cgl"] = CGLTerm(global_model, ufo.cgl_lambda, ufo.kl_direction)
            terms.append(self.meters["cgl"])
        if alternating:
            assert bank is not None
            assert self.outputs is not None
            self.disc_updates = DiscriminatorTerm(self.disc, job.cid, others, bank, self._disc_optim(per_step=True),
                                                  self.outputs)
            terms.append(self.disc_updates)
        stats = self._local(job.model, terms, self.optim_config())
        if train_disc and not alternating:  # the paper's order: the model's epochs, then D (model fixed)
            assert self.outputs is not None
            self.disc_updates = DiscriminatorPhase(self.disc, job.cid, others, prior_models, self._disc_optim(),
                                                   self.outputs)
            self.disc_updates.run(job.model, job.data.x_train, job.data.y_train, job.generator)
        if self.disc_updates is not None:
            self.meters["disc"] = self.disc_updates
        if own_prior is not None and job.phase == "train.posterior":
            job.state.put_arrays(STATE_PRIOR, {})  # used up: do not keep a model per client in state
        return stats

    # ------------------------------------------------------------------ reply
    def extra_metrics(self, stats: TrainStats) -> dict[str, float | int]:
        out: dict[str, float | int] = {"fedufo-stage": self.stage, "fedufo-priors-received": self.num_priors,
                                       "fedufo-own-prior-retrained": self.prior_retrained}
        for name, meter in self.meters.items():
            out[f"fedufo-{name}-loss"] = meter.mean  # uniform, disc, cgr, cgl and ce (= CE_LOSS)
        cgr = self.meters.get("cgr")
        if isinstance(cgr, CGRTerm):
            out[CGR_MAX_PROB] = cgr.target_max_prob.mean
            out[CGR_ENTROPY] = cgr.target_entropy.mean
        if self.disc_updates is not None:
            out["fedufo-disc-own-accuracy"] = self.disc_updates.own_accuracy
            out[DISC_STEPS] = self.disc_updates.steps
        return out

    def extra_records(self) -> dict[str, Any]:
        if self.job.phase == "train.prior":
            return {COUNTS_KEY: ConfigRecord({"counts": [int(c) for c in self.job.data.class_counts()]})}
        return {}


__all__ = ["FedUFOTrainer"]
