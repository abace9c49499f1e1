"""FedMix and NaiveMix (Yoon, Shin, Hwang and Yang, "FedMix: Approximation of Mixup under Mean Augmented Federated
Learning", ICLR 2021, arXiv 2107.00233): Mean Augmented FL (MAFL): every client shares averages of its local
data (mean inputs x_bar with mean one-hot labels y_bar), the server pools them and relays the pool; local
training mixes each local batch with a pooled mean. A comparison row of FedBR's Table 1 (seed 003).

Per minibatch, with one mean (x_bar, y_bar) drawn from the pool and the fixed mixing ratio lambda:
    NaiveMix:  x~ = (1 - lam) x + lam x_bar,
               L = (1 - lam) CE(f(x~), y) + lam CE(f(x~), y_bar)
    FedMix (the first-order approximation of mixup with x_bar around lam x_bar -> 0, which needs no raw sample
    of another client):
               u = (1 - lam) x,
               L = (1 - lam) CE(f(u), y) + lam CE(f(u), y_bar) + lam <d CE(f(u), y)/d u, x_bar>
CE(., y_bar) is the cross-entropy against the soft label y_bar; the gradient term is per sample (each sample's
loss differentiated by its own input) and averaged over the batch.

What was read: the stored copies of the paper gave only the abstract; no official code repository could be
found in the index. The form above is the paper's (its MAFL framework and the two losses as its Sec. 3-4 define
them), checked against Flower's port (adap/flower baselines/fedmix, ``fedmix/client.py``
``NaiveMixClient.training_loop`` / ``FedMixClient.training_loop``, read only to cross-check): the same three
terms, except that the port differentiates the batch-mean (1 - lam) CE, i.e. its gradient term is
(1 - lam)/B times ours. Defaults: lambda = 0.05 and one mean over all of a client's data ("mash batch size:
all") are the paper's CIFAR-10 FedMix settings as that port's README reports them (0.1 for NaiveMix).

Sharing goes through the server, before training as the paper's MAFL has it: at the start of a round the server
asks every registered client whose means it does not hold yet (round 1: all of them) for its means in one more
exchange (message type ``train.means``, reply record ``fedmix-means``); it keeps every client's means (its only
state besides FedAvg's, checkpointed) and sends the pool to every sampled client with the round's model (record
``fedmix-global``). Bytes: a client uploads ceil(n_k / M) x (prod(input shape) + C) x 4 once and downloads the
pool, sum_k ceil(n_k / M) x (prod(input shape) + C) x 4, every round it is sampled (docs/methods/data-sharing.md);
the means request carries the model too (the message layout every train message has). Privacy: a mean over M
samples reveals the client's average input and, through y_bar, its label distribution; M = all local data
(mean-size 0) is the coarsest.
"""

from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload, own_backward
from flcore.schema import Section, param

LOSSES = ("fedmix", "naivemix")
MEANS_ACTION = "train.means"       # message type of the means request, before a round's training
GLOBAL = "fedmix-global"           # server -> client record: the pooled means of every client so far ("x", "y")
MEANS = "fedmix-means"             # client -> server record: this client's means ("x": inputs, "y": soft labels)
POOL_SIZE = "fedmix-pool-size"     # round metric: how many means the pool holds after the round


@dataclass(frozen=True)
class FedMixConfig(Section):
    NAME = "fedmix"
    lam: float = param(0.05, "lambda, the fixed mixing ratio of the local batch with a pooled mean (FedMix / "
                             "NaiveMix losses; 0.05: the paper's CIFAR-10 FedMix value as Flower's port "
                             "baselines/fedmix README reports it); 0: FedAvg", ge=0, lt=1)
    loss: str = param("fedmix", "fedmix: the first-order approximation (three terms, no raw mixing); naivemix: "
                                "the local batch mixed with the mean itself", choices=LOSSES)
    mean_size: int = param(0, "M, local samples per shared mean; 0: one mean over all local data (the paper's "
                              "setting as Flower's port reports it, 'mash batch size: all')", ge=0)


METHODS = own_backward([MethodDecl("fedmix", "Yoon, Shin, Hwang and Yang, ICLR 2021 (FedMix / NaiveMix, MAFL)",
                      "strategies.methods.fedmix:FedMixStrategy", "client_app.trainers.fedmix:FedMixTrainer",
                      config=FedMixConfig,
                      payload=Payload(records=(GLOBAL,), reply_records=(MEANS,), actions=("train", MEANS_ACTION)))])
