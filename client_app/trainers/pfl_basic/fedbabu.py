"""FedBABU (Oh et al., ICLR 2022), client side.

Federated training (Sec. 4, Alg. 1): local SGD updates the body only; the head keeps its random
initialisation (authors' main_fed.py with --local_upt_part body: ``local.train(body_lr=lr, head_lr=0.)``).
Here the head is left out of the optimizer (no step, no momentum, no weight decay on it), so it stays exactly
at the received value, which is the server's initial head. P-FL (Sec. 4, personalization by fine-tuning):
the broadcast model is fine-tuned on the client's training data for ``fedbabu.finetune-epochs`` epochs
(authors' analysis.ipynb: 5 epochs of SGD over body and head, lr 1e-3, momentum 0.9, the training batch
size; ``fedbabu.finetune-max-steps`` caps it for a reduced budget) and then tested on the local test split. ``update-part = full`` trains the head too (FedAvg).
"""

from __future__ import annotations

import copy

from torch import nn

from client_app.trainers.base import Trainer
from client_app.training import OptimConfig, TrainStats, local_train
from flcore.methods.pfl_basic import FedBABUConfig, head_names


def part_parameters(model: nn.Module, part: str) -> list[nn.Parameter]:
    """The trainable parameters of ``part``: full, head (FLModel.head) or body (everything else)."""
    head = set(head_names(n for n, _ in model.named_parameters()))
    return [p for n, p in model.named_parameters() if p.requires_grad
            and (part == "full" or (n in head) == (part == "head"))]


class FedBABUTrainer(Trainer):
    def fit(self) -> TrainStats:
        d, model = self.job.data, self.job.model
        part = self.cfg.section(FedBABUConfig).update_part
        stats = local_train(model, d.x_train, d.y_train, self.optim_config(), self.terms(),
                            generator=self.job.generator, forward=self.forward, params=part_parameters(model, part))
        model.zero_grad(set_to_none=True)  # the head's gradients, never applied
        return stats

    def personalized(self) -> nn.Module:
        """The received (broadcast) model fine-tuned on local training data (FedBABU's P-FL evaluation)."""
        hp = self.cfg.section(FedBABUConfig)
        tuned = copy.deepcopy(self.job.model)
        tuned.load_state_dict(dict(self.job.global_params))
        if hp.finetune_epochs == 0:
            return tuned
        d = self.job.data
        opt = OptimConfig(lr=hp.finetune_lr, epochs=hp.finetune_epochs, batch_size=self.cfg.batch_size,
                          momentum=hp.finetune_momentum, max_steps=hp.finetune_max_steps)
        local_train(tuned, d.x_train, d.y_train, opt, (), generator=self.job.generator, forward=self.forward,
                    params=part_parameters(tuned, hp.finetune_part))
        return tuned
