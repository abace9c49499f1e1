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
SLIM_UPDATES = ("paper", "majorize")
PREDICTORS = ("mlp", "linear")
STATE_OPTIMIZER = "fedrane-optimizer"       # client state: the momentum buffers of the kept optimizer
STATE_SCHEDULE = "fedrane-lr-schedule"      # client state: the StepLR counter (local trainings so far)
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
    lra_slim_update: str = param("paper", "SLIM's alternating B-step: paper (Eq. 4 as written: H = (P^T P + "
                                          "lambda_G (Phi + Phi^T))^-1, B_ij = -H_ij / H_jj) or majorize (ours before "
                                          "issue 40: the exact minimiser of 1/2 ||P - PB||^2 + lambda_G/2 tr(B^T Phi "
                                          "B) s.t. diag(B) = 0, a majorise-minimise step of Eq. 2)",
                                 choices=SLIM_UPDATES)
    lra_slim_iters: int = param(5, "max alternations of the B and Phi updates (Eqs. 3-4)", ge=1,
                                old="lra-slim-iters")
    lra_slim_eps: float = param(1e-6, "eigenvalue clamp of B B^T relative to its largest (keeps Phi finite)",
                                gt=0, old="lra-slim-eps")
    lra_steps: int = param(1, "L, message-passing steps (Eq. 5)", ge=1, old="lra-steps")
    lra_residual: bool = param(False, "false: Eq. 5 as written (h^{l+1} = messages only, as the authors' GAT); "
                                      "true: h^{l+1} = h^l + messages (our repair, fedrane-repaired: the literal "
                                      "Eq. 5 did not train on digits, docs/METHODS.md)", old="lra-residual")
    lra_cut: str = param("none", "edges among the SLIM relations A_ij: none (every A_ij > 0, the paper's N_i, "
                                 "Sec. 3.3: the complete graph) or row-mean (A_ij above node i's mean relation; our "
                                 "repair, fedrane-repaired, docs/METHODS.md)", choices=CUTS)
    lra_topk: int = param(0, "keep at most the k strongest of those edges per node (0: no cap)", ge=0,
                          old="lra-topk")
    lra_tau: float = param(0.8, "tau_1, temperature of the contrastive loss L_CD (Eq. 7)", gt=0, old="lra-tau")
    lra_lambda_cd: float = param(0.2, "lambda_CD, weight of L_CD (Eq. 9)", ge=0, old="lra-lambda-cd")
    lra_cd_symmetric: bool = param(False, "anchors from both halves of [Z; Z_hat] (SimCLR / authors' code)",
                                   old="lra-cd-symmetric")
    lra_alpha: float = param(0.0, "predictor input alpha Z + (1 - alpha) Z_hat (0: the paper)", ge=0, le=1,
                             old="lra-alpha")
    lra_eval: str = param("identity", "neck at evaluation: identity (no graph, predictor on F(x): the paper states "
                                      "no evaluation graph, the authors' server evaluates without one, "
                                      "serverFedRANE.py FedRANE.evaluate), inductive (graph of each test sample with "
                                      "a fixed support set of training data; our repair, fedrane-repaired) or "
                                      "transductive (graph over the test batch)", choices=EVAL_MODES, old="lra-eval")
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
    lra_predictor: str = param("mlp", "the predictor on Z_hat: mlp (Sec. 3.2 'a multi-perception layer module': "
                                      "Linear(d, h), ReLU, Linear(h, C); depth and width unstated, we take one "
                                      "hidden layer of width h = lra-predictor-hidden) or linear (one Linear(d, C); "
                                      "ours before issue 40)", choices=PREDICTORS)
    lra_predictor_hidden: int = param(0, "h, the mlp predictor's hidden width (0: d, the feature dimension: the "
                                         "paper's 'embedding dimension similar to the output of the "
                                         "representation model', Sec. 4.1)", ge=0)
    drop_last: bool = param(False, "skip each epoch's last, partial minibatch (authors' code: clientbase.py "
                                   "Client.load_train_data, DataLoader(drop_last=True))")
    persistent_optimizer: bool = param(False, "one SGD optimizer per client kept across rounds: its momentum "
                                              "buffers continue from the client's last training (client state "
                                              "'fedrane-optimizer'; authors' code: clientFedRANE.py "
                                              "ClientFedRANE.__init__ builds it once, clientbase.py set_parameters "
                                              "overwrites the parameters' data only); false: a fresh optimizer "
                                              "every round")
    lr_step_epochs: int = param(0, "StepLR: lr x lr-step-gamma every lr-step-epochs x local-epochs local "
                                   "trainings of this client (the counter is client state 'fedrane-lr-schedule'; "
                                   "authors' code: clientFedRANE.py __init__ StepLR(step_size=150 * local_steps), "
                                   "train_raw steps it once per training); 0: constant lr (the paper)", ge=0)
    lr_step_gamma: float = param(0.1, "the StepLR factor (authors' code: clientFedRANE.py __init__, gamma=0.1)",
                                 gt=0, le=1)
    flat_features: bool = param(False, "with model = convnet: the authors' CNNModel instead (conv 16 and 32 "
                                       "channels, 5x5, max-pooling, features the flattened 32 x 7 x 7 = 1568 "
                                       "values on 28x28 input, no embedding layer; trainmodel/models.py CNNModel, "
                                       "main.py run: model.fc = nn.Identity()); false: our ConvNet (64-d "
                                       "embedding, Sec. 4.1)")
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
    gne_drop_idle: bool = param(False, "leave clients whose update is exactly zero (no local step, e.g. fewer "
                                       "training rows than a drop-last batch) out of the Nash solve and the step "
                                       "(authors' code: serverFedRANE.py update_global, no_grad_id_list); false: "
                                       "every update takes part (a zero one makes the round degenerate: weighted "
                                       "averaging)")
    gne_degenerate_tol: float = param(1e-10, "min over the simplex of v^T M v / max ||Delta_k||^2 below this: "
                                             "no Nash solution, weighted averaging that round", gt=0,
                                      old="gne-degenerate-tol")



CODE = "authors' code, XeniaLLL/HyperFed_and_FedRANE-master, system/flcore/"
MAIN = "system/main.py"
REPO = "authors' code, XeniaLLL/HyperFed_and_FedRANE-master, "   # the authors' entry point sits beside flcore/, not in it


@dataclass(frozen=True)
class FedRANECodeConfig(FedRANEConfig):
    """FedRANE as the first author's public code runs it: every key of ``fedrane.*`` under ``fedrane-code.*``,
    the defaults that differ set to the code's values (each doc names the file and function). Read there:
    clients/clientFedRANE.py (train_raw, which ``train`` calls; info_nce_loss; feature_extract),
    servers/serverFedRANE.py (__init__, nash, update_global), trainmodel/graph_generator.py (get_graph),
    trainmodel/graph_models.py (GAT), system/main.py (the FedRANE branch and argument defaults). serverFedRANE.py
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
                         "masks attention by adj > 0): " + CODE + "trainmodel/graph_models.py Attention; " + MAIN,
                         choices=CUTS)
    lra_residual: bool = param(False, "no residual: GAT.forward returns the attention layers' output: "
                               + CODE + "trainmodel/graph_models.py GAT.forward")
    lra_lambda_cd: float = param(0.1, "nce_reg = 0.1: " + CODE.replace("system/flcore/", MAIN) + " argument --nce_reg", ge=0)
    lra_cd_symmetric: bool = param(True, "both views as anchors: " + CODE + "clients/clientFedRANE.py info_nce_loss")
    lra_eval: str = param("identity", "no graph at evaluation (predictor on normalised F(x)): "
                          + CODE + "clients/clientFedRANE.py test_metrics, servers/serverFedRANE.py evaluate",
                          choices=EVAL_MODES)
    gne_warm_start: bool = param(False, "every round starts from the sample fractions: "
                                 + CODE + "servers/serverFedRANE.py nash.solve_optimization")
    hypersphere: bool = param(True, "F.normalize'd features, frozen orthogonal predictor without bias: "
                              + CODE + "clients/clientFedRANE.py feature_extract, servers/serverFedRANE.py __init__")
    lra_gnn: str = param("gat", "gnn_type 'gat': " + CODE + "trainmodel/graph_models.py GAT; " + MAIN, choices=GNNS)
    lra_dropout: float = param(0.2, "GAT(dropout=0.2): " + CODE + "trainmodel/graph_models.py GAT.forward; " + MAIN,
                               ge=0, lt=1)
    lra_out_norm: bool = param(True, "Z1_aug = F.normalize(Z1_aug): " + CODE + "clients/clientFedRANE.py train_raw")
    lra_cd_similarity: str = param("cosine", "cosine similarity: " + CODE + "clients/clientFedRANE.py info_nce_loss",
                                   choices=SIMILARITIES)
    mixup_weight: float = param(10.0, "10 * (lam CE(z_mix, y_a) + (1 - lam) CE(z_mix, y_b)): "
                                + CODE + "clients/clientFedRANE.py train_raw", ge=0)
    lra_predictor: str = param("linear", "the predictor is a copy of the backbone's fc, one Linear (frozen and "
                               "orthogonal with hypersphere): " + CODE + "servers/serverFedRANE.py FedRANE.__init__; " + MAIN
                               + " run (args.predictor = copy.deepcopy(args.model.fc))",
                               choices=PREDICTORS)
    drop_last: bool = param(True, "DataLoader(drop_last=True): " + CODE + "clients/clientbase.py "
                            "Client.load_train_data")
    persistent_optimizer: bool = param(True, "self.optimizer built once per client, kept across rounds: " + CODE
                                       + "clients/clientFedRANE.py ClientFedRANE.__init__; set_parameters "
                                       "replaces the parameters' .data, so momentum buffers persist")
    lr_step_epochs: int = param(150, "StepLR(step_size=150 * local_steps, gamma=0.1), stepped once per train_raw: "
                                + CODE + "clients/clientFedRANE.py ClientFedRANE.__init__, train_raw", ge=0)
    gne_drop_idle: bool = param(True, "a client with an all-zero update joins neither the Nash solve nor the step: "
                                + CODE + "servers/serverFedRANE.py update_global (no_grad_id_list)")
    flat_features: bool = param(True, "CNNModel with fc = nn.Identity (1568-d flattened conv features on 28x28): "
                                + CODE + "trainmodel/models.py CNNModel; " + MAIN + " run (model 'ConvNet')")


@dataclass(frozen=True)
class FedRANERepairedConfig(FedRANEConfig):
    """FedRANE with our repairs (the ``fedrane.*`` defaults before issue 40): every key of ``fedrane.*`` under
    ``fedrane-repaired.*``; the repaired defaults below, each with the measurement it rests on (docs/FEDRANE.md,
    docs/METHODS.md)."""

    NAME = "fedrane-repaired"

    @classmethod
    def specs(cls) -> list[KeySpec]:
        """The keys as declared, without the flat names of before sectioning (those name fedrane.* keys)."""
        return [dataclasses.replace(s, old=None) for s in super().specs()]
    lra_residual: bool = param(True, "h^{l+1} = h^l + messages (repair: the literal Eq. 5 stayed at the chance "
                               "loss ln 10 for 8 central epochs on digits' complete graph, docs/FEDRANE.md)")
    lra_cut: str = param("row-mean", "A_ij above node i's mean relation (repair: N_i = {A_ij > 0} is the "
                         "complete graph, on which SLIM decides nothing; docs/FEDRANE.md section 1)", choices=CUTS)
    lra_eval: str = param("inductive", "each test sample's own graph over a fixed support set of training data "
                          "(repair: a prediction independent of the other test samples, docs/FEDRANE.md section "
                          "2)", choices=EVAL_MODES)
    lra_predictor: str = param("linear", "one Linear(d, C) (the predictor these repairs were measured with)",
                               choices=PREDICTORS)
    lra_slim_update: str = param("majorize", "the exact B-step with lambda_G Phi: each alternation a "
                                 "majorise-minimise step of Eq. 2 with the paper's lambda_G (docs/METHODS.md)",
                                 choices=SLIM_UPDATES)


# what fedrane (and fedrane-code) ran before issue 40 made the paper's text the defaults: a benchmark or experiment
# that reports numbers measured then pins these (run-config keys of the named section)
BEFORE_ISSUE_40 = {"fedrane": {"lra-residual": True, "lra-cut": "row-mean", "lra-eval": "inductive",
                               "lra-predictor": "linear", "lra-slim-update": "majorize"},
                   "fedrane-code": {"drop-last": False, "persistent-optimizer": False, "lr-step-epochs": 0,
                                    "flat-features": False, "lra-slim-update": "majorize", "gne-drop-idle": False}}


def before_issue_40(section: str) -> dict[str, object]:
    """:data:`BEFORE_ISSUE_40` of ``section`` as run-config keys (``fedrane.lra-residual``, ...)."""
    return {f"{section}.{k}": v for k, v in BEFORE_ISSUE_40[section].items()}


def rane_config(cfg: Sectioned) -> FedRANEConfig:
    """The FedRANE section a run reads: its method's (``fedrane-code.*``, ``fedrane-repaired.*``), else
    ``fedrane.*``."""
    own = cfg.method_section
    return own if isinstance(own, FedRANEConfig) else cfg.section(FedRANEConfig)


PAPER = "Liao et al. 2023, arXiv 2308.11646 (FedRANE: local relational augmentation + global Nash equilibrium)"
GNE = "strategies.methods.fedrane.strategy:GNEStrategy"
LRA = "client_app.trainers.fedrane:LRATrainer"
NECK = "models.fedrane.neck:add_lra_neck"
PREDICTOR = "models.fedrane.neck:add_predictor"
LRA_METRICS = (CD_LOSS, TRAIN_DENSITY, EVAL_DENSITY)
# client state of persistent-optimizer / lr-step-epochs: declared where they are on by default (fedrane-code); the
# other LRA methods keep the same entries when a run sets those keys
LRA_STATE = (STATE_OPTIMIZER, STATE_SCHEDULE)
CODE_RECIPE = {"lr": 0.1, "momentum": 0.9, "weight-decay": 1e-5, "local-epochs": 10, "batch-size": 128}
CODE_RECIPE_SOURCES = {
    "lr": REPO + MAIN + " argument --local_learning_rate (default 0.1; the README's command passes -lr 0.01)",
    "momentum": CODE + "clients/clientFedRANE.py ClientFedRANE.__init__ (torch.optim.SGD(momentum=0.9))",
    "weight-decay": CODE + "clients/clientFedRANE.py ClientFedRANE.__init__ (torch.optim.SGD(weight_decay=1e-5))",
    "local-epochs": REPO + MAIN + " argument --local_steps (default 10), the epochs loop of "
                           "clients/clientFedRANE.py train_raw",
    "batch-size": REPO + MAIN + " argument --batch_size (default 128; the README's command passes -lbs 128)",
}
REPAIRED_REASON = ("FedRANE with our repairs, the fedrane defaults before issue 40 (keys fedrane-repaired.*): "
                   "residual message passing, row-mean graph cut, inductive evaluation, linear predictor. Measured "
                   "(benchmarks/results/fedrane_literal.json: digits, Dir(0.5), 10 clients, 8 rounds, seed 0): the "
                   "literal fedrane stays at chance (G-FL 11.1 %, loss 2.32 ~ ln 10) where fedrane-repaired reaches "
                   "62.7 % (FedAvg 68.5 %); docs/METHODS.md")
METHODS = [
    MethodDecl("fedrane", PAPER, GNE, LRA, config=FedRANEConfig, model_hook=NECK,
               payload=Payload(metrics=LRA_METRICS),
               description="FedRANE as the paper writes it (Sec. 3.2-3.4, Eqs. 2-16; docs/METHODS.md)"),
    MethodDecl("fedrane-no-lra", PAPER, GNE, BASE_TRAINER, config=FedRANEConfig, model_hook=PREDICTOR,
               description="ablation FedRANE-w/o-LRA: GNE aggregation, plain clients with FedRANE's predictor"),
    MethodDecl("fedrane-no-gne", PAPER, FEDAVG_STRATEGY, LRA, config=FedRANEConfig, model_hook=NECK,
               payload=Payload(metrics=LRA_METRICS),
               description="ablation FedRANE-w/o-GNE: LRA clients, weighted averaging"),
    MethodDecl("fedrane-code", PAPER, GNE, LRA, config=FedRANECodeConfig, model_hook=NECK,
               payload=Payload(metrics=LRA_METRICS + (MIXUP_LOSS,), state=LRA_STATE),
               recipe=CODE_RECIPE, recipe_sources=CODE_RECIPE_SOURCES,
               description="FedRANE as the authors' public code runs it, recipe included (keys fedrane-code.*, "
                           "docs/METHODS.md)"),
    MethodDecl("fedrane-repaired", PAPER, GNE, LRA, config=FedRANERepairedConfig, model_hook=NECK,
               payload=Payload(metrics=LRA_METRICS), description=REPAIRED_REASON),
]
__all__ = ["ConfigError", "FedRANEConfig", "FedRANECodeConfig", "FedRANERepairedConfig", "METHODS",
           "rane_config"]
