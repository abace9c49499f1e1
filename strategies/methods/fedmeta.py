"""FedMeta as FedUFO's comparison row (flcore/methods/fedmeta.py), server side: FedAvg's average, then SGD on the
pooled meta set. Before a client's first round the server asks it once (``train.meta``) for its share of its
training split; a reply is checked by the reply schema (strategies/reply_schema.py, as every training reply) and
then against the registration (:func:`checked_share`); one that does not conform is left out, recorded as a
``rejected`` failure of that client and logged naming it, and the round goes on. A client that answered (valid or
not) is not asked again; one that did not answer (timeout, error, lost node) is asked at its next round. The
shares and who was asked are checkpointed, so a resumed run asks nobody again.

Nothing is shared, and the model is FedAvg's, when ``fedmeta.fraction`` or ``fedmeta.epochs`` is 0.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from flwr.serverapp import Grid
from torch import nn

from data_partitioning.datasets import dataset_shape
from flcore.config import RunConfig
from flcore.methods.fedmeta import META_LOSS, META_STEPS, POOL_SIZE, SHARE, SHARE_ACTION, FedMetaConfig, share_count
from flcore.records import load_params, model_params, record_to_params
from models import build_model
from strategies.aggregation import weighted_average
from strategies.base import ClientUpdate, FLStrategy, Params, RoundOutcome
from strategies.exchange import Failure

log = logging.getLogger("noniid_fl")

Share = tuple[np.ndarray, np.ndarray]


def checked_share(cid: int, record: Any, expected: int, input_shape: tuple[int, ...], num_classes: int) -> Share:
    """Client ``cid``'s meta share from its reply record: x float32 (expected, *input_shape), y int64 (expected,)
    with labels in [0, num_classes) and finite inputs; else a ValueError (a TypeError for another kind of record)
    naming the client and what is wrong."""
    where = f"client {cid}: record '{SHARE}'"
    if not isinstance(record, ArrayRecord):
        raise TypeError(f"{where} must be an ArrayRecord, got {type(record).__name__}")
    try:
        arrays = record_to_params(record)
    except Exception as exc:  # noqa: BLE001 - bytes a client sent that do not decode are a refused share
        raise ValueError(f"{where} does not decode: {exc!r:.120}") from None
    if set(arrays) != {"x", "y"}:
        raise ValueError(f"{where} must hold arrays 'x' and 'y', got {sorted(arrays)}")
    x, y = np.asarray(arrays["x"]), np.asarray(arrays["y"])
    if x.dtype != np.float32 or y.dtype != np.int64:
        raise ValueError(f"{where} has x {x.dtype} and y {y.dtype}; expected float32 inputs and int64 labels")
    if x.shape != (expected, *input_shape) or y.shape != (expected,):
        raise ValueError(f"{where} has x {x.shape} and y {y.shape}; expected {expected} samples of shape "
                         f"{tuple(input_shape)} (fedmeta.fraction of the registered training split)")
    if not np.isfinite(x).all():
        raise ValueError(f"{where} holds non-finite inputs")
    if y.size and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"{where} holds labels outside [0, {num_classes})")
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


def pooled(shares: Mapping[int, Share]) -> Share:
    """Every client's share stacked in client-id order: (x (m, ...), y (m,))."""
    order = sorted(shares)
    return np.concatenate([shares[c][0] for c in order]), np.concatenate([shares[c][1] for c in order])


def meta_update(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, max_steps: int, lr: float,
                batch_size: int, momentum: float, weight_decay: float, seed: int) -> tuple[int, float]:
    """SGD on mean CE(model(x_b), y_b) over (x, y) in place: ``epochs`` epochs of minibatches of ``batch_size``
    in an order drawn from ``seed`` (the last one partial), at most ``max_steps`` steps (0: no cap), a fresh
    optimizer (lr, momentum, weight decay). Returns (steps taken, mean minibatch loss; NaN without a step)."""
    n = int(x.shape[0])
    if epochs == 0 or n == 0:
        return 0, math.nan
    gen = torch.Generator().manual_seed(int(seed))
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr, momentum=momentum,
                          weight_decay=weight_decay)
    steps, total = 0, torch.zeros((), dtype=torch.float64, device=x.device)
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen).to(x.device)
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach().double()
            steps += 1
            if max_steps and steps >= max_steps:
                return steps, float(total) / steps
    return steps, float(total) / steps


def server_device(cfg: RunConfig) -> torch.device:
    """The server's device, as the round driver picks it for its model (server_app/runner.py)."""
    return torch.device("cuda" if cfg.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu")


class FedMetaStrategy(FLStrategy):
    """FedAvg, then the server's meta update of the aggregated model on the clients' shared samples."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.mcfg = cfg.section(FedMetaConfig)
        self.active = self.mcfg.fraction > 0 and self.mcfg.epochs > 0
        self.input_shape, self.num_classes = dataset_shape(cfg.dataset)
        self.shares: dict[int, Share] = {}
        self.asked: set[int] = set()  # clients that answered the request (their share kept or refused)
        self.device = server_device(cfg)
        self.model: nn.Module | None = None
        self._pool: tuple[torch.Tensor, torch.Tensor] | None = None  # the pool on the device (rebuilt on change)
        self._last: dict[str, Any] = {}

    # ------------------------------------------------------------------------------ sharing
    def expected_share(self, cid: int) -> int:
        """How many samples client ``cid`` is asked for: fedmeta.fraction of its registered training split."""
        return share_count(int(self.clients[cid].num_examples), self.mcfg.fraction)

    def train_round(self, grid: Grid, server_round: int, params: Params) -> RoundOutcome:
        """The share request to the registered clients not asked yet, then FedAvg's round (whose aggregation
        ends with the meta update)."""
        self.refresh_clients(grid, server_round=server_round)
        failures, sent, received = self.request_shares(grid, server_round, params)
        outcome = super().train_round(grid, server_round, params)
        outcome.failures = failures + outcome.failures
        outcome.bytes_sent += sent
        outcome.bytes_received += received
        return outcome

    def request_shares(self, grid: Grid, server_round: int, params: Params) -> tuple[list[Failure], int, int]:
        """Ask every registered client not asked yet (and with a share to give) for its share; keep the valid
        ones. Returns the exchange's failures and refusals, and its bytes sent and received."""
        if not self.active:
            return [], 0, 0
        missing = sorted(c for c in self.clients if c not in self.asked and self.expected_share(c) > 0)
        if not missing:
            return [], 0, 0
        res = self.driver.phase(grid, server_round, SHARE_ACTION,
                                {cid: self.train_content(server_round, cid, params) for cid in missing},
                                collect=False)  # replies are the clients' shares, not models
        failures = list(res.failures)
        for cid, reply in sorted(res.replies.items()):
            self.asked.add(cid)
            problem = self.checks.schema_problem(reply.content, cid)
            try:
                if problem is not None:
                    raise ValueError(f"client {cid}: malformed reply: {problem}")
                if SHARE not in reply.content:
                    raise ValueError(f"client {cid}: the reply to '{SHARE_ACTION}' has no record '{SHARE}'")
                self.shares[cid] = checked_share(cid, reply.content[SHARE], self.expected_share(cid),
                                                 self.input_shape, self.num_classes)
                self._pool = None
            except (ValueError, TypeError) as err:
                failures.append(Failure(cid, SHARE_ACTION, "rejected", str(err)))
                log.warning("round %s: FedMeta share left out: %s", server_round, err)
        return failures, res.bytes_sent, res.bytes_received

    # ------------------------------------------------------------------------------ the meta update
    def pool(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The pooled shares (client-id order) as tensors on the server's device."""
        if self._pool is None:
            x, y = pooled(self.shares)
            self._pool = (torch.as_tensor(x, device=self.device), torch.as_tensor(y, device=self.device))
        return self._pool

    def server_model(self) -> nn.Module:
        """The model the meta update trains (built once; the global RNG left as it was)."""
        if self.model is None:
            with torch.random.fork_rng(devices=[]):
                self.model = build_model(self.cfg, self.input_shape, self.num_classes).to(self.device)
        return self.model

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        avg = weighted_average([u.params for u in updates], [u.num_examples for u in updates])
        if not self.active or not self.shares:
            self._last = {META_STEPS: 0}
            return avg
        model, (x, y) = self.server_model(), self.pool()
        load_params(model, avg)
        c, cfg = self.mcfg, self.cfg
        steps, loss = meta_update(model, x, y, c.epochs, c.steps, c.meta_lr(cfg.lr), c.meta_batch(cfg.batch_size),
                                  cfg.momentum, cfg.weight_decay, seed=cfg.seed * 1_000_003 + server_round)
        self._last = {META_STEPS: steps, **({META_LOSS: loss} if steps else {})}
        return OrderedDict(model_params(model))

    def round_metrics(self) -> dict[str, Any]:
        return {POOL_SIZE: int(sum(y.shape[0] for _, y in self.shares.values())), **self._last}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["fedmeta"] = {"shares": {str(c): {"x": x.copy(), "y": y.copy()} for c, (x, y) in self.shares.items()},
                            "asked": sorted(self.asked)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        saved = state["fedmeta"]
        self.shares = {int(c): (np.asarray(v["x"]), np.asarray(v["y"])) for c, v in saved["shares"].items()}
        self.asked = {int(c) for c in saved["asked"]}
        self._pool = None
