"""FedRS (Li and Zhan, "FedRS: Federated Learning with Restricted Softmax for Label Distribution Non-IID Data",
KDD 2021): FedAvg whose local softmax is restricted, so that a client's updates pull the classifier weights of
the classes it lacks less strongly. The server is FedAvg.

Restricted softmax (paper Sec. 4): with the logits o_c of a sample and the client's scales s_c,
    p_c = exp(s_c o_c) / sum_j exp(s_j o_j),   s_c = 1 for an observed class, alpha for a missing one,
alpha in [0, 1]; alpha = 1 is the plain softmax (FedAvg), alpha = 0 removes the missing classes from the
softmax. The authors' code (lxcnju/FedRepo, algorithms/fedrs.py: FedRS.update_local) scales by the class
counts instead, s_c = alpha + (1 - alpha) n_c / max_j n_j (= alpha for a missing class, 1 for the client's
largest class, in between for a rare one), and multiplies only h W^T (its classifier has no bias); here the
whole logit is scaled (our linear head has a bias; the ETF head has none). The restriction is used in local
training only: the paper tests the aggregated model with the plain softmax, and so does the authors' test().

The restriction is not tied to this method: it is the common key ``restricted-softmax-alpha`` (and
``restricted-softmax-form``: ``paper`` or ``code``), applied in the local loss of every method's trainer
(client_app/trainers/base.py wraps the trainer's training forward, client_app/training.py:
``restricted_forward``), the way ``head = etf`` composes. ``fedrs`` is FedAvg with the paper's alpha as its
recipe; SCAFFOLD/RS (the neural-collapse paper's Table 1 row, the authors' algorithms/scaffoldrs.py) is
``method = scaffold, restricted-softmax-alpha = 0.5``.

What was read: the authors' code (FedRepo algorithms/fedrs.py, algorithms/scaffoldrs.py, networks/basic_nets.py
ClassifyNet: ``nn.Linear(h_size, n_classes, bias=False)``). The paper's own text could not be opened here
(only its abstract); its Sec. 4 equation and its alpha = 0.5 setting (Table 1, Fig. 5) are as restated by a
secondary source that quotes them; the code's default alpha is not set (train_dir.py has no FedRS grid).
"""

from flcore.declaration import BASE_TRAINER, FEDAVG_STRATEGY, MethodDecl

ALPHA = 0.5   # FedRS Sec. 5 / Table 1: alpha = 0.5 (as restated, see the module docstring)

METHODS = [MethodDecl("fedrs", "Li and Zhan, KDD 2021 (FedRS: restricted softmax)", FEDAVG_STRATEGY, BASE_TRAINER,
                      recipe={"restricted-softmax-alpha": ALPHA},
                      recipe_sources={"restricted-softmax-alpha": "FedRS Sec. 5, Table 1 and Fig. 5: alpha = 0.5 "
                                                                  "(the paper's text as restated by a secondary "
                                                                  "source; the authors' FedRepo sets no default)"})]
