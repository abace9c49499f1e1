"""The Flower ``Strategy`` face of every method: ``configure_train`` / ``aggregate_train`` / ... so that a
single-exchange method also runs under Flower's own ``Strategy.start()`` (tests/test_flower_faces.py).

The project's round driver (server_app/runner.py) calls ``train_round()`` instead, which adds retries,
failure records, multi-exchange rounds (FedUFO's relay) and federated evaluation.
"""

from __future__ import annotations

import logging
from typing import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid

from flcore.records import params_to_record, record_to_params

log = logging.getLogger("noniid_fl")


class FlowerStrategyAPI:
    """Mixin of FLStrategy implementing flwr.serverapp.strategy.Strategy's abstract methods."""

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
