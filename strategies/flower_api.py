"""The Flower ``Strategy`` face of every method: ``configure_train`` / ``aggregate_train`` /
``configure_evaluate`` / ``aggregate_evaluate`` / ``summary``, so that a single-exchange method also runs
under Flower's own ``Strategy.start()`` from a user's ServerApp (tests/test_flower_faces.py)::

    strategy = build_strategy(RunConfig.from_dict(context.run_config))
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=cfg.num_server_rounds)

A round under ``start()`` is the round of the project's own driver (server_app/runner.py, which calls
``train_round()``) without the retries: the same registration (a "query" to every new node before the
first ``configure_train``), seeded sampling, per-client messages (FedBC's lambda_k, SCAFFOLD's c),
validation of the replies and the method's ``aggregate``, so the same seed gives the same model. Failures
(error replies, no reply, rejected updates) are kept per round in ``flower_failures``; a round with fewer
than ``min-train-replies`` usable updates raises :class:`RoundFailed`. Federated evaluation follows
``federated-eval-every`` (and the last round). Methods that exchange several messages within a round
(FedUFO's relay) cannot run under ``start()``: it raises :class:`StartNotSupported` saying why.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Callable, Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from flcore import protocol
from flcore.config import RunConfig, all_specs
from flcore.faces import start_problem
from flcore.records import params_to_record, record_to_params
from flcore.registry import get_method
from strategies.client_registry import ClientRegistry, RoundFailed
from strategies.exchange import Failure, sort_replies

if TYPE_CHECKING:
    from flcore.named_arrays import Params
    from strategies.client_registry import ClientInfo
    from strategies.round_driver import RoundSteps as _RoundSteps
else:
    _RoundSteps = object  # the type checker's view only: FLStrategy (strategies/base.py) defines the steps

log = logging.getLogger("noniid_fl")


class StartNotSupported(TypeError):
    """The method cannot be driven by Flower's ``Strategy.start()`` (several exchanges per round)."""


class FlowerStrategyAPI(Strategy, _RoundSteps):
    """FLStrategy's face to Flower: flwr.serverapp.strategy.Strategy (``start()`` + its five methods), over the
    strategy's public steps (``refresh_clients``, ``sample``, ``train_content``, ``collect_updates``,
    ``aggregate``, ``evaluate_content``, ``round_metrics``) and its client registry (``registry``). It keeps only
    what ``start()``'s rounds need between its calls: the messages sent, the failures and the last evaluation."""

    cfg: RunConfig
    registry: ClientRegistry

    if TYPE_CHECKING:  # the steps this face calls beyond a round's (RoundSteps); FLStrategy defines them
        @property
        def clients(self) -> dict[int, ClientInfo]: ...

        def refresh_clients(self, grid: Grid, wait: bool = True, server_round: int = 0) -> None: ...

        def round_metrics(self) -> dict[str, Any]: ...

    def __init__(self) -> None:
        self.flower_failures: dict[int, list[Failure]] = {}  # round -> its failures under start()
        self.last_evaluation: dict[int, dict] = {}  # cid -> metrics of the last federated evaluation
        self._flower_params: tuple[int, Params] | None = None  # (round, the global params configure_train sent)
        self._flower_sent: dict[str, list[tuple[int, Message]]] = {}  # phase -> (cid, message) sent

    # ------------------------------------------------------------------------------ the round loop
    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        """Flower's ``Strategy.start()``, after checking that this method fits it and that ``num_rounds`` is
        the run config's ``num-server-rounds`` (methods schedule by it, e.g. FedETF's warm-up)."""
        self._require_single_exchange()
        if num_rounds != self.cfg.num_server_rounds:
            raise ValueError(f"start(num_rounds={num_rounds}) differs from run-config num-server-rounds="
                             f"{self.cfg.num_server_rounds}; methods schedule by the latter: pass "
                             "num_rounds=cfg.num_server_rounds")
        return super().start(grid=grid, initial_arrays=initial_arrays, num_rounds=num_rounds,
                             timeout=timeout, train_config=train_config, evaluate_config=evaluate_config,
                             evaluate_fn=evaluate_fn)

    def _require_single_exchange(self) -> None:
        problem = start_problem(get_method(self.cfg.method))
        if problem is not None:
            raise StartNotSupported(f"{type(self).__name__}: {problem}. Run it with this project's round "
                                    "driver (server_app.runner.run_federation; `flwr run .`), whose "
                                    "train_round() drives every phase of the round")

    # ------------------------------------------------------------------------------ training
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Register new nodes, sample, and build one message per sampled client (its own records)."""
        self._require_single_exchange()
        self.refresh_clients(grid, server_round=server_round)
        extra = self._user_config(config, "train_config")
        params = record_to_params(arrays)
        self._flower_params = (server_round, params)
        sent = [(cid, Message(self.train_content(server_round, cid, params, extra), message_type=protocol.TRAIN,
                              dst_node_id=self.clients[cid].node_id, group_id=str(server_round)))
                for cid in self.sample(server_round)]
        self._flower_sent[protocol.TRAIN] = sent
        return [m for _, m in sent]

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate the replies (collect_updates) and aggregate them with the method's ``aggregate``."""
        rnd, params = self._flower_params or (None, None)
        if rnd != server_round:
            raise RuntimeError(f"aggregate_train(round {server_round}) without configure_train for that round")
        assert params is not None  # configure_train's of this round
        ok, failures = self._sort_replies(server_round, protocol.TRAIN, replies)
        updates, rejected = self.collect_updates(server_round, ok, params)
        failures = self.registry.drain_failures() + failures + rejected
        self.flower_failures[server_round] = failures
        sampled = len(self._flower_sent[protocol.TRAIN])
        if not updates or len(updates) < min(self.cfg.min_train_replies, sampled):
            reasons = "; ".join(f"client {f.cid}: {f.kind} ({f.reason})" for f in failures[-10:])
            raise RoundFailed(f"round {server_round}: {len(updates)} usable update(s) of {sampled} sampled, "
                              f"min-train-replies={self.cfg.min_train_replies}. Failures: {reasons}")
        new = self.aggregate(server_round, params, updates)
        total = sum(u.num_examples for u in updates)
        metrics: dict[str, Any] = {
            "train_loss": sum(float(u.metrics["train_loss"]) * u.num_examples for u in updates) / total,
            "num-updates": len(updates), "num-failures": len(failures)}
        metrics.update({k: v for k, v in self.round_metrics().items() if _is_number(v)})
        return params_to_record(new), MetricRecord(metrics)

    # ------------------------------------------------------------------------------ evaluation
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """The global model to every registered client (or the federated-eval-clients sample) on rounds
        that are a multiple of federated-eval-every, and on the last round."""
        every = self.cfg.federated_eval_every
        if not ((every and server_round % every == 0) or server_round == self.cfg.num_server_rounds):
            self._flower_sent[protocol.EVALUATE] = []
            return []
        extra = self._user_config(config, "evaluate_config")
        params = record_to_params(arrays)
        sent = [(cid, Message(self.evaluate_content(server_round, cid, params, extra),
                              message_type=protocol.EVALUATE, dst_node_id=self.clients[cid].node_id,
                              group_id=str(server_round)))
                for cid in self.registry.eval_cids()]
        self._flower_sent[protocol.EVALUATE] = sent
        return [m for _, m in sent]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Test-set-size weighted accuracy and loss of the global model over the clients that answered,
        plus the worst and best client accuracy; the per-client values stay in ``last_evaluation``."""
        ok, failures = self._sort_replies(server_round, protocol.EVALUATE, replies)
        per: dict[int, dict] = {}
        for cid, reply in ok.items():
            metrics = dict(reply.content[protocol.METRICS]) if protocol.METRICS in reply.content else {}
            missing = [k for k in ("num-test", "accuracy", "loss") if k not in metrics]
            if missing:
                failures.append(Failure(cid, protocol.EVALUATE, "rejected", f"reply lacks metric(s) {missing}"))
                continue
            per[cid] = metrics
        self.flower_failures.setdefault(server_round, []).extend(failures)
        self.last_evaluation = per
        if not per:
            if failures:
                log.warning("round %s: no client answered the federated evaluation: %s", server_round,
                            "; ".join(f.reason for f in failures[:3]))
            return None
        n = {cid: float(m["num-test"]) for cid, m in per.items()}
        total = sum(n.values())
        if total == 0:
            log.warning("round %s: the clients that answered the federated evaluation hold no local test data "
                        "(local-test-fraction = 0)", server_round)
            return None
        accs = [float(m["accuracy"]) for m in per.values()]
        return MetricRecord({
            "accuracy": sum(float(m["accuracy"]) * n[c] for c, m in per.items()) / total,
            "loss": sum(float(m["loss"]) * n[c] for c, m in per.items()) / total,
            "accuracy-worst": min(accs), "accuracy-best": max(accs),
            "num-evaluated": len(per), "num-failures": len(failures)})

    def summary(self) -> None:
        log.info("%s: %s", type(self).__name__, {k: self.cfg.value(k) for k in
                                                  ("method", "dataset", "partition", "num-server-rounds")})

    # ------------------------------------------------------------------------------ helpers
    def _user_config(self, config: ConfigRecord, what: str) -> dict[str, Any]:
        """start()'s train/evaluate config, forwarded in each client's "config" record; keys the strategy
        sets per client or that the run config owns are refused (clients would not read them there)."""
        values = dict(config)
        reserved = sorted(set(values) & (set(protocol.CONFIG_KEYS) | set(get_method(self.cfg.method).payload.config)))
        if reserved:
            raise ValueError(f"{what} key(s) {reserved} are set by the strategy for each client (docs/PROTOCOL.md)")
        owned = sorted(set(values) & set(all_specs()))
        if owned:
            raise ValueError(f"{what} key(s) {owned} are run-config keys: clients read them from the run "
                             "config only, so set them there")
        return values

    def _sort_replies(self, server_round: int, phase: str,
                      replies: Iterable[Message]) -> tuple[dict[int, Message], list[Failure]]:
        """Replies to this phase's messages by client id, classified as every exchange's are
        (strategies/exchange.py ``sort_replies``: error and missing replies as failures); a node the SuperLink
        reports lost is forgotten, so that it registers again, and a silent one counts towards its eviction."""
        res = sort_replies(self._flower_sent.get(phase, []), replies, phase, server_round,
                           "no reply within start()'s timeout")
        self.registry.forget_lost(res)  # as every exchange of our driver: lost nodes forgotten, silent ones counted
        return res.replies, res.failures


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
