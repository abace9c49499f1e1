"""The server's client registry: which clients exist, and which are asked in a round.

A part of the strategy (strategies/base.py composes it as ``strategy.registry``): it owns the registered
clients, the back-off of nodes whose registration failed, the registration failures not yet reported, the
seeded sampler's random stream and the last local accuracy each client reported; it is given the run config
and the content of a registration message (a callable), and talks to the nodes only through
:func:`strategies.exchange.exchange`.

Clients are keyed by their *stable id* (partition id or node-config ``client-id``), never by Flower's node
id, which is random and changes when a node re-registers. Nodes announce id, data size and class counts in a
``query`` exchange; a failed registration is retried with back-off. Sampling is seeded.

Who may hold an id: with node bindings (``NODE_BINDINGS``, flcore/node_bindings.py: the operator bound
each registered node key, i.e. its node id, to one client id) a node is accepted only under the id its key
owns; any other claim is refused and recorded (kind ``identity-mismatch``), whoever came first, and the
owner takes its id even when another node held it. Without bindings a second node claiming an id that a
live node already holds is refused (``duplicate-id``; the first keeps its slot and its state).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from flwr.app import RecordDict
from flwr.serverapp import Grid

from flcore import node_bindings
from flcore.config import RunConfig
from strategies.exchange import ExchangeResult, Failure, exchange
from strategies.reply_schema import RegistrationInfo, parse_info

log = logging.getLogger("noniid_fl")


class RoundFailed(RuntimeError):
    """Too few usable client updates in a round (or too few clients registered), after the retries."""


@dataclass
class ClientInfo:
    cid: int
    node_id: int
    num_examples: int
    class_counts: list[int]



class ClientRegistry:
    """Which clients exist (``clients``: stable id -> :class:`ClientInfo`), registration, seeded sampling."""

    def __init__(self, cfg: RunConfig, query: Callable[[], RecordDict]) -> None:
        self.cfg = cfg
        self.query = query  # the content of a registration ("query") message
        self.clients: dict[int, ClientInfo] = {}
        self.rng = np.random.default_rng(cfg.seed)  # the sampler's stream (checkpointed)
        self.accuracy: dict[int, float] = {}  # last local accuracy each client reported
        self.local_models: dict[int, float] = {}  # P-FL over all devices: see note_local_models
        self.backoff: dict[int, tuple[int, int]] = {}  # failed node id -> (failed attempts, first round to ask again)
        self.away: set[int] = set()           # backed-off nodes seen gone from the SuperLink's node list since
        self.claims: dict[int, int] = {}      # node refused as duplicate-id -> the client id it claimed
        self.failures: list[Failure] = []  # registration failures not yet reported in a round's results
        self.timeouts: dict[int, int] = {}  # cid -> consecutive exchanges it did not answer in time
        self.evicted: dict[int, tuple[int, int]] = {}  # cid -> (unanswered probes, first round to probe it again)
        # (file stamp, node -> owned id, client id -> declared training-set size)
        self._bindings: tuple[tuple[str, int, int], dict[int, int], dict[int, int]] | None = None

    # ------------------------------------------------------------------------------ sampling
    def sample(self) -> list[int]:
        """ceil(fraction-train * N) clients (at least min-train-nodes), uniformly without replacement, from
        the seeded stream ``rng``."""
        ids = self.eligible()
        if not ids:
            return []
        n = min(len(ids), max(self.cfg.min_train_nodes, math.ceil(self.cfg.fraction_train * len(ids))))
        return sorted(int(c) for c in self.rng.choice(ids, size=n, replace=False))

    def eligible(self) -> list[int]:
        """The registered clients that may be asked: all but the evicted (silent) ones."""
        return sorted(c for c in self.clients if c not in self.evicted)

    def eval_cids(self) -> list[int]:
        """The clients a federated evaluation asks: every registered client, or with
        ``federated-eval-clients = M`` > 0 a fixed, seeded sample of M of them (the same clients at every
        evaluation while they stay registered; independent of the training sampler's random stream).
        Flower's simulation engine costs O(N x pending messages) CPU per 0.1 s poll while an exchange with
        N clients is in flight, so evaluating all of 1000 clients costs tens of CPU seconds."""
        ids = self.eligible()
        m = self.cfg.federated_eval_clients
        if m == 0 or m >= len(ids):
            return ids
        # a seeded pseudo-random rank per client id, independent of the other ids: stable as clients come and go
        rank = {c: int(np.random.SeedSequence([self.cfg.seed, 0xFEDE7A1, c]).generate_state(1)[0]) for c in ids}
        return sorted(sorted(ids, key=lambda c: (rank[c], c))[:m])

    def registered_samples(self, cid: int) -> int | None:
        """The training samples ``cid`` registered with (its replies must report the same), or None."""
        info = self.clients.get(cid)
        return info.num_examples if info is not None else None

    def weight_samples(self, cid: int) -> int | None:
        """The training samples aggregation weights and the update screen use for ``cid``, or None.

        Without node bindings (simulation: the server's own partition) the registered claim. With bindings (a
        deployment, where a claim is unverified): the claim, which may not exceed the size the operator declared
        in the bindings table (a larger claim is refused at registration); for a client declared without a size,
        the claim capped at ``examples-cap-ratio`` x the median claim of the registered clients, so that no
        single node outweighs the others by what it says about itself."""
        return self._capped(cid, self.cfg.examples_cap_ratio)

    def screen_samples(self, cid: int) -> int | None:
        """The training samples the update screen scales ``cid``'s limit by (update-norm-scale='local-steps'), or
        None: as :meth:`weight_samples`, except that under node bindings an undeclared claim is capped at the
        median claim: an unverified count never widens the screen beyond the median client's."""
        return self._capped(cid, 1.0)

    def _capped(self, cid: int, ratio: float) -> int | None:
        info = self.clients.get(cid)
        if info is None or self._bindings is None or cid in self._bindings[2]:
            return info.num_examples if info is not None else None
        median = float(np.median([c.num_examples for c in self.clients.values()]))
        return min(info.num_examples, max(1, int(ratio * median)))

    def note_accuracy(self, updates: list[Any]) -> None:
        """Remember the ``local-accuracy`` metric of each update that reports one (FedUFO ranks by it)."""
        for u in updates:
            if "local-accuracy" in u.metrics:
                self.accuracy[u.cid] = float(u.metrics["local-accuracy"])

    def note_local_models(self, updates: list[Any]) -> None:
        """Remember, per client, its last local model's accuracy on its own local test split: the finite
        ``local-accuracy`` of each update a round aggregated (a client without a local test split reports NaN
        and is not entered). Unlike ``accuracy`` no method rewrites this table."""
        for u in updates:
            value = u.metrics.get("local-accuracy")
            if value is not None and math.isfinite(float(value)):
                self.local_models[u.cid] = float(value)

    def all_devices_local_accuracy(self) -> dict[str, Any]:
        """P-FL as "each device's local model ... on its own test data, averaged across all devices": the mean,
        over the registered clients that have a local model, of that model's accuracy (each device counts once,
        whatever its test size). A device never sampled (or without a local test split) has no local model and
        is left out; ``local_accuracy_all_devices_n`` says how many of the ``num_registered`` devices counted.
        ``local_accuracy_all_devices`` is None while none has one."""
        values = [self.local_models[c] for c in sorted(self.clients) if c in self.local_models]
        return {"local_accuracy_all_devices": float(np.mean(values)) if values else None,
                "local_accuracy_all_devices_n": len(values), "num_registered": len(self.clients)}

    # ------------------------------------------------------------------------------ registration
    def refresh(self, grid: Grid, wait: bool = True, server_round: int = 0) -> None:
        """Ask every node we do not know yet for its stable client id, data size and class counts.

        A node whose registration fails (its ClientApp raised, e.g. on a bad partition-id; no answer; lost)
        is recorded in ``failures`` and asked again only after 1, 2, 4, ... rounds (at most 64), so a broken
        or hung node does not cost a registration exchange - up to round-timeout - every round; a back-off ends
        early once its reason is gone (:meth:`_clear_stale_backoff`; a node answered as node-lost is asked again
        as soon as the SuperLink lists it, :meth:`_note_failed`).
        """
        self._probe(grid, server_round)
        deadline = time.time() + self.cfg.round_timeout
        while True:
            bound = self._node_owners()
            node_ids = [int(n) for n in grid.get_node_ids()]
            self._clear_stale_backoff(node_ids)
            known = {info.node_id for info in self.clients.values()}
            new = [n for n in node_ids if n not in known and self.backoff.get(n, (0, 0))[1] <= server_round]
            if new:
                sends = {i - len(new): (n, self.query()) for i, n in enumerate(new)}  # node order
                res = exchange(grid, sends, "query", self.cfg.round_timeout, server_round, phase="register",
                               poll=self.cfg.reply_poll_interval)
                self._note_failed(res, {key: n for key, (n, _) in sends.items()}, server_round)
                errors = [f for f in res.failures if f.kind == "error"]
                if errors and len(self.clients) + len(res.replies) < max(self.cfg.min_train_nodes, 1):
                    raise RoundFailed("client registration failed on %d node(s): %s" % (
                        len(errors), "; ".join(f.reason for f in errors[:3])))
                for reply in res.replies.values():
                    node = int(reply.metadata.src_node_id)
                    info = parse_info(reply.content.get("info"))
                    if isinstance(info, str):
                        self._refuse_malformed(node, info, server_round)
                        continue
                    cid = info.cid
                    if bound is not None and bound.get(node) != cid:
                        self._refuse_identity(cid, node, bound.get(node), server_round)
                        continue
                    holder = self.clients.get(cid)
                    if holder is not None and holder.node_id != node and holder.node_id in node_ids:
                        self._refuse_duplicate(cid, node, holder.node_id, server_round)
                        continue
                    declared = self._bindings[2].get(cid) if bound is not None and self._bindings else None
                    if declared is not None and info.num_examples > declared:
                        self._refuse_size(cid, node, info.num_examples, declared, server_round)
                        continue
                    self.clients[cid] = ClientInfo(cid, node, info.num_examples, info.class_counts)
                    self.backoff.pop(node, None)
                    self.away.discard(node)
                    self.claims.pop(node, None)
            if not wait or len(self.clients) >= max(self.cfg.min_train_nodes, 1):
                return
            if time.time() > deadline:
                raise RoundFailed(
                    f"only {len(self.clients)} client(s) registered within round-timeout={self.cfg.round_timeout}s; "
                    f"min-train-nodes={self.cfg.min_train_nodes}")
            time.sleep(1.0)

    def drain_failures(self) -> list[Failure]:
        """Registration failures since the last call (they go into the round's results)."""
        out, self.failures = self.failures, []
        return out

    def forget(self, cid: int) -> None:
        """Drop the node behind ``cid`` so it re-registers (possibly under a new node id)."""
        self.clients.pop(cid, None)

    def forget_lost(self, res: ExchangeResult) -> None:
        """After an exchange ``res`` (every round's, each phase's): forget every client whose node it reports lost,
        and count who did not answer in time. A reply, even a rejected one, shows the client is alive; after
        ``evict-after-timeouts`` timeouts in a row a client is evicted: not sampled nor evaluated until it answers
        a liveness probe (:meth:`refresh`), so a silent participant stops costing every round its round-timeout."""
        for cid in res.replies:
            self.timeouts.pop(cid, None)
        for f in res.failures:
            if f.kind == "node-lost":
                self.forget(f.cid)
            elif f.kind == "timeout" and f.cid in self.clients:
                n = self.timeouts.get(f.cid, 0) + 1
                self.timeouts[f.cid] = n
                k = self.cfg.evict_after_timeouts
                if k and n >= k and f.cid not in self.evicted:
                    self.evicted[f.cid] = (0, 0)
                    reason = (f"{n} exchanges in a row without a reply (each waited up to round-timeout = "
                              f"{self.cfg.round_timeout:g} s): evicted, not sampled until it answers a liveness probe")
                    self.failures.append(Failure(f.cid, f.phase, "evicted", reason))
                    log.warning("client %s: %s", f.cid, reason)

    def _probe(self, grid: Grid, server_round: int) -> None:
        """Send a liveness probe (a "query", waiting ``probe-timeout``) to every evicted client that is due: one
        that answers as itself is eligible again; one that does not is probed again after 1, 2, 4, ... rounds."""
        due = {cid: self.clients[cid].node_id for cid, (_, nxt) in self.evicted.items()
               if cid in self.clients and nxt <= server_round}
        for cid in [c for c in self.evicted if c not in self.clients]:  # lost and forgotten: re-registers anew
            self.evicted.pop(cid)
        if not due:
            return
        res = exchange(grid, {cid: (node, self.query()) for cid, node in due.items()}, "query",
                       self.cfg.probe_timeout, server_round, phase="probe", poll=self.cfg.reply_poll_interval)
        for cid in due:
            reply = res.replies.get(cid)
            info = parse_info(reply.content.get("info")) if reply is not None else None
            if isinstance(info, RegistrationInfo) and info.cid == cid:
                self.evicted.pop(cid)
                self.timeouts.pop(cid, None)
                log.info("client %s answered its liveness probe in round %s: eligible again", cid, server_round)
                continue
            probes = self.evicted[cid][0] + 1
            retry = server_round + 2 ** min(probes - 1, 6)
            self.evicted[cid] = (probes, retry)
            why = "no answer" if reply is None else "a malformed answer"
            self.failures.append(Failure(cid, "probe", "evicted", f"{why} to liveness probe {probes} within "
                                         f"probe-timeout = {self.cfg.probe_timeout:g} s; probed again in round {retry}"))
        self.forget_lost(ExchangeResult(replies={}, failures=[f for f in res.failures if f.kind == "node-lost"]))

    def _clear_stale_backoff(self, node_ids: list[int]) -> None:
        """Ask at once (issue ops-live: a node that gave up and came back missed rounds) a backed-off node whose
        reason to wait is gone:

        - it left the SuperLink's node list and is back (a restarted or reconnected node: whatever failed
          before, e.g. registration queries that timed out during an outage, was that node's past);
        - it was refused as ``duplicate-id`` and the node holding that client id is no longer listed (the old
          node id of a node that restarted under a new one: once the SuperLink drops it, the new one is the
          client)."""
        present = set(node_ids)
        for node in list(self.backoff):
            if node not in present:
                self.away.add(node)
            elif node in self.away:
                self.backoff.pop(node, None)
                self.away.discard(node)
        for node, cid in list(self.claims.items()):
            holder = self.clients.get(cid)
            if node in present and (holder is None or holder.node_id not in present):
                self.backoff.pop(node, None)
                del self.claims[node]

    def _back_off(self, node: int, server_round: int) -> tuple[int, int]:
        """One more failed attempt of ``node``: (attempts so far, the round it is asked again)."""
        tries = self.backoff.get(node, (0, 0))[0] + 1
        retry = server_round + 2 ** min(tries - 1, 6)
        self.backoff[node] = (tries, retry)
        return tries, retry

    def _note_failed(self, res: ExchangeResult, node_of: dict[int, int], server_round: int) -> None:
        """Back off every node whose registration failed. A ``node-lost`` reply is the SuperLink saying the node
        went offline, so it counts as having left the node list even when no listing saw it gone: a node that
        reconnects under the same node id (flwr's reconnect back-off, a restart with a bound key) within the one
        second between two listings is asked again as soon as it is listed, not after its back-off, also within
        the registration wait of one round (min-train-nodes still missing)."""
        for f in res.failures:
            node = node_of[f.cid]
            tries, retry = self._back_off(node, server_round)
            if f.kind == "node-lost":
                self.away.add(node)
            self.failures.append(Failure(
                -1, "register", f.kind, f"node {node}: {f.reason} (attempt {tries}; asked again in round {retry})"))

    def _refuse_duplicate(self, cid: int, node: int, holder: int, server_round: int) -> None:
        """A node claims a client id that a live node holds: refused (the holder keeps its slot and state),
        recorded as a registration failure naming both nodes, and asked again with back-off."""
        tries, retry = self._back_off(node, server_round)
        self.claims[node] = cid
        reason = (f"node {node} claims client id {cid}, already held by live node {holder}: refused "
                  f"(attempt {tries}; asked again in round {retry})")
        self.failures.append(Failure(cid, "register", "duplicate-id", reason))
        log.warning("registration: %s", reason)

    def _refuse_size(self, cid: int, node: int, claimed: int, declared: int, server_round: int) -> None:
        """A bound client claims more training samples than the operator declared for it: refused (its weight
        would be inflated), recorded naming both sizes, and asked again with back-off."""
        tries, retry = self._back_off(node, server_round)
        reason = (f"node {node} (client id {cid}) claims {claimed} training samples, but the operator declared "
                  f"{declared} ({node_bindings.ENV}): refused (attempt {tries}; asked again in round {retry})")
        self.failures.append(Failure(cid, "register", "examples-mismatch", reason))
        log.warning("registration: %s", reason)

    def _refuse_malformed(self, node: int, problem: str, server_round: int) -> None:
        """A registration reply that does not conform (strategies/reply_schema.py): refused, recorded naming the
        node and the key, and asked again with back-off; the federation goes on with the others."""
        tries, retry = self._back_off(node, server_round)
        reason = f"node {node}: malformed registration: {problem} (attempt {tries}; asked again in round {retry})"
        self.failures.append(Failure(-1, "register", "rejected", reason))
        log.warning("registration: %s", reason)

    def _refuse_identity(self, cid: int, node: int, owned: int | None, server_round: int) -> None:
        """A node claims a client id its key does not own: refused (whoever came first), recorded as a
        registration failure naming the node, the claim and what its key owns, and asked again with back-off."""
        tries, retry = self._back_off(node, server_round)
        owns = f"its key is bound to client id {owned}" if owned is not None else "its key is bound to no client id"
        reason = (f"node {node} claims client id {cid}, but {owns} ({node_bindings.ENV}): refused "
                  f"(attempt {tries}; asked again in round {retry})")
        self.failures.append(Failure(cid, "register", "identity-mismatch", reason))
        log.warning("registration: %s", reason)

    def _node_owners(self) -> dict[int, int] | None:
        """node id -> owned client id from ``NODE_BINDINGS`` (re-read when the file changes; a client held by a
        node that no longer owns it is dropped), or None without bindings. A named but unreadable or invalid
        table raises ValueError: the run must not fall back to first-come identities."""
        path = node_bindings.configured()
        if path is None:
            return None
        try:
            stamp = (str(path), path.stat().st_mtime_ns, path.stat().st_size)
        except OSError:
            stamp = (str(path), -1, -1)
        if self._bindings is not None and self._bindings[0] == stamp:
            return self._bindings[1]
        table = node_bindings.load(path)
        owners = node_bindings.owners(table)
        self._bindings = (stamp, owners, node_bindings.declared_examples(table))
        for cid, info in list(self.clients.items()):
            if owners.get(info.node_id) != cid:
                log.warning("registration: node %d no longer owns client id %d (%s): dropped", info.node_id, cid,
                            Path(path).name)
                self.clients.pop(cid)
        return owners

    # ------------------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The sampler's stream and the accuracies (what a resumed run samples from)."""
        return {"rng": self.rng.bit_generator.state, "client_accuracy": dict(self.accuracy),
                "local_model_accuracy": dict(self.local_models), "timeouts": dict(self.timeouts),
                "evicted": {c: list(v) for c, v in self.evicted.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.accuracy = {int(k): float(v) for k, v in state["client_accuracy"].items()}
        if "local_model_accuracy" not in state:  # a checkpoint from before the table existed
            log.warning("checkpoint has no 'local_model_accuracy' table: local_accuracy_all_devices counts only "
                        "the devices trained since this resume (local_accuracy_all_devices_n says how many)")
        self.local_models = {int(k): float(v) for k, v in state.get("local_model_accuracy", {}).items()}
        self.timeouts = {int(k): int(v) for k, v in state.get("timeouts", {}).items()}  # absent: an older checkpoint
        self.evicted = {int(k): (int(v[0]), int(v[1])) for k, v in state.get("evicted", {}).items()}
