"""FedRANE (seed 000): local relational augmentation (LRA, client) + global Nash-equilibrium aggregation
(GNE, server). Keys ``fedrane.lra-*`` configure the client's LRA neck (paper Eqs. 2-9), ``fedrane.gne-*`` the
server's Nash bargaining over the clients' deltas (G^T G p = 1/p, solved as in Nash-MTL)."""

from dataclasses import dataclass

from flcore.registry import BASE_TRAINER, FEDAVG_STRATEGY, MethodDecl, Payload
from flcore.schema import ConfigError, Section, param

GRAPHS = ("alternating", "closed-form")
CUTS = ("row-mean", "none")
EVAL_MODES = ("inductive", "transductive", "identity")
SOLVERS = ("cvxpy", "newton")
SCALES = ("normalized", "fedavg-norm", "server-lr")
CD_LOSS = "lra-cd-loss"   # reply metric: the mean contrastive-discrimination loss L_CD of the round
TRAIN_DENSITY = "lra-graph-density"          # reply metric: mean share of kept relations per node, training graphs
EVAL_DENSITY = "lra-eval-graph-density"      # reply metric: the same for the P-FL evaluation (if a local test split)


@dataclass(frozen=True)
class FedRANEConfig(Section):
    NAME = "fedrane"
    lra_lambda_g: float = param(0.1, "lambda_G, weight of the nuclear norm of the SLIM weights (Eq. 2)", gt=0,
                                old="lra-lambda-g")
    lra_graph: str = param("alternating", "SLIM solve: alternating closed forms (Eqs. 3-4) or the authors' "
                                          "one-shot closed form", choices=GRAPHS, old="lra-graph")
    lra_slim_iters: int = param(5, "max alternations of the B and Phi updates (Eqs. 3-4)", ge=1,
                                old="lra-slim-iters")
    lra_slim_eps: float = param(1e-6, "eigenvalue clamp of B B^T relative to its largest (keeps Phi finite)",
                                gt=0, old="lra-slim-eps")
    lra_steps: int = param(1, "L, message-passing steps (Eq. 5)", ge=1, old="lra-steps")
    lra_residual: bool = param(True, "h^{l+1} = h^l + messages (authors' code); false: the literal Eq. 5",
                               old="lra-residual")
    lra_cut: str = param("row-mean", "edges among the SLIM relations A_ij: row-mean (A_ij above node i's mean "
                                     "relation; our choice, docs/FEDRANE.md) or none (every A_ij > 0, the paper's "
                                     "literal N_i: the complete graph)", choices=CUTS)
    lra_topk: int = param(0, "keep at most the k strongest of those edges per node (0: no cap)", ge=0,
                          old="lra-topk")
    lra_tau: float = param(0.8, "tau_1, temperature of the contrastive loss L_CD (Eq. 7)", gt=0, old="lra-tau")
    lra_lambda_cd: float = param(0.2, "lambda_CD, weight of L_CD (Eq. 9)", ge=0, old="lra-lambda-cd")
    lra_cd_symmetric: bool = param(False, "anchors from both halves of [Z; Z_hat] (SimCLR / authors' code)",
                                   old="lra-cd-symmetric")
    lra_alpha: float = param(0.0, "predictor input alpha Z + (1 - alpha) Z_hat (0: the paper)", ge=0, le=1,
                             old="lra-alpha")
    lra_eval: str = param("inductive", "neck at evaluation: inductive (graph of each test sample with a fixed "
                                       "support set of training data), transductive (graph over the test batch) "
                                       "or identity (no neck: the authors' code)", choices=EVAL_MODES, old="lra-eval")
    lra_support_size: int = param(0, "inductive evaluation: |S|, rows of training data each test sample's graph "
                                     "spans (0: batch-size - 1, so test graphs have the training graphs' size)", ge=0)
    lra_eval_batch: int = param(512, "transductive evaluation: test samples per graph (the evaluation loop passes "
                                     "512 rows at a time)", ge=2, le=512)
    gne_solver: str = param("cvxpy", "Nash solve: the paper's sequential convex programme (cvxpy) or exact "
                                     "damped Newton on 1/2 p^T M p - sum log p", choices=SOLVERS, old="gne-solver")
    gne_scale: str = param("normalized", "step length of the Nash direction G p: normalized (authors' code, "
                                         "p / sum p), fedavg-norm, server-lr", choices=SCALES, old="gne-scale")
    gne_server_lr: float = param(1.0, "s for gne-scale = server-lr (1.0: the paper's literal theta + G p)", gt=0,
                                 old="gne-server-lr")
    gne_max_iter: int = param(20, "convex programmes per round (Nash-MTL: 20)", ge=1, old="gne-max-iter")
    gne_tol: float = param(1e-3, "stop when ||M_hat p - 1/p|| < tol (cvxpy)", gt=0, old="gne-tol")
    gne_step_tol: float = param(1e-6, "... or ||p - p_prev|| < step-tol (cvxpy)", gt=0, old="gne-step-tol")
    gne_warm_start: bool = param(True, "start from last round's weights (else the sample fractions)",
                                 old="gne-warm-start")
    gne_degenerate_tol: float = param(1e-10, "min over the simplex of v^T M v / max ||Delta_k||^2 below this: "
                                             "no Nash solution, weighted averaging that round", gt=0,
                                      old="gne-degenerate-tol")


PAPER = "Liao et al. 2023, arXiv 2308.11646 (FedRANE: local relational augmentation + global Nash equilibrium)"
GNE = "strategies.fedrane:GNEStrategy"
LRA = "client_app.trainers.fedrane:LRATrainer"
NECK = "models.lra:add_lra_neck"
LRA_METRICS = (CD_LOSS, TRAIN_DENSITY, EVAL_DENSITY)
METHODS = [
    MethodDecl("fedrane", PAPER, GNE, LRA, config=FedRANEConfig, model_hook=NECK,
               payload=Payload(metrics=LRA_METRICS)),
    MethodDecl("fedrane-no-lra", PAPER, GNE, BASE_TRAINER, config=FedRANEConfig,
               description="ablation FedRANE-w/o-LRA: GNE aggregation, plain clients"),
    MethodDecl("fedrane-no-gne", PAPER, FEDAVG_STRATEGY, LRA, config=FedRANEConfig, model_hook=NECK,
               payload=Payload(metrics=LRA_METRICS),
               description="ablation FedRANE-w/o-GNE: LRA clients, weighted averaging"),
]
__all__ = ["ConfigError", "FedRANEConfig", "METHODS"]
