"""FedUFO server (Zhang et al., ICCV 2021, seed 002; docs/METHODS.md, FedUFO): dynamic sampling + prior relay.

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
Dynamic sampling (Sec. 3.3.2): the K_c/2 clients with the lowest last-known "local performance" plus K_c/2
drawn at random from the rest; by default the performance is theta_t's accuracy on the client's training data,
which each sampled client reports at the start of its round (no local test split needed).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from flcore.config import ConfigError, RunConfig
from flcore.methods.fedufo import (CLIENTS_KEY, COUNTS_KEY, DISC_PREFIX, GLOBAL_TRAIN_ACCURACY, GROUP_KEY, PRIOR_KEY,
                                   SAMPLING_METRICS, STAGE_KEY, FedUFOConfig, needs_relay)
from flcore.records import params_to_record
from strategies.base import ClientUpdate, FLStrategy, Params, RoundOutcome
from strategies.exchange import Failure
from strategies.round_driver import Attempt

log = logging.getLogger("noniid_fl")


def stage_of(server_round: int, num_rounds: int, ufo: FedUFOConfig) -> int:
    """1 for the first round(fraction * num_rounds) rounds when UAD is on (paper Sec. 3.4), else 2."""
    if "uad" not in ufo.losses:
        return 2
    stage_one_rounds = int(math.floor(ufo.stage_one_fraction * num_rounds + 0.5))
    return 1 if server_round <= stage_one_rounds else 2


def class_proportions(counts: np.ndarray) -> np.ndarray:
    """p_j of paper Eq. 7: p_j[c] = n_{j,c} / sum_{i in S_t} n_{i,c} (share of class c held by member j).

    ``counts`` is (J, C) with the class counts of the J group members. Every column of the result sums
    to 1. A class nobody in the group holds (column sum 0) gets p_j[c] = 1/J (plain average): the
    paper leaves 0/0 undefined and no member's prior has evidence for that class either way.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[0] == 0:
        raise ValueError(f"class counts must be (members, classes) with at least one member, got {counts.shape}")
    if np.any(counts < 0) or not np.all(np.isfinite(counts)):
        raise ValueError("class counts must be finite and non-negative")
    totals = counts.sum(axis=0, keepdims=True)
    uniform = np.full_like(counts, 1.0 / counts.shape[0])
    return np.where(totals > 0, counts / np.where(totals > 0, totals, 1.0), uniform)


def worst_half(ids: Sequence[int], accuracy: Mapping[int, float], size: int) -> list[int]:
    """The floor(size/2) clients of ``ids`` with the lowest known finite accuracy (ties: lower id first)."""
    known = sorted((float(accuracy[c]), int(c)) for c in ids if c in accuracy and math.isfinite(float(accuracy[c])))
    return [c for _, c in known[: int(size) // 2]]


def dynamic_sample(ids: Sequence[int], accuracy: Mapping[int, float], size: int,
                   rng: np.random.Generator) -> list[int]:
    """FedUFO's group: the floor(size/2) clients with the lowest known accuracy (ties: lower id first),
    then the rest drawn uniformly without replacement from the remaining clients (clients with no known,
    or a non-finite, accuracy are only eligible for the random half)."""
    ids = sorted(int(c) for c in ids)
    size = min(int(size), len(ids))
    worst = worst_half(ids, accuracy, size)
    rest = [c for c in ids if c not in set(worst)]
    drawn: np.ndarray | list[int] = rng.choice(rest, size=size - len(worst), replace=False) if size > len(worst) else []
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
        """The stage, and with UAD the registered client ids: D's outputs that enter Eqs. 4-5 (K in the paper
        is the number of clients; outputs of ids no client holds would never be a label)."""
        out: dict[str, Any] = {STAGE_KEY: self.stage(server_round)}
        if "uad" in self.ufo.losses:
            out[CLIENTS_KEY] = sorted(int(c) for c in self.clients)
        return out

    def group_size(self) -> int:
        """K_c = ceil(fraction-train * N) over the N eligible clients (registered, not evicted), as the base samples."""
        n = len(self.registry.eligible())
        return min(n, max(self.cfg.min_train_nodes, math.ceil(self.cfg.fraction_train * n)))

    def sample(self, server_round: int) -> list[int]:
        if not self.ufo.dynamic_sampling:
            return super().sample(server_round)
        ids, size = self.registry.eligible(), self.group_size()  # an evicted (silent) client is never sampled
        worst = worst_half(ids, self.client_accuracy, min(size, len(ids)))
        ranked = worst_half(ids, self.client_accuracy, 2 * len(ids))  # every client with a finite value
        self._info.update({"fedufo-ranked-clients": len(ranked), "fedufo-worst-half": len(worst)})
        if worst:  # mean ranking value of the deliberately chosen half, and of all ranked clients
            self._info["fedufo-worst-half-accuracy"] = float(np.mean([self.client_accuracy[c] for c in worst]))
            self._info["fedufo-ranked-accuracy"] = float(np.mean([self.client_accuracy[c] for c in ranked]))
        return dynamic_sample(ids, self.client_accuracy, size, self.rng)

    def collect_updates(self, server_round: int, replies, reference: Params,
                        phase: str = "train") -> tuple[list[ClientUpdate], list[Failure]]:
        """The base updates; the ranking of dynamic sampling keeps only ``fedufo.sampling-metric``'s value
        (finite values: a client without a local test split reports NaN for the split's metrics)."""
        ranking = dict(self.client_accuracy)
        updates, rejected = super().collect_updates(server_round, replies, reference, phase)
        metric = SAMPLING_METRICS[self.ufo.sampling_metric][0]
        for u in updates:
            value = u.metrics.get(metric)
            if isinstance(value, (int, float)) and math.isfinite(float(value)):
                ranking[u.cid] = float(value)
        self.client_accuracy = ranking
        return updates, rejected

    def federated_evaluate(self, grid: Grid, server_round: int, params: Params):
        """Every client's accuracy of the new global model on its local test split: with sampling metric
        'global-model-local-accuracy' it refreshes the ranking of all clients."""
        per_client, failures = super().federated_evaluate(grid, server_round, params)
        if self.ufo.sampling_metric == "global-model-local-accuracy":
            for cid, metrics in per_client.items():
                value = metrics.get("accuracy")
                if isinstance(value, (int, float)) and math.isfinite(float(value)):
                    self.client_accuracy[int(cid)] = float(value)
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
            log.info("fedufo: %s clients registered, the discriminator has fedufo.num-clients=%s outputs; Eqs. 4-5 "
                     "use the registered clients' outputs only", len(self.clients), k)

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
        if "uad" in self.ufo.losses:
            self._info["fedufo-disc-outputs"] = len(self.clients)
        if needs_relay(stage, self.ufo):
            outcome = self._relay_round(grid, server_round, params)
        else:
            outcome = super().train_round(grid, server_round, params)
        self._info.update(mean_method_metrics(outcome.updates))
        return outcome

    def _relay_round(self, grid: Grid, server_round: int, params: Params) -> RoundOutcome:
        """Two phases on the round primitive (strategies/round_driver.py), retried together: the sampled group
        trains its priors; every member that sent one gets the others' priors relayed and trains its
        posterior, which is aggregated."""
        driver = self.driver

        def attempt(_: int) -> Attempt:
            sampled = self.sample(server_round)
            a = Attempt(sampled, [])
            priors = a.add(driver.phase(grid, server_round, "train.prior",
                                        {cid: self.train_content(server_round, cid, params) for cid in sampled},
                                        params)).updates
            self._info.update({k: v for k, v in mean_method_metrics(priors).items()
                               if k == f"mean-{GLOBAL_TRAIN_ACCURACY}"})
            if not priors:
                return a
            members = [u.cid for u in priors]
            counts = {u.cid: self._class_counts(u) for u in priors}
            relay = relay_records(members, {u.cid: u.params for u in priors}, counts)
            contents = {}
            for cid in members:
                content = self.train_content(server_round, cid, params)
                for key, rec in relay[cid].items():
                    content[key] = rec
                contents[cid] = content
            posterior = a.add(driver.phase(grid, server_round, "train.posterior", contents, params))
            a.updates = posterior.updates
            self._info.update({"fedufo-relay": 1, "fedufo-group-size": len(members),
                               "fedufo-posterior-bytes-sent": posterior.bytes_sent, "fedufo-priors": len(priors)})
            return a

        return driver.with_retries(grid, server_round, params, attempt, what="usable posterior models")
