"""FedRANE's server side: GNE, global Nash equilibrium aggregation (seed 000, Sec. 3.4, Alg. 1 l. 21-25).

Each round: deltas Delta_k = theta_k - theta_t of the clients that returned a valid update; their Gram
matrix M = G^T G (float64, layer by layer); Nash-bargaining weights p with p_k (M p)_k = 1 (Eq. 15,
strategies/methods/fedrane/nash.py); then theta_{t+1} = theta_t + G (s p) with the step scale s set by
``fedrane.gne-scale``:

* ``normalized``  (authors' code, default): s = 1 / sum_k p_k, i.e. the convex combination
  sum_k w_k theta_k with w = p / sum p. The Nash solution fixes the direction; this fixes the length
  at that of a weighted average of the client models.
* ``fedavg-norm``: s such that ||G s p|| = ||sum_k (n_k/n) Delta_k||, the Nash direction at the length
  of this round's FedAvg update.
* ``radius``: ||G s p|| = gne-radius (0: K, the paper's text: "seek global updating direction in B_r with
  radius r = K"; the Nash solution lies on the ball's boundary, Sec. 3.4).
* ``server-lr``:  s = gne-server-lr. With s = 1 this is the paper's literal theta + G p, whose norm is
  sqrt(K) whatever the size of the deltas (p^T M p = K at the solution).

A degenerate round (a non-negative combination of the deltas vanishes: no minimiser) falls back to
sample-weighted averaging, logged and reported. A solver failure keeps the last good iterate (or the
start point); it never fails the round. Works under any client trainer (fedrane-no-lra uses the base).

What results.json records every round (``strategy``): the weights (``gne-p``, ``gne-weights``), their spread
(``gne-weight-min``/``-max``/``-ratio``) and their distance from FedAvg's sample fractions
(``gne-tv-from-fedavg``, total variation), the step's norm next to FedAvg's (``gne-update-norm``,
``gne-fedavg-update-norm``, ``gne-step-norm-ratio``) and cosines; with LRA clients also the clients' graph
densities and L_CD (:func:`lra_summary`). ``fedrane-no-gne`` keeps FedAvg's server (so Flower's stock FedAvg can
drive it); its round records have the G-FL evaluation's graph density (``global_lra_graph_density``) only.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from flcore.config import RunConfig
from flcore.methods.fedrane import CD_LOSS, EVAL_DENSITY, MIXUP_LOSS, TRAIN_DENSITY, rane_config
from strategies.aggregation import weighted_average
from strategies.base import ClientUpdate, FLStrategy, Params
from strategies.methods.fedrane.nash import (STATUS_CONVERGED, NashSolution, combine_deltas, delta_gram, floating_keys,
                             nash_degenerate, solve_nash_cvxpy, solve_nash_newton)

log = logging.getLogger("noniid_fl")


def lra_summary(updates: list[ClientUpdate]) -> dict[str, Any]:
    """The LRA clients' reply metrics of a round: graph density of their training graphs (mean, min, max over
    clients), of their P-FL evaluation graphs (mean over the clients that have a local test split), mean L_CD.
    Empty when no client reported them (fedrane-no-lra)."""
    out: dict[str, Any] = {}
    for key, stats in ((TRAIN_DENSITY, ("mean", "min", "max")), (EVAL_DENSITY, ("mean",)), (CD_LOSS, ("mean",)),
                       (MIXUP_LOSS, ("mean",))):
        values = np.array([float(u.metrics[key]) for u in updates if key in u.metrics], dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size:
            out.update({f"{key}-{s}": float(getattr(np, s)(values)) for s in stats})
    return out


def weight_spread(weights: np.ndarray, fractions: np.ndarray) -> dict[str, float]:
    """How far the aggregation weights are from uniform and from FedAvg's sample fractions."""
    w = np.asarray(weights, dtype=np.float64)
    return {"gne-weight-min": float(w.min()), "gne-weight-max": float(w.max()),
            "gne-weight-ratio": float(w.max() / w.min()) if w.min() > 0 else math.inf,
            "gne-tv-from-fedavg": 0.5 * float(np.abs(w - fractions).sum())}


def step_coefficients(gram: np.ndarray, p: np.ndarray, fractions: np.ndarray, scale: str,
                      server_lr: float = 1.0, radius: float = 0.0) -> np.ndarray:
    """Coefficients c of theta_{t+1} = theta_t + sum_k c_k Delta_k for the Nash direction G p.

    normalized: c = p / sum p;  fedavg-norm: c = p * sqrt(f^T M f / p^T M p) (f = sample fractions),
    so ||G c|| = ||G f||;  server-lr: c = server_lr * p;  radius: c = p * r / sqrt(p^T M p), the step on the
    boundary of the ball of radius r (the paper's agreement set B_r; r = K, the number of deltas, when
    ``radius`` is 0).
    """
    p = np.asarray(p, dtype=np.float64)
    if scale == "normalized":
        return p / p.sum()
    if scale == "fedavg-norm":
        f = np.asarray(fractions, dtype=np.float64)
        return p * math.sqrt(max(float(f @ gram @ f), 0.0) / float(p @ gram @ p))
    if scale == "server-lr":
        return server_lr * p
    if scale == "radius":
        r = radius if radius > 0 else float(p.size)
        return p * (r / math.sqrt(float(p @ gram @ p)))
    raise ValueError(f"unknown gne-scale '{scale}'")


def active_updates(params: Params, updates: list[ClientUpdate]) -> list[ClientUpdate]:
    """The updates whose delta theta_k - theta is not exactly zero (fedrane.gne-drop-idle; the authors' code:
    serverFedRANE.py update_global leaves a client whose update is all zero out of the Nash solve)."""
    keys = floating_keys(params)
    return [u for u in updates
            if any(not np.array_equal(np.asarray(u.params[k]), np.asarray(params[k])) for k in keys)]


class GNEStrategy(FLStrategy):
    """Weighted by Nash-bargaining weights instead of sample fractions (FedRANE's GNE)."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.gne = rane_config(cfg)   # fedrane.* or, for fedrane-code, fedrane-code.*
        self.warm: dict[int, float] = {}     # last normalised weight w_k = p_k / sum p of each client
        self._metrics: dict[str, Any] = {}

    # --------------------------------------------------------------------------- the round's weights
    def start_point(self, cids: list[int], fractions: np.ndarray) -> np.ndarray:
        """Warm start: last round's normalised weights where known, else the sample fraction; sums to 1."""
        if not self.gne.gne_warm_start or not self.warm:
            return fractions.copy()
        start = np.array([self.warm.get(c, float(f)) for c, f in zip(cids, fractions)], dtype=np.float64)
        start = np.where(start > 0, start, fractions)
        return start / start.sum()

    def solve(self, gram: np.ndarray, start: np.ndarray) -> NashSolution:
        g = self.gne
        if g.gne_solver == "newton":
            return solve_nash_newton(gram, start)
        return solve_nash_cvxpy(gram, start, max_iter=g.gne_max_iter, tol=g.gne_tol, step_tol=g.gne_step_tol)

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        if self.gne.gne_drop_idle:
            updates = active_updates(params, updates)
            if not updates:   # no client moved: every combination of the deltas is the global model
                self._metrics = {"gne-status": "no-update", "gne-idle-clients": "all"}
                return params
        t0 = time.perf_counter()
        cids = [u.cid for u in updates]
        n = np.array([u.num_examples for u in updates], dtype=np.float64)
        fractions = n / n.sum()
        client_params = [u.params for u in updates]
        gram = delta_gram(params, client_params, floating_keys(params))
        t_gram = time.perf_counter() - t0
        name = self.gne.NAME   # fedrane, or fedrane-code: the section these keys were read from
        metrics: dict[str, Any] = {"gne-cids": cids, "gne-gram-seconds": t_gram, f"{name}.gne-solver": self.gne.gne_solver,
                                   f"{name}.gne-scale": self.gne.gne_scale, **lra_summary(updates)}
        problem = nash_degenerate(gram, self.gne.gne_degenerate_tol)
        if problem is not None:
            log.warning("round %s: GNE has no Nash-bargaining solution (%s); falling back to sample-weighted "
                        "averaging for this round", server_round, problem)
            norm_avg = math.sqrt(max(float(fractions @ gram @ fractions), 0.0))
            metrics.update({"gne-status": "degenerate", "gne-fallback": problem, "gne-iterations": 0,
                            "gne-residual": None, "gne-p": None, "gne-weights": fractions.tolist(),
                            **weight_spread(fractions, fractions), "gne-update-norm": norm_avg,
                            "gne-fedavg-update-norm": norm_avg, "gne-step-norm-ratio": 1.0,
                            "gne-seconds": time.perf_counter() - t0})
            self._metrics = metrics
            return weighted_average(client_params, n.tolist())
        start = self.start_point(cids, fractions)
        t1 = time.perf_counter()
        sol = self.solve(gram, start)
        t_solve = time.perf_counter() - t1
        if sol.status != STATUS_CONVERGED:
            log.warning("round %s: GNE solver %s stopped with status %s after %s iteration(s), residual %.3g %s",
                        server_round, self.gne.gne_solver, sol.status, sol.iterations, sol.residual, sol.message)
        coef = step_coefficients(gram, sol.p, fractions, self.gne.gne_scale, self.gne.gne_server_lr,
                                 self.gne.gne_radius)
        new_params = combine_deltas(params, client_params, coef)
        w = sol.p / sol.p.sum()
        self.warm = {c: float(wk) for c, wk in zip(cids, w)}
        metrics.update(self._diagnostics(gram, sol, coef, fractions))
        metrics.update({"gne-status": sol.status, "gne-message": sol.message, "gne-iterations": sol.iterations,
                        "gne-residual": sol.residual, "gne-solve-seconds": t_solve,
                        "gne-seconds": time.perf_counter() - t0})
        self._metrics = metrics
        return new_params

    @staticmethod
    def _diagnostics(gram: np.ndarray, sol: NashSolution, coef: np.ndarray, fractions: np.ndarray) -> dict[str, Any]:
        """Weights, step norms and the cosines the paper plots (Fig. 3), all from the Gram matrix."""
        p = sol.p
        mp = gram @ p
        norm_dir = math.sqrt(max(float(p @ mp), 0.0))
        norm_avg = math.sqrt(max(float(fractions @ gram @ fractions), 0.0))
        norm_step = math.sqrt(max(float(coef @ gram @ coef), 0.0))
        delta_norms = np.sqrt(np.clip(np.diag(gram), 0.0, None))
        cos_clients = mp / np.maximum(delta_norms * norm_dir, 1e-300)
        return {
            "gne-p": p.tolist(),
            "gne-weights": (p / p.sum()).tolist(),
            **weight_spread(p / p.sum(), fractions),
            "gne-coefficients": coef.tolist(),
            "gne-update-norm": norm_step,
            "gne-fedavg-update-norm": norm_avg,
            "gne-step-norm-ratio": norm_step / norm_avg if norm_avg > 0 else math.inf,
            "gne-cos-fedavg": float(p @ gram @ fractions) / max(norm_dir * norm_avg, 1e-300),
            "gne-cos-clients-min": float(cos_clients.min()),
            "gne-cos-clients-max": float(cos_clients.max()),
        }

    # --------------------------------------------------------------------------- logging, resume
    def round_metrics(self) -> dict[str, Any]:
        return dict(self._metrics)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["gne_warm"] = {int(c): float(w) for c, w in self.warm.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.warm = {int(c): float(w) for c, w in state.get("gne_warm", {}).items()}

