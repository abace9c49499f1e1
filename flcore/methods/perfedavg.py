"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees: A
Model-Agnostic Meta-Learning Approach", NeurIPS 2020): FedAvg on the MAML objective
F(w) = (1/n) sum_i f_i(w - alpha grad f_i(w)), so that one local gradient step from the global model gives each
user a personalized model. The server is FedAvg.

Local step (paper Alg. 1; three independent minibatches D, D', D'' of ``batch-size`` each):
    w_tmp = w - alpha grad f_i(w; D)
    FO:  w <- w - beta grad f_i(w_tmp; D')                                     (Per-FedAvg (FO))
    HF:  w <- w - beta (g - alpha d),  g = grad f_i(w_tmp; D'),
         d = [grad f_i(w + delta g; D'') - grad f_i(w - delta g; D'')] / (2 delta)   (Per-FedAvg (HF): the
         Hessian-vector product by central differences)
beta is the common ``lr`` (the step that moves the model), alpha ``perfedavg.alpha``; a client takes
tau = E * ceil(n/B) / m steps (m = 2 or 3 batches per step, at least one step; ``max-local-steps`` caps it),
drawing its batches from a reshuffled cycle as the codes' get_next_train_batch. ``weight-decay`` (0 in the
recipe) adds wd w to every gradient. P-FL (the paper's evaluation): each client's personalized model is the
received global model after one step w - alpha grad f_i(w; D) on one minibatch of its training data, tested
on its local test split.

What was read: the paper's abstract only (its text could not be opened here); the steps above are its Alg. 1 as
we know it. Per-FedAvg's authors published no code; the two codes that ran it as a baseline were read to cross-
check (never copied): the pFedMe authors' FLAlgorithms/users/userperavg.py (UserPerAvg.train: first order,
two batches per step, and train_one_step for the evaluation) and the FedBC authors' models/Update.py
(LocalUpdate.train_MAML, evaluate_local.train_one_step; utils/options.py --inner_lr 0.01 --outer_lr 0.01,
run by synthetic_jobs.sh). FedBC (App. E.2) states that it takes alpha and beta "as in Fallah et al."; their
digits are lost in our copy of FedBC.
"""

from dataclasses import dataclass

from flcore.common import CommonConfig
from flcore.declaration import MethodDecl, own_backward
from flcore.schema import ConfigError, Section, param

VARIANTS = ("fo", "hf")


@dataclass(frozen=True)
class PerFedAvgConfig(Section):
    NAME = "perfedavg"
    alpha: float = param(0.01, "alpha, the personalization step size of w - alpha grad f_i(w) (paper Eq. 3, Alg. 1) "
                               "and of the P-FL adaptation step; 0.01: the FedBC authors' utils/options.py "
                               "--inner_lr, their Per-FedAvg run (the paper's own Sec. 5 values could not be "
                               "read)", gt=0)
    variant: str = param("fo", "fo: first-order (Per-FedAvg (FO), drops the Hessian term); hf: Hessian-free, the "
                               "Hessian-vector product by central differences (Per-FedAvg (HF)); fo: what both "
                               "codes that ran it as a baseline run (pFedMe's userperavg.py, FedBC's "
                               "train_MAML)", choices=VARIANTS)
    delta: float = param(1e-3, "delta of the HF central difference (paper Alg. 1, Per-FedAvg (HF)); 1e-3: our choice "
                               "(the paper's Sec. 5 value could not be read)", gt=0)

    def check_run(self, common: Section) -> None:
        """Per-FedAvg's steps are plain gradient steps: a local momentum would be silently unused."""
        assert isinstance(common, CommonConfig)  # the run config (flcore.config.RunConfig._check_run)
        if common.momentum != 0.0:
            raise ConfigError(f"method perfedavg takes plain gradient steps (paper Alg. 1): run-config key "
                              f"'momentum' must be 0, got {common.momentum}")


METHODS = own_backward([MethodDecl("perfedavg", "Fallah, Mokhtari and Ozdaglar, NeurIPS 2020 (Per-FedAvg: MAML)",
                      "strategies.methods.fedavg:FedAvgStrategy", "client_app.trainers.perfedavg:PerFedAvgTrainer",
                      config=PerFedAvgConfig,
                      recipe={"momentum": 0.0, "weight-decay": 0.0},
                      recipe_sources={"momentum": "Per-FedAvg Alg. 1: plain stochastic gradient steps",
                                      "weight-decay": "Per-FedAvg Alg. 1: no regulariser (the pFedMe authors' MySGD "
                                                      "and the FedBC authors' MySGD add none)"})])
