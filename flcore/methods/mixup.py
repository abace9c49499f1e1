"""Local Mixup (Zhang, Cisse, Dauphin and Lopez-Paz, "mixup: Beyond Empirical Risk Minimization", ICLR 2018) as a
local-training trick under FedAvg: the comparison row "FedAvg + Mixup" of FedBR's Table 1 (seed 003) and its
CIFAR-100 backbone. The server is FedAvg; every client trains on mixed minibatches.

Per minibatch (paper Eq. 1 / Sec. 2; the authors' code facebookresearch/mixup-cifar10 train.py: mixup_data,
mixup_criterion):
    lam ~ Beta(alpha, alpha),   pi a random permutation of the batch
    x~ = lam x + (1 - lam) x[pi]
    L  = lam CE(f(x~), y) + (1 - lam) CE(f(x~), y[pi])
One lam per minibatch, the partner taken inside the same minibatch (the authors' code; the paper writes the
pairs as drawn from the training data). ``mixup.alpha = 0`` is the code's own "no mixup" switch (lam = 1):
here it skips the mix entirely, so the run is FedAvg bit for bit (no random draw is made either).

FedBR's paper does not state the alpha of its 'FedAvg + Mixup' row; 1.0 is the paper's CIFAR-10 value (Sec. 3.2) and the
authors' code default (train.py --alpha).
"""

from dataclasses import dataclass

from flcore.declaration import FEDAVG_STRATEGY, MethodDecl
from flcore.schema import Section, param


@dataclass(frozen=True)
class MixupConfig(Section):
    NAME = "mixup"
    alpha: float = param(1.0, "lam ~ Beta(alpha, alpha) per minibatch (Zhang et al. Eq. 1; 1.0: the paper's CIFAR-10 "
                              "value, Sec. 3.2, and the authors' train.py --alpha default); 0: no mixing (lam = 1, "
                              "the code's switch), i.e. FedAvg", ge=0)


METHODS = [MethodDecl("mixup", "Zhang, Cisse, Dauphin and Lopez-Paz, ICLR 2018 (mixup), as local training under "
                      "FedAvg (FedBR's 'FedAvg + Mixup')", FEDAVG_STRATEGY,
                      "client_app.trainers.mixup:MixupTrainer", config=MixupConfig)]
