"""Neural-collapse FL, server side: averaging + global memory vectors (GMV). Seed 004, Alg. 1.

The fixed simplex-ETF classifier is the model's head (``models/heads.py``): it travels as a buffer in the
state dict and is identical on every client; this strategy pins it after averaging so it can never drift.
The backbone is averaged uniformly, theta^t = (1/K) sum_{k in S_t} theta_k^t (Alg. 1, last line, K = |S_t|);
``fedetf.aggregation = samples`` weights by n_k instead.
GMV: every sampled client reports its per-class feature means m_kc and counts n_kc (record ``class-means``)
from round R_warm - 1 on; the server computes (Alg. 1, the mu_j^t line)

    mu_c^t = (1/|S_t|) sum_{k in S_t} m_kc,   m_kc = 0 for a client without class c   (``sampled``)

so a class held by few of the round's clients gets a shorter memory vector, and a class none of them holds gets
0 (that is, h = f). Options that keep a memory across rounds: ``clients`` averages over the clients holding c,
mu_c = (1/|S_t^c|) sum_{k in S_t^c} m_kc, ``samples`` weights by n_kc; with both, a class no sampled client
holds keeps its previous vector. From round R_warm on, mu^{t-1} is sent to every sampled client (record
``etf-memory``). Method ``fedetf`` = this strategy + ETF head; ``fedgmv`` = this strategy with the run
config's head (linear: the paper's "+GMV" ablation). "+ETF" alone is ``method = fedavg, head = etf``.
results.json records per round whether GMV is active, the warm-up round, the classes with a memory vector,
the mean norm of those vectors and their cosine with the classifier's class vectors.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord

from flcore.config import RunConfig
from flcore.methods.fedetf import ACTIVE_KEY, MEANS_RECORD, MEMORY_RECORD, REPORT_KEY, FedETFConfig
from flcore.records import params_to_record, record_to_params
from models import head_name
from strategies.aggregation import weighted_average
from strategies.base import ClientUpdate, FLStrategy, Params

log = logging.getLogger("noniid_fl")

HEAD_KEY = "head.weight"


# ------------------------------------------------------------------------------------------ pure math
def warmup_round(fraction: float, num_rounds: int) -> int:
    """R_warm = round(fraction * R), at least 1 (rounds are numbered 1..R; Alg. 1 uses GMV for t >= R_warm)."""
    return max(1, int(round(fraction * num_rounds)))


def average_class_means(means: np.ndarray, counts: np.ndarray,
                        weighting: str = "sampled") -> tuple[np.ndarray, np.ndarray]:
    """Global memory vectors of one round from the K reporting clients' class means (seed 004, Alg. 1).

    means: (K, C, d) client class means m_kc; counts: (K, C) sample counts n_kc.
    ``sampled``: mu_c = (1/K) sum_k m_kc with m_kc = 0 where n_kc = 0 (Alg. 1: the sum over S_t divided by
    |S_t|); ``clients``: mu_c = (1/|S^c|) sum_{k in S^c} m_kc over the clients with n_kc > 0 (absent classes are
    skipped, not averaged in as zeros); ``samples``: mu_c = sum_k n_kc m_kc / sum_k n_kc.
    Returns (mu (C, d) float64, present (C,) bool: some client holds c); rows of classes no client holds are 0.
    """
    means = np.asarray(means, np.float64)
    counts = np.asarray(counts)
    if means.ndim != 3 or counts.shape != means.shape[:2] or means.shape[0] == 0:
        raise ValueError(f"class means must be (K, C, d) with counts (K, C), K >= 1, got {means.shape} and "
                         f"{counts.shape}")
    held = (counts > 0).astype(np.float64)
    if weighting == "sampled":
        w, total = held, np.full(means.shape[1], float(means.shape[0]))
    elif weighting == "clients":
        w = held
        total = w.sum(axis=0)
    elif weighting == "samples":
        w = counts.astype(np.float64)
        total = w.sum(axis=0)
    else:
        raise ValueError(f"unknown GMV weighting '{weighting}'")
    present = held.sum(axis=0) > 0                          # (C,)
    mu = np.einsum("kc,kcd->cd", w, means) / np.where(total > 0, total, 1.0)[:, None]
    return mu, present


def update_memory(memory: np.ndarray | None, valid: np.ndarray | None, mu: np.ndarray,
                  present: np.ndarray, keep_unseen: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """mu_c^t for the classes seen this round; for the others mu_c^{t-1} (``keep_unseen``) or nothing (the
    ``sampled`` weighting of Alg. 1 replaces the whole memory every round)."""
    if memory is None or valid is None or not keep_unseen:
        memory, valid = np.zeros_like(mu), np.zeros(mu.shape[0], dtype=bool)
    if memory.shape != mu.shape:
        raise ValueError(f"memory vectors changed shape: {memory.shape} -> {mu.shape}")
    new = memory.copy()
    new[present] = mu[present]
    return new, valid | present


def classifier_cosines(memory: np.ndarray, valid: np.ndarray, classifier: np.ndarray) -> np.ndarray:
    """cos(mu_c, w_c) for the valid classes (neural collapse NC3: class means align with the classifier).

    classifier: (C, d) rows w_c. Zero vectors give cosine 0.
    """
    m, w = memory[valid], np.asarray(classifier, np.float64)[valid]
    den = np.linalg.norm(m, axis=1) * np.linalg.norm(w, axis=1)
    return np.where(den > 0, np.sum(m * w, axis=1) / np.where(den > 0, den, 1.0), 0.0)


# ------------------------------------------------------------------------------------------ strategy
class FedETFStrategy(FLStrategy):
    """Uniform (or n_k-weighted) averaging + the fixed ETF head kept exact + global memory vectors."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.ecfg = cfg.section(FedETFConfig)
        self.warm_round = warmup_round(self.ecfg.warmup_fraction, cfg.num_server_rounds)
        self.etf_head = head_name(cfg) == "etf"
        self.memory: np.ndarray | None = None       # (C, d) float64
        self.memory_valid: np.ndarray | None = None  # (C,) bool
        self.memory_round = 0                        # last round that updated the memory
        self._metrics: dict[str, Any] = {}

    # --- what the clients get ---------------------------------------------------------------------
    def gmv_active(self, server_round: int) -> bool:
        return (server_round >= self.warm_round and self.memory_valid is not None
                and bool(self.memory_valid.any()))

    def client_config(self, server_round: int, cid: int) -> dict[str, Any]:
        return {ACTIVE_KEY: self.gmv_active(server_round), REPORT_KEY: server_round >= self.warm_round - 1}

    def client_records(self, server_round: int, cid: int) -> dict[str, ArrayRecord | ConfigRecord]:
        if not self.gmv_active(server_round):
            return {}
        assert self.memory is not None and self.memory_valid is not None
        return {MEMORY_RECORD: params_to_record({"mu": self.memory.astype(np.float32),
                                                 "valid": self.memory_valid.copy()})}

    # --- aggregation ------------------------------------------------------------------------------
    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        if self.ecfg.aggregation == "uniform":
            new = weighted_average([u.params for u in updates], [1.0] * len(updates))
        else:
            new = super().aggregate(server_round, params, updates)
        if self.etf_head and HEAD_KEY in params:
            new[HEAD_KEY] = params[HEAD_KEY].copy()  # W* is fixed: never let averaging round it
        self._metrics = {"gmv-active": int(self.gmv_active(server_round)), "gmv-warm-round": self.warm_round,
                         "fedetf-aggregation": self.ecfg.aggregation}
        if server_round >= self.warm_round - 1:
            self._update_memory(server_round, updates, new)
        valid = self.memory_valid
        self._metrics["gmv-classes"] = int(valid.sum()) if valid is not None else 0
        self._metrics["gmv-norm"] = (float(np.linalg.norm(self.memory[valid], axis=1).mean())
                                     if valid is not None and self.memory is not None and valid.any() else None)
        return new

    def _update_memory(self, server_round: int, updates: list[ClientUpdate], params: Params) -> None:
        means, counts, bad = self._collect_means(server_round, updates)
        self._metrics["gmv-reports"] = len(means)
        self._metrics["gmv-rejected"] = bad
        if not means:
            return
        weighting = self.ecfg.gmv_weighting
        mu, present = average_class_means(np.stack(means), np.stack(counts), weighting)
        self.memory, self.memory_valid = update_memory(self.memory, self.memory_valid, mu, present,
                                                       keep_unseen=weighting != "sampled")
        self.memory_round = server_round
        weight = params.get(HEAD_KEY)
        if weight is not None:
            rows = weight.T if self.etf_head else weight  # ETF buffer is (d, C); nn.Linear weight is (C, d)
            if rows.shape == self.memory.shape and self.memory_valid.any():
                self._metrics["gmv-classifier-cos"] = float(
                    classifier_cosines(self.memory, self.memory_valid, rows).mean())

    def _collect_means(self, server_round: int, updates: list[ClientUpdate]):
        """Valid (means, counts) reports; a malformed one is logged and left out of the memory."""
        means, counts, bad = [], [], 0
        shape = self.memory.shape if self.memory is not None else None
        for u in updates:
            problem, m, c = _read_report(u.records.get(MEANS_RECORD), shape)
            if problem is None:
                shape = m.shape
                means.append(m)
                counts.append(c)
            else:
                bad += 1
                log.warning("round %s: class means of client %s left out of the memory vectors: %s",
                            server_round, u.cid, problem)
        return means, counts, bad

    # --- bookkeeping ------------------------------------------------------------------------------
    def round_metrics(self) -> dict[str, Any]:
        return dict(self._metrics)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["gmv"] = {
            "memory": None if self.memory is None else self.memory.tolist(),
            "valid": None if self.memory_valid is None else self.memory_valid.tolist(),
            "round": self.memory_round,
        }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        gmv = state["gmv"]
        self.memory = None if gmv["memory"] is None else np.asarray(gmv["memory"], np.float64)
        self.memory_valid = None if gmv["valid"] is None else np.asarray(gmv["valid"], bool)
        self.memory_round = int(gmv["round"])


def _read_report(record: Any, shape: tuple[int, ...] | None):
    """(problem or None, means (C, d), counts (C,)) from a client's ``class-means`` record."""
    if not isinstance(record, ArrayRecord):
        return f"no '{MEANS_RECORD}' array record in the reply", None, None
    arrays = record_to_params(record)
    if "means" not in arrays or "counts" not in arrays:
        return f"record '{MEANS_RECORD}' needs arrays 'means' and 'counts', got {sorted(arrays)}", None, None
    m, c = np.asarray(arrays["means"], np.float64), np.asarray(arrays["counts"])
    if m.ndim != 2 or c.shape != (m.shape[0],):
        return f"means {m.shape} / counts {c.shape} are not (C, d) / (C,)", None, None
    if shape is not None and m.shape != tuple(shape):
        return f"means have shape {m.shape}, expected {tuple(shape)}", None, None
    if not np.all(np.isfinite(m)):
        return "means contain NaN or Inf", None, None
    if not np.issubdtype(c.dtype, np.integer) or np.any(c < 0):
        return f"counts must be non-negative integers, got {c.tolist()}", None, None
    return None, m, c
