"""FML, Federated Mutual Learning (Shen, Zhang, Jia, Zhang et al., arXiv 2006.16765, 2020).

Each client k keeps a personal ("local") model l_k in its client state and receives the global ("meme")
model m each round. On every minibatch both are trained at once by deep mutual learning (paper Sec. 3,
Eqs. 1-2; authors' src/Trainer.py:train_mutual):

    L_local = alpha CE(l(x), y) + (1 - alpha) KL(p_m || p_l)
    L_meme  = beta  CE(m(x), y) + (1 - beta)  KL(p_l || p_m)

p_l = softmax(l(x)), p_m = softmax(m(x)); in each KL the other model's distribution is the (detached) target,
``batchmean`` over the minibatch (authors' KL_Loss = nn.KLDivLoss(reduction='batchmean') on the log-softmax
of the trained model and the softmax of the other's detached output). Both forwards come before both steps.
The server averages only the meme models (authors' Node.py:Global_Node.merge); the local model never leaves
the client. G-FL evaluates the averaged meme model, P-FL each client's local model (FedUFO Sec. 4.1.1 reports
FML's global model "for fair comparison").

Reductions: beta = 1 trains the meme model by plain cross-entropy, i.e. FedAvg (its local model only rides
along); alpha = 1 trains the local model by plain cross-entropy on the same minibatches (``local``).

What was read: the authors' code, ZJU-DAI/Federated-Mutual-Learning (src/Trainer.py:train_mutual, Args.py,
Node.py, Train_mutual.py); the paper's text could not be opened here, so its equation numbers are as we know
them, the forms above being the code's. Differences from the authors' code (docs/methods/fml.md): they
allow a local architecture unlike the meme's (Args.py --local_model); here both are the run's ``model``.
Their merge is the unweighted mean of the memes; ours is FedAvg's example-weighted mean (equal on equal
splits). Their local model starts from its own random initialisation (Node.__init__ init_model) and its SGD
optimizer persists across rounds; ours starts from the initial global model w^0 and its optimizer (the run's
``lr``/``momentum``/``weight-decay``) is rebuilt every round, as the meme's is (Node.fork).
"""

from dataclasses import dataclass

from flcore.declaration import FEDAVG_STRATEGY, MethodDecl, Payload, own_backward
from flcore.schema import Section, param

STATE_FML_LOCAL = "fml-local-model"     # client state: FML's personal (local) model l_k of this client (never sent)


@dataclass(frozen=True)
class FMLConfig(Section):
    NAME = "fml"
    alpha: float = param(0.5, "alpha of L_local = alpha CE + (1 - alpha) KL(p_meme || p_local) (FML Sec. 3, Eq. 1; "
                              "0.5: the authors' Args.py --alpha 'local ratio of data loss'); 1: the local model "
                              "trains on cross-entropy alone", ge=0, le=1)
    beta: float = param(0.5, "beta of L_meme = beta CE + (1 - beta) KL(p_local || p_meme) (FML Sec. 3, Eq. 2; "
                             "0.5: the authors' Args.py --beta 'meme ratio of data loss'); 1: the meme model "
                             "trains as FedAvg's", ge=0, le=1)


METHODS = own_backward([MethodDecl("fml", "Shen et al., arXiv 2020 (FML: Federated Mutual Learning)", FEDAVG_STRATEGY,
                      "client_app.trainers.fml:FMLTrainer", config=FMLConfig,
                      payload=Payload(state=(STATE_FML_LOCAL,)),
                      description="FML (Shen et al., 2020): a personal local model and the global meme model trained "
                                  "by mutual learning (CE + KL to each other); the server averages the memes")])
