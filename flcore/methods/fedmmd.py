"""FedMMD (Yao, Huang and Sun, "Two-Stream Federated Learning: Reduce the Communication Costs", VCIP 2018; the
extended version arXiv 1908.05891): each client trains a two-stream model, the received global model frozen
beside the local one, with a Maximum Mean Discrepancy constraint between the two streams' outputs on the same
minibatch; the server is FedAvg. A comparison row of the neural-collapse FL paper's Table 1 (seed 004).

Local objective per minibatch:
    L = CE(f_local(x), y) + lambda * max(floor, MMD^2(h_local(x), h_global(x)))
    MMD^2(P, Q) = mean K(p, p') + mean K(q, q') - 2 mean K(p, q),   clipped at 0
    K(a, b) = sum_s exp(-||a - b||^2 / (2 s))     (a sum of Gaussian kernels, s over the code's 19 widths)
h_global is detached (the global stream is not trained).

What was read (session 14): the stored pages hold only the abstracts of both versions; the authors' code
(repository thu-media/TwoStreamFederatedLearning) was read in full for the term. Its ``losses.py``
(``maximum_mean_discrepancy``, ``mmd_loss``, ``gaussian_kernel_matrix``) gives the kernel (the widths, the
exp(-d / (2 s)) form, the biased V-statistic, the clip at 0 and the floor max(1e-4, .) before the weight), and
``mnist/mnist_deep.py`` (``train_double``) / ``cifar/cifar_main.py`` apply it to the two streams' *logits*
with weight 0.1 (MNIST) and 1 (CIFAR). In both files that MMD line is commented out and the live constraint
is an L2 loss on the logits (``0.001 * l2_loss(logits_1 - logits_2)``): the released code ran the L2 ablation
last. We implement the MMD the method is named for; ``fedmmd.layer`` also offers the representation z (the
form FedRepo's ``fedreg.py`` ``reg_way='fedmmd'`` uses, read only to cross-check).
"""

from dataclasses import dataclass

from flcore.declaration import FEDAVG_STRATEGY, MethodDecl
from flcore.schema import Section, param

LAYERS = ("logits", "features")
# the Gaussian widths s of the authors' losses.py mmd_loss (K = sum_s exp(-d^2 / (2 s)))
CODE_WIDTHS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 100.0,
               1e3, 1e4, 1e5, 1e6)


@dataclass(frozen=True)
class FedMMDConfig(Section):
    NAME = "fedmmd"
    weight: float = param(0.1, "lambda of the MMD constraint, L = CE + lambda max(floor, MMD^2) (authors' code "
                               "mnist/mnist_deep.py train_double: mmd_loss(logits_1, logits_2, 0.1); the CIFAR "
                               "script uses 1); 0: FedAvg", ge=0)
    layer: str = param("logits", "what the two streams compare: logits (the authors' code, both scripts) or the "
                                 "representation z the head reads (FedRepo's port)", choices=LAYERS)
    floor: float = param(1e-4, "MMD^2 is raised to at least this before the weight (authors' losses.py mmd_loss: "
                               "tf.maximum(1e-4, loss)); below it the term has no gradient", ge=0)


METHODS = [MethodDecl("fedmmd", "Yao, Huang and Sun, VCIP 2018 (Two-Stream FL, FedMMD)", FEDAVG_STRATEGY,
                      "client_app.trainers.fedmmd:FedMMDTrainer", config=FedMMDConfig)]
