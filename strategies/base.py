"""The strategy base every method extends (FL-bench style: override a few small hooks).

Server-side per-client state is keyed by the client's *stable id* (its partition id or node-config
``client-id``), never by Flower's node id, which is random and changes when a node re-registers. Clients
announce their id, data size and class counts in a ``query`` exchange (:meth:`FLStrategy.refresh_clients`).

Hooks for methods:
    client_config(rnd, cid)   -> per-client scalars in that client's message (FedBC's lambda_k, gamma_k)
    client_records(rnd, cid)  -> per-client extra records (SCAFFOLD's c, ETF memory vectors)
    aggregate(rnd, params, updates) -> new global params (FedAvg's weighted mean by default)
    sample(rnd)               -> client ids for the round (FedUFO's dynamic sampling)
    train_round(grid, rnd, params) -> the whole round (FedUFO's prior/relay/posterior phases)
    state_dict() / load_state_dict() -> everything needed to resume (extend with super())
    round_metrics()           -> method scalars logged in results.json every round
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from flcore.config import RunConfig
from flcore.records import config_to_record, params_to_record, record_to_params
from strategies.aggregation import weighted_average
from strategies.exchange import ExchangeResult, Failure, exchange
from strategies.validation import update_problem

log = logging.getLogger("noniid_fl")

Params = "OrderedDict[str, np.ndarray]"


@dataclass
class ClientInfo:
    cid: int
    node_id: int
    num_examples: int
    class_counts: list[int]


@dataclass
class ClientUpdate:
    cid: int
    params: "OrderedDict[str, np.ndarray]"
    num_examples: int
    metrics: dict[str, Any]
    records: dict[str, Any]


@dataclass
class RoundOutcome:
    params: "OrderedDict[str, np.ndarray]"
    updates: list[ClientUpdate]
    sampled: list[int]
    failures: list[Failure] = field(default_factory=list)
    bytes_sent: int = 0
    bytes_received: int = 0


class RoundFailed(RuntimeError):
    """Too few usable client updates in a round, after the configured retries."""


class FLStrategy(Strategy):
    """FedAvg over the Message API with seeded sampling, validation, failures and checkpointable state."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.clients: dict[int, ClientInfo] = {}
        self.rng = np.random.default_rng(cfg.seed)
        self.client_accuracy: dict[int, float] = {}  # last local accuracy each client reported
        # nodes whose registration failed: node id -> (failed attempts, first round to ask again)
        self.register_backoff: dict[int, tuple[int, int]] = {}
        self.register_failures: list[Failure] = []  # not yet reported in a round's results (drained)

    # ============================================================================ hooks for methods
    def client_config(self, server_round: int, cid: int) -> dict[str, Any]:
        return {}

    def client_records(self, server_round: int, cid: int) -> dict[str, ArrayRecord | ConfigRecord]:
        return {}

    def aggregate(self, server_round: int, params: Params, updates: list[ClientUpdate]) -> Params:
        """FedAvg: sample-size weighted mean of the client models."""
        return weighted_average([u.params for u in updates], [u.num_examples for u in updates])

    def round_metrics(self) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "client_accuracy": dict(self.client_accuracy)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.client_accuracy = {int(k): float(v) for k, v in state["client_accuracy"].items()}

    def sample(self, server_round: int) -> list[int]:
        """ceil(fraction-train * N) clients (at least min-train-nodes), uniformly without replacement."""
        ids = sorted(self.clients)
        n = min(len(ids), max(self.cfg.min_train_nodes, math.ceil(self.cfg.fraction_train * len(ids))))
        return sorted(int(c) for c in self.rng.choice(ids, size=n, replace=False))

    # ============================================================================ client registry
    def refresh_clients(self, grid: Grid, wait: bool = True, server_round: int = 0) -> None:
        """Ask every node we do not know yet for its stable client id, data size and class counts.

        A node whose registration fails (its ClientApp raised, e.g. on a bad partition-id; no answer; lost)
        is recorded in ``register_failures`` and asked again only after 1, 2, 4, ... rounds (at most 64), so
        a broken or hung node does not cost a registration exchange - up to round-timeout - every round.
        """
        deadline = time.time() + self.cfg.round_timeout
        while True:
            node_ids = [int(n) for n in grid.get_node_ids()]
            known = {info.node_id for info in self.clients.values()}
            new = [n for n in node_ids if n not in known
                   and self.register_backoff.get(n, (0, 0))[1] <= server_round]
            if new:
                sends = {-(i + 1): (n, self._base_content(0)) for i, n in enumerate(new)}
                res = exchange(grid, sends, "query", self.cfg.round_timeout, server_round, phase="register",
                               poll=self.cfg.reply_poll_interval)
                self._note_register_failures(res, {key: n for key, (n, _) in sends.items()}, server_round)
                errors = [f for f in res.failures if f.kind == "error"]
                if errors and len(self.clients) + len(res.replies) < max(self.cfg.min_train_nodes, 1):
                    raise RoundFailed("client registration failed on %d node(s): %s" % (
                        len(errors), "; ".join(f.reason for f in errors[:3])))
                for reply in res.replies.values():
                    info = reply.content["info"]
                    cid = int(info["cid"])
                    node = int(reply.metadata.src_node_id)
                    self.clients[cid] = ClientInfo(cid, node, int(info["num-examples"]), list(info["class-counts"]))
                    self.register_backoff.pop(node, None)
            if not wait or len(self.clients) >= max(self.cfg.min_train_nodes, 1):
                return
            if time.time() > deadline:
                raise RoundFailed(
                    f"only {len(self.clients)} client(s) registered within round-timeout={self.cfg.round_timeout}s; "
                    f"min-train-nodes={self.cfg.min_train_nodes}")
            time.sleep(1.0)

    def _note_register_failures(self, res: ExchangeResult, node_of: dict[int, int], server_round: int) -> None:
        for f in res.failures:
            node = node_of[f.cid]
            tries = self.register_backoff.get(node, (0, 0))[0] + 1
            retry = server_round + 2 ** min(tries - 1, 6)
            self.register_backoff[node] = (tries, retry)
            self.register_failures.append(Failure(
                -1, "register", f.kind, f"node {node}: {f.reason} (attempt {tries}; asked again in round {retry})"))

    def drain_register_failures(self) -> list[Failure]:
        """Registration failures since the last call (the round driver puts them in the round's results)."""
        out, self.register_failures = self.register_failures, []
        return out

    def forget_node(self, cid: int) -> None:
        """Drop the node behind ``cid`` so it re-registers (possibly under a new node id)."""
        self.clients.pop(cid, None)

    # ============================================================================ messages
    def _base_content(self, server_round: int) -> RecordDict:
        memo = getattr(self, "_run_config_memo", None)
        if memo is None or memo[0] is not self.cfg:
            memo = self._run_config_memo = (self.cfg, config_to_record(self.cfg.to_dict()))
        return RecordDict({"run_config": memo[1]})

    def params_record(self, params: Params) -> ArrayRecord:
        """The ArrayRecord of ``params``, built once and shared by every message of an exchange that carries
        the same parameters (records in outgoing messages are only read). Without it, an exchange with N
        clients held N serialized copies of the model at once (federated evaluation of 1000 clients:
        ~1 GiB for a 1 MiB model)."""
        memo = getattr(self, "_params_record_memo", None)
        values = list(params.values())
        if (memo is not None and memo[0] is params and len(memo[1]) == len(values)
                and all(a is b for a, b in zip(memo[1], values))):
            return memo[2]
        record = params_to_record(params)
        self._params_record_memo = (params, values, record)
        return record

    def train_content(self, server_round: int, cid: int, params: Params,
                      message_config: dict[str, Any] | None = None) -> RecordDict:
        content = self._base_content(server_round)
        content["arrays"] = self.params_record(params)
        values = {"server-round": server_round, "cid": cid, **self.client_config(server_round, cid)}
        values.update(message_config or {})
        content["config"] = config_to_record(values)
        for key, rec in self.client_records(server_round, cid).items():
            content[key] = rec
        return content

    def collect_updates(self, server_round: int, replies: dict[int, Message], reference: Params,
                        phase: str = "train") -> tuple[list[ClientUpdate], list[Failure]]:
        """Turn replies into updates; reject malformed or absurd ones (named in the log and results)."""
        updates, rejected = [], []
        for cid in sorted(replies):
            content = replies[cid].content
            try:
                params = record_to_params(content["arrays"])
                metrics = dict(content["metrics"])
                num = int(metrics["num-examples"])
            except Exception as exc:  # noqa: BLE001 - anything malformed is a rejected update
                rejected.append(Failure(cid, phase, "rejected", f"malformed reply: {exc!r}"))
                continue
            problem = update_problem(params, reference, self.cfg.max_update_norm)
            if problem is None and num <= 0:
                problem = f"num-examples must be positive, got {num}"
            if problem is not None:
                rejected.append(Failure(cid, phase, "rejected", problem))
                log.warning("round %s: update of client %s rejected: %s", server_round, cid, problem)
                continue
            records = {k: v for k, v in content.items() if k not in ("arrays", "metrics")}
            if "local-accuracy" in metrics:
                self.client_accuracy[cid] = float(metrics["local-accuracy"])
            updates.append(ClientUpdate(cid, params, num, metrics, records))
        return updates, rejected

    # ============================================================================ one round
    def train_round(self, grid: Grid, server_round: int, params: Params) -> RoundOutcome:
        """Sample, send, collect, validate, aggregate; retry with a new sample if too few updates arrive."""
        self.refresh_clients(grid, server_round=server_round)
        failures: list[Failure] = []
        sent = received = 0
        for attempt in range(self.cfg.round_retries + 1):
            sampled = self.sample(server_round)
            sends = {cid: (self.clients[cid].node_id, self.train_content(server_round, cid, params))
                     for cid in sampled}
            res = exchange(grid, sends, "train", self.cfg.round_timeout, server_round,
                           poll=self.cfg.reply_poll_interval)
            updates, rejected = self.collect_updates(server_round, res.replies, params)
            failures += res.failures + rejected
            sent += res.bytes_sent
            received += res.bytes_received
            self._forget_lost(res)
            need = min(self.cfg.min_train_replies, len(sampled))
            if len(updates) >= need and updates:
                new_params = self.aggregate(server_round, params, updates)
                return RoundOutcome(new_params, updates, sampled, failures, sent, received)
            log.warning("round %s attempt %s: %s usable update(s), need %s", server_round, attempt + 1,
                        len(updates), need)
            self.refresh_clients(grid, wait=False, server_round=server_round)
        reasons = "; ".join(f"client {f.cid}: {f.kind} ({f.reason})" for f in failures[-10:])
        raise RoundFailed(f"round {server_round}: fewer than min-train-replies={self.cfg.min_train_replies} "
                          f"usable updates after {self.cfg.round_retries + 1} attempt(s). Failures: {reasons}")

    def _forget_lost(self, res: ExchangeResult) -> None:
        for f in res.failures:
            if f.kind == "node-lost":
                self.forget_node(f.cid)

    def federated_eval_cids(self) -> list[int]:
        """The clients a federated evaluation asks: every registered client, or with
        ``federated-eval-clients = M`` > 0 a fixed, seeded sample of M of them (the same clients at every
        evaluation while they stay registered; independent of the training sampler's random stream).
        Flower's simulation engine costs O(N x pending messages) CPU per 0.1 s poll while an exchange with
        N clients is in flight, so evaluating all of 1000 clients costs tens of CPU seconds."""
        ids = sorted(self.clients)
        m = self.cfg.federated_eval_clients
        if m == 0 or m >= len(ids):
            return ids
        # a seeded pseudo-random rank per client id, independent of the other ids: stable as clients come and go
        rank = {c: int(np.random.SeedSequence([self.cfg.seed, 0xFEDE7A1, c]).generate_state(1)[0]) for c in ids}
        return sorted(sorted(ids, key=lambda c: (rank[c], c))[:m])

    def federated_evaluate(self, grid: Grid, server_round: int, params: Params) -> tuple[dict[int, dict], list[Failure]]:
        """The global model (and each client's last local model) on the local test split of every registered
        client, or of ``federated-eval-clients`` of them (:meth:`federated_eval_cids`)."""
        sends = {}
        for cid in self.federated_eval_cids():
            info = self.clients[cid]
            content = self._base_content(server_round)
            content["arrays"] = self.params_record(params)
            content["config"] = config_to_record({"server-round": server_round, "cid": cid})
            sends[cid] = (info.node_id, content)
        res = exchange(grid, sends, "evaluate", self.cfg.round_timeout, server_round, phase="evaluate",
                       poll=self.cfg.reply_poll_interval)
        self._forget_lost(res)
        return {cid: dict(r.content["metrics"]) for cid, r in res.replies.items()}, res.failures

    # ============================================================================ Flower Strategy API
    # The round driver (server_app/runner.py) calls train_round(); these keep the class a complete
    # flwr Strategy, usable with Strategy.start() for single-exchange methods (no retries there).
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.refresh_clients(grid, server_round=server_round)
        self._round_params = record_to_params(arrays)
        return [Message(self.train_content(server_round, cid, self._round_params, dict(config)),
                        dst_node_id=self.clients[cid].node_id, message_type="train")
                for cid in self.sample(server_round)]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        node_to_cid = {info.node_id: cid for cid, info in self.clients.items()}
        ok = {node_to_cid[r.metadata.src_node_id]: r for r in replies
              if not r.has_error() and r.metadata.src_node_id in node_to_cid}
        updates, _ = self.collect_updates(server_round, ok, self._round_params)
        if not updates:
            return None, None
        new = self.aggregate(server_round, self._round_params, updates)
        total = sum(u.num_examples for u in updates)
        loss = sum(float(u.metrics.get("train_loss", 0.0)) * u.num_examples for u in updates) / total
        return params_to_record(new), MetricRecord({"train_loss": loss, "num-updates": len(updates)})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        log.info("%s: %s", type(self).__name__, {k: v for k, v in self.cfg.to_dict().items()
                                                  if k in ("method", "dataset", "partition", "num-server-rounds")})
