"""SphereFed's server (flcore/methods/spherefed.py): FedAvg's rounds; after the last one, the closed-form
calibration of the fixed classifier.

The calibration is one more exchange (message type ``train.calibrate``) with every registered client: each
returns V_k = sum_i h_i h_i^T and U_k = sum_i h_i y_i^T of its training data under the final global model, and
the server sets the head to W* = (sum_k V_k + rho I)^+ (sum_k U_k) / s (:func:`calibrated_classifier`), the
minimiser of sum_i ||s W^T h_i - y_i||^2 + rho s^2 ||W||^2 over all clients' data without seeing any of it.
The round's record says how many clients took part, V's rank and how far W* moved from the fixed W.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np
from flwr.serverapp import Grid

from flcore.config import RunConfig
from flcore.methods.spherefed import CALIBRATE_ACTION, CALIBRATION_RECORD, SphereFedConfig
from flcore.records import record_to_params
from strategies.base import FLStrategy, Params, RoundOutcome

log = logging.getLogger("noniid_fl")
HEAD_KEY = "head.weight"


def calibrated_classifier(v: np.ndarray, u: np.ndarray, ridge: float = 0.0) -> tuple[np.ndarray, int]:
    """(W, rank of V + rho I): W = (V + rho I)^+ U, V symmetric PSD (d x d), U (d x C), in float64.

    With rho > 0 the plain inverse; with rho = 0 the pseudo-inverse over the eigenvalues above
    d * eps * (largest), i.e. the minimum-norm least-squares solution pinv(H) Y when V = H^T H, U = H^T Y.
    """
    v = np.asarray(v, dtype=np.float64)
    u = np.asarray(u, dtype=np.float64)
    if v.ndim != 2 or v.shape[0] != v.shape[1] or u.shape[0] != v.shape[0]:
        raise ValueError(f"calibration needs V (d, d) and U (d, C), got {v.shape} and {u.shape}")
    evals, evecs = np.linalg.eigh(0.5 * (v + v.T) + ridge * np.eye(v.shape[0]))
    top = float(evals.max()) if evals.size else 0.0
    keep = evals > max(top, 0.0) * v.shape[0] * np.finfo(np.float64).eps
    inv = np.where(keep, 1.0 / np.where(keep, evals, 1.0), 0.0)
    return (evecs * inv) @ (evecs.T @ u), int(keep.sum())


def sum_reports(records: Sequence[Any], shape_v: tuple[int, int], shape_u: tuple[int, int]
                ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Sum of the valid (V, U) reports and the problems of the invalid ones (named, never summed)."""
    v, u, problems = np.zeros(shape_v), np.zeros(shape_u), []
    for i, rec in enumerate(records):
        arrays = record_to_params(rec) if rec is not None else {}
        vk, uk = arrays.get("v"), arrays.get("u")
        if vk is None or uk is None or vk.shape != shape_v or uk.shape != shape_u:
            problems.append(f"report {i}: needs 'v' {shape_v} and 'u' {shape_u}, got "
                            f"{ {k: a.shape for k, a in arrays.items()} }")
        elif not (np.all(np.isfinite(vk)) and np.all(np.isfinite(uk))):
            problems.append(f"report {i}: NaN or Inf")
        else:
            v += vk
            u += uk
    return v, u, problems


class SphereFedStrategy(FLStrategy):
    """FedAvg + SphereFed's calibration after the last round."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.sphere = cfg.section(SphereFedConfig)
        self._metrics: dict[str, Any] = {}

    def train_round(self, grid: Grid, server_round: int, params: Params) -> RoundOutcome:
        outcome = super().train_round(grid, server_round, params)
        self._metrics = {"spherefed-calibrated": 0}
        if self.sphere.calibrate and server_round == self.cfg.num_server_rounds:
            outcome = self.calibrate(grid, server_round, outcome)
        return outcome

    def calibrate(self, grid: Grid, server_round: int, outcome: RoundOutcome) -> RoundOutcome:
        """The calibration exchange with every registered client and the new head in ``outcome.params``."""
        params = outcome.params
        if HEAD_KEY not in params:
            raise ValueError(f"SphereFed calibration: the global model has no '{HEAD_KEY}' (the spherefed model "
                             "hook builds it)")
        w = np.asarray(params[HEAD_KEY], dtype=np.float64)
        res = self.driver.phase(grid, server_round, CALIBRATE_ACTION,
                                {cid: self.train_content(server_round, cid, params) for cid in sorted(self.clients)},
                                collect=False)  # replies are calibration statistics, not models
        cids = sorted(res.replies)
        v, u, problems = sum_reports([res.replies[c].content.get(CALIBRATION_RECORD) for c in cids],
                                     (w.shape[0], w.shape[0]), w.shape)
        for p in problems:
            log.warning("round %s: SphereFed calibration report left out: %s", server_round, p)
        outcome.failures += res.failures
        outcome.bytes_sent += res.bytes_sent
        outcome.bytes_received += res.bytes_received
        used = len(cids) - len(problems)
        if used == 0:
            log.warning("round %s: no usable SphereFed calibration report; the fixed classifier stays", server_round)
            self._metrics.update({"spherefed-calibration-clients": 0})
            return outcome
        w_new, rank = calibrated_classifier(v, u, self.sphere.calibration_ridge)
        w_new /= self.sphere.scale
        new_params = type(params)(params)
        new_params[HEAD_KEY] = w_new.astype(np.asarray(params[HEAD_KEY]).dtype)
        self._metrics.update({"spherefed-calibrated": 1, "spherefed-calibration-clients": used,
                              "spherefed-v-trace": float(np.trace(v)),  # ||h|| = 1: the samples with h != 0
                              "spherefed-v-rank": rank,
                              "spherefed-head-change": float(np.linalg.norm(w_new - w) / np.linalg.norm(w))})
        outcome.params = new_params
        return outcome

    def round_metrics(self) -> dict[str, Any]:
        return dict(self._metrics)
