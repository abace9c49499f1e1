"""FedBC server (seed 001, Algorithm 1): per-client Lagrange multipliers and dual-weighted averaging.

Per client k (keyed by its stable client id) the server keeps lambda_k, gamma_k and their heavy-ball
buffers. Each round:
  1. every sampled client gets z_t plus its own lambda_k, gamma_k (``client_config``) and minimises
     f_k(x) + lambda_k (||x - z_t||^2 - gamma_k) locally (client_app/trainers/fedbc.py);
  2. for each client whose update is valid: lambda_k takes a projected ascent step on
     ||x_k - z_t||^2 - gamma_k (Eq. 11) and gamma_k a descent step gamma_k += eta_gamma * lambda_k;
     clients that were sampled but failed, timed out or were rejected keep lambda_k, gamma_k untouched;
  3. z_{t+1} = sum_k lambda_k x_k / sum_k lambda_k over those clients (Eq. 12), falling back to
     sample-weighted averaging (logged) when sum lambda = 0. The control ``fedbc-uniform``
     (:class:`FedBCUniformStrategy`) takes the plain mean instead, with steps 1-2 unchanged.
results.json records per round (``round_metrics``): lambda/gamma of every known client and their
mean/min/max, the same statistics over this round's clients, the lambda each of them trained with, the
weights used next to the sample and uniform weights (and their L1 gaps), and the mean penalty
lambda_k (||x_k - z||^2 - gamma_k) at the returned models.
With ``fedbc.dual-step = 'code'`` (the default of ``fedbc-code``) step 2 is the authors' one optimizer over the
whole [lambda, gamma] vectors of every known client, stepped after each valid update in ascending client id
(:func:`strategies.methods.fedbc.duals.code_dual_step`; the code steps in its sampler's draw order, after each
client's training, so a client later in its round trains with multipliers its predecessors' steps moved; here
every sampled client trains in parallel with the values of the round's start).
Initial values follow the authors' code: lambda_k = 0 (``torch.zeros``) and gamma_k = 0 (paper,
"Selection of gamma"). With lambda = 0 a client's first local problem is plain FedAvg; its first dual
step then sets lambda_k = eta_lambda * ||x_k - z||^2 > 0.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from flcore.config import RunConfig
from flcore.methods.fedbc import GAMMA_KEY, LAMBDA_KEY, LOCAL_ACC, SQ_DIST, fedbc_config
from strategies.base import ClientUpdate, FLStrategy, Params
from strategies.methods.fedbc.duals import (code_dual_step, dual_ascent, dual_weighted_average, gamma_step,
                                            squared_distance, stats, uniform_average, weight_gaps)

log = logging.getLogger("noniid_fl")



@dataclass
class DualState:
    """One client's dual variables and their momentum buffers."""

    lam: float
    gamma: float
    lam_buf: float = 0.0
    gamma_buf: float = 0.0


class FedBCStrategy(FLStrategy):
    """Projected dual ascent on per-client multipliers + dual-weighted averaging (FedBC, Algorithm 1)."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.hp = fedbc_config(cfg)
        self.duals: dict[int, DualState] = {}
        self.last_round: dict[str, Any] = {}

    # ------------------------------------------------------------------ per-client state
    def dual(self, cid: int) -> DualState:
        """The dual variables of client ``cid`` (created at their initial values on first use)."""
        if cid not in self.duals:
            self.duals[cid] = DualState(self.hp.lambda_init, self.hp.gamma_init)
        return self.duals[cid]

    def client_config(self, server_round: int, cid: int) -> dict[str, Any]:
        d = self.dual(cid)
        return {LAMBDA_KEY: float(d.lam), GAMMA_KEY: float(d.gamma)}

    def dual_update(self, cid: int, sq_dist: float) -> DualState:
        """Eq. (11) for lambda_k and the gamma heuristic, taken at the same (pre-update) point of L."""
        c, d = self.hp, self.dual(cid)
        lam, lam_buf = dual_ascent(d.lam, sq_dist - d.gamma, c.eta_lambda, c.upper, c.lambda_momentum, d.lam_buf)
        gamma, gamma_buf = d.gamma, d.gamma_buf
        if not c.fix_gamma:
            gamma, gamma_buf = gamma_step(d.gamma, d.lam, c.eta_gamma, c.lambda_momentum, d.gamma_buf)
        self.duals[cid] = DualState(lam, gamma, lam_buf, gamma_buf)
        return self.duals[cid]

    def code_dual_updates(self, steps: list[tuple[int, float]]) -> None:
        """The authors' dual optimizer (``dual-step = 'code'``): one step over every known client's lambda and
        gamma per (cid, ||x_k - z||^2) in ``steps``, in that order (:func:`code_dual_step`)."""
        c = self.hp
        cids = sorted(set(self.clients) | set(self.duals) | {cid for cid, _ in steps})
        ds = [self.dual(cid) for cid in cids]
        lam, gam = np.array([d.lam for d in ds]), np.array([d.gamma for d in ds])
        lbuf, gbuf = np.array([d.lam_buf for d in ds]), np.array([d.gamma_buf for d in ds])
        index = {cid: i for i, cid in enumerate(cids)}
        for cid, sq in steps:
            lam, gam, lbuf, gbuf = code_dual_step(lam, gam, lbuf, gbuf, index[cid], sq, c.eta_lambda, c.eta_gamma,
                                                  c.lambda_momentum, c.upper, c.fix_gamma)
        for i, cid in enumerate(cids):
            self.duals[cid] = DualState(float(lam[i]), float(gam[i]), float(lbuf[i]), float(gbuf[i]))

    # ------------------------------------------------------------------ aggregation
    def combine(self, updates: list[ClientUpdate], lambdas: list[float]) -> tuple[Params, np.ndarray, str]:
        """z_{t+1} from this round's models: sum lambda x / sum lambda (Eq. 12), sample-weighted when
        sum lambda = 0 (logged). Returns (z, the weights used, how they were chosen)."""
        sizes = [u.num_examples for u in updates]
        params, weights, fallback = dual_weighted_average([u.params for u in updates], lambdas, sizes)
        return params, weights, "sample-weighted-fallback" if fallback else "dual-weighted"

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        """Dual steps for the clients with valid updates only, then :meth:`combine`."""
        sq = {u.cid: squared_distance(u.params, params) for u in updates}
        trained = [(self.dual(u.cid).lam, self.dual(u.cid).gamma) for u in updates]   # what the clients used
        if self.hp.dual_step == "code":
            self.code_dual_updates([(u.cid, sq[u.cid]) for u in sorted(updates, key=lambda u: u.cid)])
        else:
            for u in updates:
                self.dual_update(u.cid, sq[u.cid])
        lambdas = [self.duals[u.cid].lam for u in updates]
        new_params, weights, how = self.combine(updates, lambdas)
        if how == "sample-weighted-fallback":
            log.warning("round %s: FedBC sum of lambda over %s client(s) is 0; z is the sample-weighted "
                        "average this round", server_round, len(updates))
        sizes = [u.num_examples for u in updates]
        n = np.asarray(sizes, np.float64)
        gamma_after = [self.duals[u.cid].gamma for u in updates]
        # lambda_k (||x_k - z||^2 - gamma_k) at the returned model, with the lambda/gamma it trained with
        penalty = [lam * (sq[u.cid] - gam) for u, (lam, gam) in zip(updates, trained)]
        local_model_acc = [float(u.metrics[LOCAL_ACC]) for u in updates
                           if LOCAL_ACC in u.metrics and math.isfinite(float(u.metrics[LOCAL_ACC]))]
        gaps = weight_gaps(weights, sizes)
        self.last_round = {
            "fedbc-fallback": int(how == "sample-weighted-fallback"),
            "fedbc-aggregation": how,
            "fedbc-round-cids": [int(u.cid) for u in updates],
            "fedbc-sq-dist": [float(sq[u.cid]) for u in updates],
            "fedbc-round-weights": [float(w) for w in weights],
            "fedbc-round-sample-weights": [float(v) for v in n / n.sum()],
            "fedbc-weights-l1-vs-samples": gaps["vs-samples"],
            "fedbc-weights-l1-vs-uniform": gaps["vs-uniform"],
            "fedbc-round-lambda-trained": [float(lam) for lam, _ in trained],
            "fedbc-penalty-mean": float(np.mean(penalty)),
            # as reported by the clients (cross-check of fedbc-sq-dist; NaN where not reported)
            "fedbc-client-sq-dist": [float(u.metrics.get(SQ_DIST, float("nan"))) for u in updates],
            # None when no client has a local test split (local-test-fraction = 0)
            "fedbc-local-model-accuracy": float(np.mean(local_model_acc)) if local_model_acc else None,
        }
        for name, vec in (("lambda", lambdas), ("gamma", gamma_after)):   # this round's clients, after the step
            self.last_round.update({f"fedbc-round-{name}-{k}": v for k, v in stats(vec).items()})
        return new_params

    # ------------------------------------------------------------------ logging, checkpoints
    def round_metrics(self) -> dict[str, Any]:
        """lambda/gamma of every known client (vectors ordered by cid, plus mean/min/max), the same statistics
        over this round's clients, and this round's aggregation: enough to redraw the paper's Figure 3(b)/(c)
        from results.json and to see whether the dual weighting differs from sample or uniform weights."""
        cids = sorted(set(self.clients) | set(self.duals))
        lam = [self.dual(c).lam for c in cids]
        gam = [self.dual(c).gamma for c in cids]
        out: dict[str, Any] = {
            "fedbc-cids": [int(c) for c in cids],
            "fedbc-lambda": [float(v) for v in lam],
            "fedbc-gamma": [float(v) for v in gam],
            "fedbc-num-examples": [int(self.clients[c].num_examples) if c in self.clients else 0 for c in cids],
        }
        for name, vec in (("lambda", lam), ("gamma", gam)):
            if vec:
                out.update({f"fedbc-{name}-{k}": v for k, v in stats(vec).items()})
        out.update(self.last_round)
        return out

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["fedbc"] = {str(cid): [d.lam, d.gamma, d.lam_buf, d.gamma_buf] for cid, d in self.duals.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if "fedbc" not in state:
            raise ValueError("checkpoint has no 'fedbc' entry: it was not written by the FedBC strategy")
        self.duals = {int(cid): DualState(*(float(v) for v in vals)) for cid, vals in state["fedbc"].items()}


class FedBCUniformStrategy(FedBCStrategy):
    """``fedbc-uniform``: FedBC's clients and dual updates, but z_{t+1} = the plain mean of the returned models.

    The control that separates FedBC's dual weighting (Eq. 12) from the change of averaging itself: FedAvg
    weights by n_k, FedBC by lambda_k; this strategy weights every returned model equally, while lambda_k and
    gamma_k still take exactly FedBC's steps and reach the clients' local objectives.
    """

    def combine(self, updates: list[ClientUpdate], lambdas: list[float]) -> tuple[Params, np.ndarray, str]:
        params, weights = uniform_average([u.params for u in updates])
        return params, weights, "uniform"
