"""FedUFO server (Zhang et al., ICCV 2021, seed 002; METHODS.md Sec. 3): dynamic sampling + prior relay.

A round with relay (stage one with UAD, or stage two with CGR):
    1. "train.prior" to the sampled group S_t: each member trains its prior w~_k from theta_t (CE only)
       and returns it with its class counts;
    2. relay: "train.posterior" to every member whose prior arrived, carrying theta_t, the priors of the
       OTHER members (records "fedufo.prior.<cid>", discriminator stripped) and the group record
       (member ids + class proportions p_j of Eq. 7). Each member receives every other member's prior
       exactly once: the downlink is theta_t twice plus K_c - 1 priors per client, i.e. about K_c + 1
       models instead of FedAvg's one (RoundOutcome.bytes_sent counts all of it);
    3. weighted average of the posterior models, the discriminator in model.extras included.
Members that fail in phase 1 are left out of the relay; members that fail in phase 2 are missing from
the average; the round retries with a new sample only below min-train-replies.
Rounds that need no relay (CGL only, the cross-device mode of Sec. 5; UAD against a frozen D in stage
two) are ordinary single-exchange rounds ("train").
Dynamic sampling (Sec. 3.3.2): the K_c/2 clients with the lowest last-known local accuracy plus K_c/2
drawn at random from the rest.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from flcore.config import ConfigError, RunConfig
from flcore.methods.fedufo import (COUNTS_KEY, DISC_PREFIX, GROUP_KEY, PRIOR_KEY, STAGE_KEY, FedUFOConfig,
                                   class_proportions, needs_relay, stage_of)
from flcore.records import params_to_record
from strategies.base import ClientUpdate, FLStrategy, Params, RoundFailed, RoundOutcome
from strategies.exchange import Failure, exchange

log = logging.getLogger("noniid_fl")


def dynamic_sample(ids: Sequence[int], accuracy: Mapping[int, float], size: int,
                   rng: np.random.Generator) -> list[int]:
    """FedUFO's group: the floor(size/2) clients with the lowest known accuracy (ties: lower id first),
    then the rest drawn uniformly without replacement from the remaining clients (clients with no known
    accuracy yet are only eligible for the random half)."""
    ids = sorted(int(c) for c in ids)
    size = min(int(size), len(ids))
    known = sorted((float(accuracy[c]), c) for c in ids if c in accuracy)
    worst = [c for _, c in known[: size // 2]]
    rest = [c for c in ids if c not in set(worst)]
    drawn = rng.choice(rest, size=size - len(worst), replace=False) if size > len(worst) else []
    return sorted(worst + [int(c) for c in drawn])


def strip_discriminator(params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A prior without D: the posterior only needs h_e and h of other members (Eqs. 1, 6)."""
    return {k: v for k, v in params.items() if not k.startswith(DISC_PREFIX)}


def relay_records(members: Sequence[int], priors: Mapping[int, Mapping[str, np.ndarray]],
                  counts: Mapping[int, Sequence[int]]) -> dict[int, dict[str, ArrayRecord | ConfigRecord]]:
    """The extra records of each member's posterior message.

    For member k: ``fedufo.prior.<j>`` for every other member j (never its own), and ``fedufo.group``
    with the member ids (sorted), the class proportions p_j (rows in the order of ``cids``, flattened)
    and the number of classes. Records are built once and shared between messages.
    """
    members = sorted(int(m) for m in members)
    if not members:
        return {}
    missing = [m for m in members if m not in priors or m not in counts]
    if missing:
        raise ValueError(f"relay: no prior or class counts for member(s) {missing}")
    table = np.asarray([list(counts[m]) for m in members], dtype=np.float64)
    props = class_proportions(table)
    group = ConfigRecord({"cids": members, "proportions": [float(v) for v in props.ravel()],
                          "num-classes": int(table.shape[1])})
    arrays = {m: params_to_record(strip_discriminator(priors[m])) for m in members}
    return {k: {**{f"{PRIOR_KEY}{j}": arrays[j] for j in members if j != k}, GROUP_KEY: group} for k in members}


def mean_method_metrics(updates: Sequence[ClientUpdate]) -> dict[str, float]:
    """Mean over the round's posterior replies of every numeric ``fedufo-*`` client metric
    (loss terms, discriminator accuracy, priors received, own priors retrained)."""
    sums: dict[str, list[float]] = {}
    for u in updates:
        for key, value in u.metrics.items():
            if key.startswith("fedufo-") and key != "fedufo-stage" and isinstance(value, (int, float)):
                sums.setdefault(key, []).append(float(value))
    return {f"mean-{k}": float(np.mean(v)) for k, v in sorted(sums.items())}


class FedUFOStrategy(FLStrategy):
    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.ufo = cfg.section(FedUFOConfig)
        self._info: dict[str, Any] = {}
        self._warned_size = False

    # ------------------------------------------------------------------ hooks
    def stage(self, server_round: int) -> int:
        return stage_of(server_round, self.cfg.num_server_rounds, self.ufo)

    def client_config(self, server_round: int, cid: int) -> dict[str, Any]:
        return {STAGE_KEY: self.stage(server_round)}

    def group_size(self) -> int:
        n = len(self.clients)
        return min(n, max(self.cfg.min_train_nodes, math.ceil(self.cfg.fraction_train * n)))

    def sample(self, server_round: int) -> list[int]:
        if not self.ufo.dynamic_sampling:
            return super().sample(server_round)
        return dynamic_sample(sorted(self.clients), self.client_accuracy, self.group_size(), self.rng)

    def collect_updates(self, server_round: int, replies, reference: Params,
                        phase: str = "train") -> tuple[list[ClientUpdate], list[Failure]]:
        updates, rejected = super().collect_updates(server_round, replies, reference, phase)
        metric = self.ufo.sampling_metric
        for u in updates:
            if metric in u.metrics:
                self.client_accuracy[u.cid] = float(u.metrics[metric])
        return updates, rejected

    def federated_evaluate(self, grid: Grid, server_round: int, params: Params):
        """Every client's accuracy of the new global model on its local test split is exactly the paper's
        "local performance": with the default sampling metric it refreshes the ranking for all clients."""
        per_client, failures = super().federated_evaluate(grid, server_round, params)
        if self.ufo.sampling_metric == "global-model-local-accuracy":
            for cid, metrics in per_client.items():
                if "accuracy" in metrics:
                    self.client_accuracy[int(cid)] = float(metrics["accuracy"])
        return per_client, failures

    def round_metrics(self) -> dict[str, Any]:
        return dict(self._info)

    # ------------------------------------------------------------------ the round
    def _check_ids(self) -> None:
        k = self.ufo.num_clients
        bad = sorted(c for c in self.clients if not 0 <= c < k)
        if bad:
            raise ConfigError(f"run-config key 'fedufo.num-clients' ({k}) must exceed every client id; "
                              f"client(s) {bad[:5]} are outside the discriminator's outputs")
        if len(self.clients) != k and not self._warned_size:
            self._warned_size = True
            log.warning("fedufo: %s clients registered but the discriminator has fedufo-num-clients=%s outputs",
                        len(self.clients), k)

    def _class_counts(self, update: ClientUpdate) -> list[int]:
        rec = update.records.get(COUNTS_KEY)
        if rec is not None:
            return [int(c) for c in dict(rec)["counts"]]
        return list(self.clients[update.cid].class_counts)

    def train_round(self, grid: Grid, server_round: int, params: Params) -> RoundOutcome:
        stage = self.stage(server_round)
        self._info = {"fedufo-stage": stage, "fedufo-relay": 0}
        self.refresh_clients(grid, server_round=server_round)
        self._check_ids()
        if needs_relay(stage, self.ufo):
            outcome = self._relay_round(grid, server_round, params)
        else:
            outcome = super().train_round(grid, server_round, params)
        self._info.update(mean_method_metrics(outcome.updates))
        return outcome

    def _relay_round(self, grid: Grid, server_round: int, params: Params) -> RoundOutcome:
        failures: list[Failure] = []
        sent = received = 0
        timeout = self.cfg.round_timeout
        for attempt in range(self.cfg.round_retries + 1):
            sampled = self.sample(server_round)
            sends = {cid: (self.clients[cid].node_id, self.train_content(server_round, cid, params)) for cid in sampled}
            res = exchange(grid, sends, "train.prior", timeout, server_round, poll=self.cfg.reply_poll_interval)
            priors, rejected = self.collect_updates(server_round, res.replies, params, phase="train.prior")
            failures += res.failures + rejected
            sent, received = sent + res.bytes_sent, received + res.bytes_received
            self._forget_lost(res)
            updates: list[ClientUpdate] = []
            if priors:
                members = [u.cid for u in priors]
                counts = {u.cid: self._class_counts(u) for u in priors}
                relay = relay_records(members, {u.cid: u.params for u in priors}, counts)
                sends = {}
                for cid in members:
                    content = self.train_content(server_round, cid, params)
                    for key, rec in relay[cid].items():
                        content[key] = rec
                    sends[cid] = (self.clients[cid].node_id, content)
                res = exchange(grid, sends, "train.posterior", timeout, server_round,
                               poll=self.cfg.reply_poll_interval)
                updates, rejected = self.collect_updates(server_round, res.replies, params, phase="train.posterior")
                failures += res.failures + rejected
                sent, received = sent + res.bytes_sent, received + res.bytes_received
                self._info.update({"fedufo-relay": 1, "fedufo-group-size": len(members),
                                   "fedufo-posterior-bytes-sent": res.bytes_sent})
                self._forget_lost(res)
            need = min(self.cfg.min_train_replies, len(sampled))
            if updates and len(updates) >= need:
                self._info["fedufo-priors"] = len(priors)
                return RoundOutcome(self.aggregate(server_round, params, updates), updates, sampled, failures,
                                    sent, received)
            log.warning("round %s attempt %s: %s prior(s), %s posterior(s), need %s", server_round, attempt + 1,
                        len(priors), len(updates), need)
            self.refresh_clients(grid, wait=False, server_round=server_round)
        reasons = "; ".join(f"client {f.cid}: {f.phase} {f.kind} ({f.reason})" for f in failures[-10:])
        raise RoundFailed(f"round {server_round}: fewer than min-train-replies={self.cfg.min_train_replies} "
                          f"usable posterior models after {self.cfg.round_retries + 1} attempt(s). Failures: {reasons}")
