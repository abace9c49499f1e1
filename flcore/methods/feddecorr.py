"""FedDecorr (Shi, Liang, Zhang, Tan and Bai, "Towards Understanding and Mitigating Dimensional Collapse in
Heterogeneous Federated Learning", ICLR 2023, arXiv 2210.00226): a client-side regulariser against dimensional
collapse of the representations; the server is FedAvg.

Local objective per minibatch (paper Sec. 4, "FedDecorr"; equation numbers not confirmed, see below):
    L = CE + beta * L_FedDecorr,   L_FedDecorr = (1/d^2) ||K||_F^2
with K the d x d correlation matrix of the batch's representations after z-scoring each of the d dimensions
over the batch. The representation is the one the linear classifier reads (the authors' networks return the
pooled features before ``classifier``; here the backbone output ``model.features(x)``).

What was read, and where (search tool, session 11 re-check): every stored copy of the paper — the arXiv HTML
(arxiv.org/html/2210.00226v5), the ICLR 2023 text and the v4 LaTeX source/paragraphs (SPIQA) — holds only the
abstract and the introduction, which name the term (a Frobenius-norm penalty on the correlation matrix of
z-scored representations) but not Sec. 4's equations, their numbers, the beta the paper reports or its tables.
So the form above is the one the issue-34 brief states, checked against the authors' code (repository
bytedance/FedDecorr): ``loss.py`` (``FedDecorrLoss``), ``approach/*.py`` (``--feddecorr_coef`` default 0.1, the
call on the features the network returns) and ``run_scripts/*_feddecorr.sh`` (DECORR_COEF=0.1 in every one;
CIFAR10: MobileNetV2, 10 clients, Dirichlet 0.05, lr 0.01, weight decay 1e-5, E = 10, 100 rounds).
The code computes its term differently from the equation: it standardises with the unbiased variance plus eps,
takes only the off-diagonal entries of Z^T Z (= (N-1) K), averages their squares over d(d-1) and divides by N,
i.e. (N-1)^2/N * mean_{i != j} K_ij^2. Since K_ii = 1, that is (N-1)^2 d / (N (d-1)) * (L_FedDecorr - 1/d):
the same minimiser and the same gradient direction, about N times larger. ``feddecorr.form`` picks either; the
paper's experiments ran the code, so its beta values are on the "code" scale.
"""

from dataclasses import dataclass

from flcore.declaration import FEDAVG_STRATEGY, MethodDecl
from flcore.schema import Section, param

FORMS = ("paper", "code")


@dataclass(frozen=True)
class FedDecorrConfig(Section):
    NAME = "feddecorr"
    beta: float = param(0.1, "weight of the decorrelation term, L = CE + beta L_FedDecorr (paper Sec. 4); 0.1 is the "
                             "authors' code default --feddecorr_coef and the value of all their run scripts, i.e. "
                             "on the code form's scale (the paper's own stated value could not be read)", ge=0)
    eps: float = param(1e-8, "added to each dimension's batch variance before the square root of the z-scoring "
                             "(the authors' code, loss.py)", gt=0)
    form: str = param("paper", "paper: (1/d^2)||K||_F^2, diagonal included (paper Sec. 4); code: the authors' "
                               "loss.py, (N-1)^2/N * mean of the off-diagonal K_ij^2, about N times stronger at "
                               "the same beta", choices=FORMS)


METHODS = [MethodDecl("feddecorr", "Shi, Liang, Zhang, Tan and Bai, ICLR 2023 (FedDecorr)", FEDAVG_STRATEGY,
                      "client_app.trainers.feddecorr:FedDecorrTrainer", config=FedDecorrConfig)]
