"""FedMeta as FedUFO's comparison row (flcore/methods/fedmeta.py), client side: FedAvg's local SGD, and once, on
the server's request (message type ``train.meta``), the client's meta share: a seeded random subset of
:func:`flcore.methods.fedmeta.share_count` samples of its local TRAINING split (the local test split is never
read), returned as record ``fedmeta-share`` (x float32, y int64) with empty parameters (the server keeps its own
model) and the base metrics, NaN where they would need a training or an evaluation. With ``fedmeta.local-data = rest`` the client then trains on its training split without those samples
(recomputed every round from the same seed: no client state).
"""

from __future__ import annotations

import numpy as np
import torch

from client_app.trainers.base import Trainer, TrainReply
from client_app.training import TrainStats, local_train
from flcore.methods.fedmeta import SHARE, SHARE_ACTION, FedMetaConfig, share_count
from flcore.records import params_to_record


def share_indices(num_train: int, count: int, seed: int) -> torch.Tensor:
    """The indices (ascending) of the ``count`` training samples a client shares: the first ``count`` of a
    permutation of range(num_train) drawn from ``seed``."""
    if not 0 <= count <= num_train:
        raise ValueError(f"FedMeta: cannot share {count} of {num_train} training samples")
    order = torch.randperm(num_train, generator=torch.Generator().manual_seed(int(seed)))
    return torch.sort(order[:count]).values


def share_seed(run_seed: int, cid: int) -> int:
    """The seed of client ``cid``'s share: fixed for the run (the same samples every time it is computed)."""
    return int(run_seed) * 100_003 + int(cid) + 17


class FedMetaTrainer(Trainer):
    def _shared(self) -> torch.Tensor:
        d, c = self.job.data, self.cfg.section(FedMetaConfig)
        count = share_count(d.num_train, c.fraction) if c.epochs > 0 else 0
        return share_indices(d.num_train, count, share_seed(self.cfg.seed, self.job.cid))

    def run(self) -> TrainReply:
        if self.job.phase == SHARE_ACTION:
            return self.share_reply()
        return super().run()

    def share_reply(self) -> TrainReply:
        """The client's share (record ``fedmeta-share``) and no parameters: nothing is trained."""
        d, idx = self.job.data, self._shared()
        x = d.x_train.detach()[idx.to(d.x_train.device)].cpu().numpy().astype(np.float32)
        y = d.y_train.detach()[idx.to(d.y_train.device)].cpu().numpy().astype(np.int64)
        nan = float("nan")  # nothing was trained or evaluated (the local test split is not read)
        metrics: dict[str, float | int] = {
            "cid": self.job.cid, "num-examples": d.num_train, "train_loss": nan, "local-steps": 0,
            "local-accuracy": nan, "local-loss": nan, "global-model-local-accuracy": nan,
            "global-model-local-loss": nan}
        return TrainReply({}, metrics, {SHARE: params_to_record({"x": np.ascontiguousarray(x),
                                                                  "y": np.ascontiguousarray(y)})})

    def fit(self) -> TrainStats:
        if self.cfg.section(FedMetaConfig).local_data == "all":
            return super().fit()
        d = self.job.data
        keep = torch.ones(d.num_train, dtype=torch.bool)
        keep[self._shared()] = False
        keep = keep.to(d.x_train.device)
        return local_train(self.job.model, d.x_train[keep], d.y_train[keep], self.optim_config(), self.terms(),
                           generator=self.job.generator, forward=self.forward)
