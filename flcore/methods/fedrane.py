"""FedRANE (seed 000): local relational augmentation (LRA, client) + global Nash-equilibrium aggregation
(GNE, server). Keys ``fedrane.lra-*`` configure the client's LRA neck (paper Eqs. 2-9), ``fedrane.gne-*`` the
server's Nash bargaining over the clients' deltas (G^T G p = 1/p, solved as in Nash-MTL)."""

import dataclasses
from dataclasses import dataclass

from flcore.declaration import BASE_TRAINER, FEDAVG_STRATEGY, MethodDecl, Payload
from flcore.schema import ConfigError, KeySpec, Section, Sectioned, param

GRAPHS = ("alternating", "closed-form")
CUTS = ("row-mean", "none")
EVAL_MODES = ("inductive", "transductive", "identity")
SOLVERS = ("cvxpy", "newton")
SCALES = ("normalized", "fedavg-norm", "server-lr", "radius")
GNNS = ("dot", "gat")
SIMILARITIES = ("pearson", "cosine")
MIXUP_LOGITS = ("features", "classifier")
CD_LOSS = "lra-cd-loss"   # reply metric: the mean contrastive-discrimination loss L_CD of the round
TRAIN_DENSITY = "lra-graph-density"          # reply metric: mean share of kept relations per node, training graphs
EVAL_DENSITY = "lra-eval-graph-density"      # reply metric: the same for the P-FL evaluation (if a local test split)
MIXUP_LOSS = "lra-mixup-loss"   # reply metric: mean mixup cross-entropy of the round (mixup-weight > 0)


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
    lra_residual: bool = param(True, "h^{l+1} = h^l + messages (ours: the literal Eq. 5 did not train on digits, "
                                     "docs/FEDRANE.md); false: the literal Eq. 5, as the authors' GAT",
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
                                         "p / sum p), fedavg-norm, server-lr, radius (the paper's text: the step on "
                                         "the ball of radius r = gne-radius, Sec. 3.4 / 'Implementation Details')",
                           choices=SCALES, old="gne-scale")
    gne_radius: float = param(0.0, "r for gne-scale = radius: ||theta_{t+1} - theta_t|| = r (0: r = K, the number of "
                                   "clients aggregated that round, the paper's 'radius r = K')", ge=0)
    gne_server_lr: float = param(1.0, "s for gne-scale = server-lr (1.0: the paper's literal theta + G p)", gt=0,
                                 old="gne-server-lr")
    gne_max_iter: int = param(20, "convex programmes per round (Nash-MTL: 20)", ge=1, old="gne-max-iter")
    gne_tol: float = param(1e-3, "stop when ||M_hat p - 1/p|| < tol (cvxpy)", gt=0, old="gne-tol")
    gne_step_tol: float = param(1e-6, "... or ||p - p_prev|| < step-tol (cvxpy)", gt=0, old="gne-step-tol")
    gne_warm_start: bool = param(True, "start from last round's weights (else the sample fractions)",
                                 old="gne-warm-start")
    hypersphere: bool = param(False, "unit-norm features and a fixed seeded orthogonal classifier without bias "
                                     "(SphereFed's base; authors' code: clientFedRANE.py feature_extract, "
                                     "serverFedRANE.py FedRANE.__init__); false: the paper's trainable predictor")
    hypersphere_scale: float = param(1.0, "with hypersphere: logits = s W^T h (1: the authors' code, whose "
                                          "cross-entropy then sees logits in [-1, 1]; docs/FEDRANE.md section 5)",
                                     gt=0)
    lra_gnn: str = param("dot", "message passing: dot (Eq. 5-6: dot-product attention, W, W_r, W_s) or gat (authors' "
                                "code: graph_models.py GAT with GraphAttentionLayer, 2 additive-attention heads "
                                "averaged, LeakyReLU 0.1, ELU output)", choices=GNNS)
    lra_dropout: float = param(0.0, "dropout on each message-passing step's output in training (authors' code: "
                                    "graph_models.py GAT.forward, 0.2 set in main.py)", ge=0, lt=1)
    lra_out_norm: bool = param(False, "L2-normalise Z_hat (authors' code: clientFedRANE.py train_raw, "
                                      "F.normalize(Z1_aug))")
    lra_cd_similarity: str = param("pearson", "similarity in L_CD: pearson (Eq. 7) or cosine (authors' code: "
                                              "clientFedRANE.py info_nce_loss)", choices=SIMILARITIES)
    mixup_weight: float = param(0.0, "weight of a mixup cross-entropy term (0: none, the paper; authors' code: 10, "
                                     "clientFedRANE.py train_raw). The mixed batch lam x + (1 - lam) x[perm] goes "
                                     "through F and, as in train_raw, through G with its own L_CD term", ge=0)
    mixup_alpha: float = param(0.5, "lam ~ Beta(alpha, alpha) per batch (authors' code: clientFedRANE.py __init__, "
                                    "MixupLoss(alpha=0.5); btLoss.py mixup_data)", gt=0)
    mixup_logits: str = param("features", "logits of the mixup term: features (the mixed batch's d-dim Z_hat used "
                                          "as logits directly, as train_raw does) or classifier (through the "
                                          "classifier, as train_graph / train_mixup do)", choices=MIXUP_LOGITS)
    gne_degenerate_tol: float = param(1e-10, "min over the simplex of v^T M v / max ||Delta_k||^2 below this: "
                                             "no Nash solution, weighted averaging that round", gt=0,
                                      old="gne-degenerate-tol")



CODE = "authors' code, XeniaLLL/HyperFed_and_FedRANE-master, system/flcore/"


@dataclass(frozen=True)
class FedRANECodeConfig(FedRANEConfig):
    """FedRANE as the first author's public code runs it: every key of ``fedrane.*`` under ``fedrane-code.*``,
    the defaults that differ set to the code's values (each doc names the file and function). Read there:
    clients/clientFedRANE.py (train_raw, which ``train`` calls; info_nce_loss; feature_extract),
    servers/serverFedRANE.py (__init__, nash, update_global), trainmodel/graph_generator.py (get_graph),
    trainmodel/graph_models.py (GAT), main.py (the FedRANE branch and argument defaults). serverFedRANE.py
    builds its clients from clientSphereG.py, which the repository does not contain; we take clientFedRANE.py."""

    NAME = "fedrane-code"

    @classmethod
    def specs(cls) -> list[KeySpec]:
        """The keys as declared, without the flat names of before sectioning: those became fedrane.* keys
        (an old ``lra-topk`` names ``fedrane.lra-topk``, not this variant's key)."""
        return [dataclasses.replace(s, old=None) for s in super().specs()]
    lra_graph: str = param("closed-form", "one-shot EASE solve (H = (P + lambda I)^-1, B = -H / diag(H)): "
                           + CODE + "trainmodel/graph_generator.py GraphGenerator._get_W", choices=GRAPHS)
    lra_cut: str = param("none", "every A_ij > 0 is an edge (GraphGenerator(thresh='no'), get_graph; the GAT "
                         "masks attention by adj > 0): " + CODE + "main.py, trainmodel/graph_models.py Attention",
                         choices=CUTS)
    lra_residual: bool = param(False, "no residual: GAT.forward returns the attention layers' output: "
                               + CODE + "trainmodel/graph_models.py GAT.forward")
    lra_lambda_cd: float = param(0.1, "nce_reg = 0.1: " + CODE + "main.py argument --nce_reg", ge=0)
    lra_cd_symmetric: bool = param(True, "both views as anchors: " + CODE + "clients/clientFedRANE.py info_nce_loss")
    lra_eval: str = param("identity", "no graph at evaluation (predictor on normalised F(x)): "
                          + CODE + "clients/clientFedRANE.py test_metrics, servers/serverFedRANE.py evaluate",
                          choices=EVAL_MODES)
    gne_warm_start: bool = param(False, "every round starts from the sample fractions: "
                                 + CODE + "servers/serverFedRANE.py nash.solve_optimization")
    hypersphere: bool = param(True, "F.normalize'd features, frozen orthogonal predictor without bias: "
                              + CODE + "clients/clientFedRANE.py feature_extract, servers/serverFedRANE.py __init__")
    lra_gnn: str = param("gat", "gnn_type 'gat': " + CODE + "main.py, trainmodel/graph_models.py GAT", choices=GNNS)
    lra_dropout: float = param(0.2, "GAT(dropout=0.2): " + CODE + "main.py, trainmodel/graph_models.py GAT.forward",
                               ge=0, lt=1)
    lra_out_norm: bool = param(True, "Z1_aug = F.normalize(Z1_aug): " + CODE + "clients/clientFedRANE.py train_raw")
    lra_cd_similarity: str = param("cosine", "cosine similarity: " + CODE + "clients/clientFedRANE.py info_nce_loss",
                                   choices=SIMILARITIES)
    mixup_weight: float = param(10.0, "10 * (lam CE(z_mix, y_a) + (1 - lam) CE(z_mix, y_b)): "
                                + CODE + "clients/clientFedRANE.py train_raw", ge=0)


def rane_config(cfg: Sectioned) -> FedRANEConfig:
    """The FedRANE section a run reads: its method's (``fedrane-code.*`` for fedrane-code), else ``fedrane.*``."""
    own = cfg.method_section
    return own if isinstance(own, FedRANEConfig) else cfg.section(FedRANEConfig)


PAPER = "Liao et al. 2023, arXiv 2308.11646 (FedRANE: local relational augmentation + global Nash equilibrium)"
GNE = "strategies.methods.fedrane.strategy:GNEStrategy"
LRA = "client_app.trainers.fedrane:LRATrainer"
NECK = "models.fedrane.neck:add_lra_neck"
LRA_METRICS = (CD_LOSS, TRAIN_DENSITY, EVAL_DENSITY)
METHODS = [
    MethodDecl("fedrane", PAPER, GNE, LRA, config=FedRANEConfig, model_hook=NECK,
               payload=Payload(metrics=LRA_METRICS)),
    MethodDecl("fedrane-no-lra", PAPER, GNE, BASE_TRAINER, config=FedRANEConfig,
               description="ablation FedRANE-w/o-LRA: GNE aggregation, plain clients"),
    MethodDecl("fedrane-no-gne", PAPER, FEDAVG_STRATEGY, LRA, config=FedRANEConfig, model_hook=NECK,
               payload=Payload(metrics=LRA_METRICS),
               description="ablation FedRANE-w/o-GNE: LRA clients, weighted averaging"),
    MethodDecl("fedrane-code", PAPER, GNE, LRA, config=FedRANECodeConfig, model_hook=NECK,
               payload=Payload(metrics=LRA_METRICS + (MIXUP_LOSS,)),
               description="FedRANE as the authors' public code runs it (keys fedrane-code.*, docs/FEDRANE.md)"),
]
__all__ = ["ConfigError", "FedRANEConfig", "FedRANECodeConfig", "METHODS", "rane_config"]
