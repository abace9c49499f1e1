"""Synthetic(alpha, beta) of the FedProx paper (Li et al. 2020, Sec. 5.1), generated per client.

For client k: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k (10 x 60), b_k ~ N(u_k, 1); v_k (60) ~ N(B_k, 1);
x ~ N(v_k, Sigma) with Sigma = diag(j^-1.2); y = argmax softmax(W_k x + b_k).
Alpha controls how much the local *models* differ, beta how much the local *inputs* differ.
Sample counts follow FedProx's power law: floor(lognormal(4, 2)) + 50 (capped at ``max_samples``; 0: no cap).

Two readings of N(0, alpha) (run-config key ``synthetic-prior-scale``):
- ``"std"``: alpha and beta are the standard deviations of u_k and B_k. This is how the FedBC authors' generator
  draws them (chenfan95/FedBC, utils/synthetic.py:generate_synthetic, ``np.random.normal(0, alpha, NUM_USER)``,
  copied from FedProx's published generator), and what their Table 1 runs with alpha = beta = 0.5
  (synthetic_jobs.sh, every line).
- ``"variance"``: alpha and beta are the variances (u_k ~ N(0, alpha) read as in the FedProx paper's notation);
  this library's generator before issue 40. With alpha = beta = 1 (Synthetic(1, 1)) both readings draw the same
  data, so every result recorded before the option existed (all at Synthetic(1, 1)) is the same under either.
The authors' code has no size cap (utils/synthetic.py:generate_synthetic: ``lognormal(4, 2).astype(int) + 50``);
ours caps at ``synthetic-max-samples`` (2000, the library's default before issue 40; 0 = no cap, the authors').
Their 80/20 train/test split (utils/synthetic.py:generate_synthetic_datasets, ``train_test_split = 0.8``) is
``local-test-fraction = 0.2`` here (data_partitioning/federated.py client_indices; the authors keep
int(0.8 n) for training, we hold out round(0.2 n): the two differ by at most one sample per client).

Each client draws from its own generator seeded by (seed, k), so client k's data does not depend on how
many clients the federation has: the server can rebuild any client's test split from (seed, k) alone (the
authors draw all clients from one global numpy stream, so their federation changes with the client count).
"""

from __future__ import annotations

import numpy as np

DIM = 60
NUM_CLASSES = 10
PRIOR_SCALES = ("variance", "std")
DEFAULT_MAX_SAMPLES = 2000


def client_size(draw: float, max_samples: int = DEFAULT_MAX_SAMPLES) -> int:
    """A client's sample count from its lognormal(4, 2) draw: floor(draw) + 50, as the authors'
    ``lognormal(...).astype(int) + 50`` (utils/synthetic.py:generate_synthetic), then capped at ``max_samples``
    (0: no cap)."""
    n = int(np.floor(draw)) + 50
    return n if max_samples == 0 else min(n, int(max_samples))


def prior_std(value: float, prior_scale: str) -> float:
    """The standard deviation of u_k (value = alpha) or B_k (value = beta) under ``prior_scale``."""
    if prior_scale == "std":
        return float(value)
    if prior_scale == "variance":
        return float(np.sqrt(value))
    raise ValueError(f"synthetic-prior-scale must be one of {PRIOR_SCALES}, got {prior_scale!r}")


def synthetic_client(alpha: float, beta: float, seed: int, client: int,
                     max_samples: int = DEFAULT_MAX_SAMPLES,
                     prior_scale: str = "std") -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of client ``client``: x float32 (n, 60), y int64 (n,)."""
    if max_samples < 0:
        raise ValueError(f"synthetic-max-samples must be >= 0 (0: no cap), got {max_samples}")
    rng = np.random.default_rng([int(seed), int(client), 0xFED])
    n = client_size(rng.lognormal(4, 2), max_samples)
    u = rng.normal(0, prior_std(alpha, prior_scale))
    b_mean = rng.normal(0, prior_std(beta, prior_scale))
    w = rng.normal(u, 1, size=(NUM_CLASSES, DIM))
    b = rng.normal(u, 1, size=NUM_CLASSES)
    v = rng.normal(b_mean, 1, size=DIM)
    sigma = np.arange(1, DIM + 1, dtype=np.float64) ** -1.2
    x = rng.normal(v, np.sqrt(sigma), size=(n, DIM))
    y = np.argmax(x @ w.T + b, axis=1)
    return x.astype(np.float32), y.astype(np.int64)
