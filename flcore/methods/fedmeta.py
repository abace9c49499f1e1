"""FedMeta as FedUFO's comparison row (seed 002, Tables 1-2: "FedMeta [31]"): Yao, Huang, Zhang, Li and Sun,
"Federated learning with unbiased gradient aggregation and controllable meta updating", NeurIPS 2019 workshop on
federated learning (arXiv 1910.08234) -- not Chen et al.'s MAML "FedMeta".

FedUFO states how it ran it (Sec. 4.1.1 iv): "for FedMeta, 10% data of every client are used to construct the
meta data that finetune the aggregated global model in each iteration", with the implementation settings of every
other method (Sec. 4.1.1 ii: SGD "in both client and server", lr 0.01, momentum 0.9, weight decay 2e-4, B = 10 on
MNIST / 50 on CIFAR-10). Each round here:

    w_{t+1}^avg = sum_k n_k w_k / sum_k n_k                          (FedAvg's aggregation)
    w_{t+1}     = SGD on CE(f(x), y) over the meta set M from w_{t+1}^avg, for ``epochs`` epochs (at most
                  ``steps`` steps), minibatch B_m, lr eta_m, the run's momentum and weight decay, a fresh
                  optimizer each round, minibatch order seeded by (seed, round)
    M           = the union over the clients k of a seeded random subset of round(fraction x n_k) samples of
                  client k's local TRAINING split (never its local test split)

and w_{t+1} is what the server evaluates (G-FL) and broadcasts. What was read: FedUFO's text above and the
abstract of [31] (an additional controllable meta-updating procedure at the server, after model aggregation, on
a small set of data samples that indicates the expected target distribution; its unbiased gradient aggregation,
UGA, "can be applied individually or together"). The full text of [31] is not available here, so:
- from FedUFO's text: the fraction 0.1 of every client's data, the meta update of the aggregated model every
  round, SGD with the run's settings (lr, momentum, weight decay, batch size: "the same implementation settings");
- ours, stated by neither text available here: one meta epoch per round, no step cap, the run's lr and batch
  size for the meta step (meta lr 0 / meta batch 0 mean "the run's"), a fresh momentum buffer each round;
- not implemented: UGA (FedUFO's row uses the meta data; UGA is the other, separable half of [31]).

Sharing (docs/methods/data-sharing.md): before a client's first round the server asks it once, in its own
exchange (message type ``train.meta``), for its share; the reply (record ``fedmeta-share``, arrays "x" float32
(m, *input shape) and "y" int64 (m,)) is checked against the registration (m = :func:`share_count` of the
registered training size, labels in [0, C), the input shape of the run's dataset) and a client whose reply does
not conform is left out with a warning naming it. The pool is checkpointed. Bytes per shared sample:
prod(input shape) x 4 + 8.
"""

from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload
from flcore.schema import Section, param

LOCAL_DATA = ("all", "rest")
SHARE_ACTION = "train.meta"        # message type of the share request, before a client's first round
SHARE = "fedmeta-share"            # client -> server record: this client's meta share ("x": inputs, "y": labels)
POOL_SIZE = "fedmeta-pool-size"    # round metric: how many samples the server's meta set holds after the round
META_STEPS = "fedmeta-meta-steps"  # round metric: SGD steps of the round's meta update on the server
META_LOSS = "fedmeta-meta-loss"    # round metric: mean cross-entropy of the meta update's minibatches (absent: no step)


def share_count(num_train: int, fraction: float) -> int:
    """How many training samples a client of ``num_train`` shares: round(fraction x n), halves rounded up."""
    if num_train < 0 or not 0.0 <= fraction <= 1.0:
        raise ValueError(f"share_count needs n >= 0 and a fraction in [0, 1], got n={num_train}, {fraction}")
    return min(num_train, int(fraction * num_train + 0.5))


@dataclass(frozen=True)
class FedMetaConfig(Section):
    NAME = "fedmeta"
    fraction: float = param(0.1, "share of every client's local training split sent once to the server as meta "
                                 "data (FedUFO Sec. 4.1.1 iv: '10% data of every client are used to construct "
                                 "the meta data'); 0: FedAvg", ge=0, le=1)
    epochs: int = param(1, "meta epochs over the pooled meta set per round, after aggregation (ours: neither "
                           "FedUFO's text nor [31]'s abstract states it); 0: FedAvg", ge=0)
    steps: int = param(0, "cap on the meta SGD steps per round (ours; 0: none, the epochs decide)", ge=0)
    lr: float = param(0.0, "meta SGD learning rate; 0: the run's lr (FedUFO Sec. 4.1.1 ii: SGD 'in both client "
                           "and server' with one lr; ours to read it so)", ge=0)
    batch_size: int = param(0, "meta minibatch size; 0: the run's batch-size (ours: FedUFO's 'same "
                               "implementation settings')", ge=0)
    local_data: str = param("all", "what a client trains on: all, its whole training split, the shared samples "
                                   "included (ours: FedUFO's text does not say they leave it); rest, without "
                                   "the shared samples (aggregation weights stay the registered counts)",
                            choices=LOCAL_DATA)

    def meta_lr(self, run_lr: float) -> float:
        """The meta step's learning rate: ``lr``, or the run's when 0."""
        return self.lr if self.lr > 0 else run_lr

    def meta_batch(self, run_batch: int) -> int:
        """The meta minibatch size: ``batch_size``, or the run's when 0."""
        return self.batch_size if self.batch_size > 0 else run_batch


METHODS = [MethodDecl("fedmeta", "Yao, Huang, Zhang, Li and Sun, NeurIPS 2019 FL workshop (FedMeta, as FedUFO's row)",
                      "strategies.methods.fedmeta:FedMetaStrategy", "client_app.trainers.fedmeta:FedMetaTrainer",
                      config=FedMetaConfig,
                      payload=Payload(reply_records=(SHARE,), actions=("train", SHARE_ACTION)),
                      description="FedMeta as FedUFO ran it: FedAvg, then every round the server fine-tunes the "
                                  "aggregated model by SGD on a meta set of 10% of every client's training data, "
                                  "shared once (UGA not implemented)")]
