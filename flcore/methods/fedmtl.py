"""FedMTL: MOCHA's federated multi-task objective (Smith, Chiang, Sanjabi and Talwalkar, "Federated Multi-Task
Learning", NeurIPS 2017; authors' code gingsmith/fmtl, MATLAB) as the P-FL baseline of FedRANE's Table 2 (seed 000,
Sec. 4.1: "FedMTL [46] ... takes personalized learning as a multi-task learning objective").

Every client t has its own model w_t (the columns of W = [w_1 .. w_K]); the tasks are coupled by the task-
relationship regulariser of MOCHA's primal objective (authors' util/compute_primal.m):

    min_W  sum_t L_t(w_t) + lambda/2 tr(W Omega W^T)

and the server maintains Omega from the clients' models after each round (authors' opt/run_mocha.m, the update
after the inner iterations; the paper's Sec. 3, the Omega step of the alternating minimisation):

    A = W^T W (eigenvalues floored at 1e-7),  Sigma = A^{1/2} / tr(A^{1/2}),  Omega = Sigma^{-1}

starting from Sigma = I / K (run_mocha.m). The variant: MOCHA solves the W step by SDCA on the dual of a convex
loss (hinge, run_mocha.m's local loop), which has no counterpart for a neural network; here, as in the P-FL
baselines that compare with it, the W step is the primal one: client t takes its local SGD steps on
CE(w_t) + lambda/2 tr(W Omega W^T) in w_t with the other columns fixed, whose gradient is
lambda (W Omega)_t = lambda (Omega_tt w_t + sum_{j != t} Omega_tj w_j). The server sends client t its own w_t
as the model, the coupling u_t = sum_{j != t} Omega_tj w_j (record ``fedmtl-coupling``) and Omega_tt
(config ``fedmtl-omega-tt``): 2 models per client per round. W and Omega are the server's (checkpointed); a
client that has not trained yet is the initial model. lambda = 0: every client trains alone (``local``).
P-FL evaluates w_t. The server's model (G-FL) is the sample-weighted mean of the round's w_t (MOCHA has none).
W's rows are every floating entry of the model (buffers included, none in the MLP/ConvNet); the eigenvalue floor
is applied always (run_mocha.m applies it when an eigenvalue is negative: the floor also keeps Sigma
invertible when two clients' models coincide, e.g. before they train).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flcore.declaration import MethodDecl, Payload
from flcore.schema import Section, param

COUPLING = "fedmtl-coupling"     # server -> client record: u_t = sum_{j != t} Omega_tj w_j (the model's entries)
OMEGA_TT = "fedmtl-omega-tt"     # config key: Omega_tt, this client's diagonal entry of Omega
EIG_FLOOR = 1e-7                 # run_mocha.m: dm(dm <= 1e-7) = 1e-7


def omega_from_gram(a: np.ndarray) -> np.ndarray:
    """Omega = (A^{1/2} / tr A^{1/2})^{-1} from the Gram matrix A = W^T W, eigenvalues floored at 1e-7 (run_mocha.m)."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise ValueError(f"FedMTL: W^T W must be a non-empty square matrix, got {a.shape}")
    vals, vecs = np.linalg.eigh((a + a.T) / 2)
    roots = np.sqrt(np.maximum(vals, EIG_FLOOR))
    return (vecs * (roots.sum() / roots)) @ vecs.T


def omega_from_models(w: np.ndarray) -> np.ndarray:
    """Omega from W = (d, K) itself (omega_from_gram of W^T W)."""
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] == 0:
        raise ValueError(f"FedMTL: W must be (entries, clients), got {w.shape}")
    return omega_from_gram(w.T @ w)


@dataclass(frozen=True)
class FedMTLConfig(Section):
    NAME = "fedmtl"
    lam: float = param(1e-2, "lambda of the regulariser lambda/2 tr(W Omega W^T) (MOCHA's primal, authors' "
                             "util/compute_primal.m; they cross-validate it, util/cross_val_1.m, and FedRANE states "
                             "none: 1e-2 is our choice, the largest of 1e-5..1e-1 on tests/test_fedmtl_learning.py's "
                             "digits job whose P-FL did not fall below local training's, 3e-2 did); 0: local training", ge=0)


METHODS = [MethodDecl("fedmtl", "Smith et al., NeurIPS 2017 (MOCHA, federated multi-task learning)",
                      "strategies.methods.fedmtl:FedMTLStrategy", "client_app.trainers.fedmtl:FedMTLTrainer",
                      config=FedMTLConfig, payload=Payload(config=(OMEGA_TT,), records=(COUPLING,)),
                      description="FedMTL (Smith et al., NeurIPS 2017, MOCHA's primal): per-client models coupled "
                                  "by lambda/2 tr(W Omega W^T), Omega updated by the server from W")]
