"""FedAwS (Yu, Rawat, Menon and Kumar, "Federated Learning with Only Positive Labels", ICML 2020): Federated
Averaging with Spreadout. The clients run FedAvg's local SGD; after averaging, the server takes gradient steps
on a geometric regulariser over the class embeddings (the rows w_c of the classifier W) that pushes every pair
closer than a margin apart (paper abstract and Sec. 4: "the server imposes a geometric regularizer after each
round to encourage classes to be spreadout in the embedding space"):

    reg_sp(W) = sum_c sum_{c' != c} max(0, nu - d(w_c, w_c'))^2            (the spreadout regulariser)
    W <- W - lr_sp * grad reg_sp(W),  repeated ``steps`` times on the server after FedAvg

A comparison row of the neural-collapse FL paper's Table 1 (seed 004), which ran it in the ordinary non-IID
setting (every client several classes, cross-entropy locally); there the regulariser only spreads the averaged
classifier rows. Everything else (the backbone, the head's bias) is FedAvg's average.

What was read (session 14): the stored copies of the paper (ICML text, arXiv 2004.10342) answered only with the
abstract; the authors (Google Research) published no code. The concrete form and values come from FedRepo
(lxcnju/FedRepo, ``algorithms/fedaws.py``: ``SpreadModel.forward``, ``FedAws.update_global_classifier``;
``train_lab.py``'s grid), the repository of the FedRS authors whose baseline list (FedMMD, FedAwS, FedRS,
SCAFFOLD/RS, FedNova, FedOpt, MOON, FedDyn) is seed 004's Table 1 row for row, so the likely code of that table:
d = (1 - cos(w_c, w_c')) / 2 on the L2-normalised rows, the hinge squared and *averaged* over the C x C matrix
(the diagonal counted as 0; FedRepo's hinge also fires on the diagonal, a constant nu^2 / C without gradient), SGD with momentum 0.9 restarted every round, lr 0.1, 30 steps, margin 0.8
(the first value of each of train_lab.py's grid lists). ``fedaws.distance = 'euclidean'`` offers the squared
Euclidean distance on the raw rows, and ``fedaws.reduction = 'sum'`` the sum over ordered pairs as written above.
"""

from dataclasses import dataclass

from flcore.common import CommonConfig
from flcore.declaration import BASE_TRAINER, MethodDecl
from flcore.schema import ConfigError, Section, param

DISTANCES = ("cosine", "euclidean")
REDUCTIONS = ("mean", "sum")
SPREAD_BEFORE = "fedaws-spreadout-before"   # round metric: reg_sp of the averaged classifier, before the server steps
SPREAD_AFTER = "fedaws-spreadout-after"     # round metric: reg_sp after the server's spreadout steps
HEAD_KEY = "head.weight"                    # the classifier rows the server spreads (models/heads.py LinearHead)


@dataclass(frozen=True)
class FedAwSConfig(Section):
    NAME = "fedaws"
    margin: float = param(0.8, "nu, the hinge margin of reg_sp (FedRepo train_lab.py 'margin': [0.8, 0.5], the "
                               "first; the paper's value could not be read)", gt=0)
    lr: float = param(0.1, "server step size on reg_sp (FedRepo train_lab.py 'aws_lr': [0.1, 0.01], the first)", ge=0)
    steps: int = param(30, "server gradient steps on reg_sp per round (FedRepo train_lab.py 'aws_steps': [30, 50], "
                           "the first); 0: FedAvg", ge=0)
    momentum: float = param(0.9, "momentum of the server's SGD on reg_sp, restarted every round (FedRepo "
                                 "fedaws.py update_global_classifier)", ge=0, lt=1)
    distance: str = param("cosine", "d(w_c, w_c'): cosine, (1 - cos)/2 of the normalised rows (FedRepo "
                                    "SpreadModel.forward); euclidean, ||w_c - w_c'||^2 of the raw rows",
                          choices=DISTANCES)
    reduction: str = param("mean", "mean over the C x C matrix (FedRepo SpreadModel.forward) or sum over the "
                                   "ordered pairs c != c' (the regulariser as written)", choices=REDUCTIONS)

    def check_run(self, common: Section) -> None:
        """The spreadout step moves the rows of a trainable linear classifier: a fixed head has none."""
        assert isinstance(common, CommonConfig)  # the run config (flcore.config.RunConfig._check_run)
        head = common.head
        if head != "linear":
            raise ConfigError(f"run-config key 'head' = '{head}': fedaws spreads the rows of the trainable "
                              "linear classifier, a fixed head has none to move; set head = 'linear'")


METHODS = [MethodDecl("fedaws", "Yu, Rawat, Menon and Kumar, ICML 2020 (FedAwS)",
                      "strategies.methods.fedaws:FedAwSStrategy", BASE_TRAINER,
                      config=FedAwSConfig)]
