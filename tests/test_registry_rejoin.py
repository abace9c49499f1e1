"""A node that gave up and came back registers at once (issue ops-live item 3, the registry's part).

Read from strategies/client_registry.py: a node whose registration failed is asked again only after 1, 2, 4, ...
rounds, and a node claiming a client id whose old node is still listed is refused (``duplicate-id``) with the same
back-off. A node that failed during an outage, or that restarted under a new node id while the SuperLink still
listed the old one, therefore sat out up to 2^k rounds after it was back. Now a back-off ends when its reason
is gone: the node left the node list and returned, or the node holding its claimed id is no longer listed."""

from __future__ import annotations

from flcore.config import RunConfig, resolve_run_config
from strategies.base import FLStrategy
from tests.fakegrid import FakeGrid
from tests.known_outputs import COMMON


def _strategy() -> FLStrategy:
    # a silent node costs one round-timeout per query; the others answer on push (an in-process grid)
    cfg = RunConfig.from_dict(resolve_run_config({**COMMON, "method": "fedavg", "round-timeout": 0.2,
                                                  "min-train-nodes": 1}))
    return FLStrategy(cfg)


def test_a_node_back_after_an_outage_is_asked_at_once_not_after_its_backoff():
    grid = FakeGrid(4, behaviours={3: "silent"}, behaviour_phases=("query",))
    strategy = _strategy()
    reg = strategy.registry
    node = grid.node_ids[3]
    for rnd in (1, 2, 4):                     # its queries time out during the outage: asked in 1, 2, 4, ... rounds
        reg.refresh(grid, wait=False, server_round=rnd)
    assert sorted(reg.clients) == [0, 1, 2] and reg.backoff[node] == (3, 8)
    grid.lost.add(node)                       # the SuperLink drops it (missed heartbeats) ...
    reg.refresh(grid, wait=False, server_round=5)
    grid.lost.discard(node)                   # ... and it comes back, healthy
    grid.behaviours.clear()
    reg.refresh(grid, wait=False, server_round=6)
    assert sorted(reg.clients) == [0, 1, 2, 3] and node not in reg.backoff  # round 6, not round 8


def test_a_node_listed_throughout_keeps_its_backoff():
    grid = FakeGrid(3, behaviours={2: "silent"}, behaviour_phases=("query",))
    reg = _strategy().registry
    for rnd in (1, 2):
        reg.refresh(grid, wait=False, server_round=rnd)
    grid.behaviours.clear()
    reg.refresh(grid, wait=False, server_round=3)   # asked again in round 4 (2 failures): not yet
    assert sorted(reg.clients) == [0, 1]
    reg.refresh(grid, wait=False, server_round=4)
    assert sorted(reg.clients) == [0, 1, 2]


class RestartGrid(FakeGrid):
    """Client 1's node restarts under a new node id (a stock SuperNode without a bound key) while the SuperLink
    still lists the old id for a while."""

    def __init__(self) -> None:
        super().__init__(4)
        self.new = self.node_ids[3]
        self.contexts[self.new].node_config["partition-id"] = 1
        self.lost.add(self.new)               # not started yet


def test_a_node_restarted_under_a_new_id_takes_its_client_id_once_the_old_id_is_gone():
    grid = RestartGrid()
    reg = _strategy().registry
    reg.refresh(grid, wait=False, server_round=1)
    old = reg.clients[1].node_id
    assert old == grid.node_ids[1]
    grid.lost.discard(grid.new)               # the new process activates; the old id is still listed
    for rnd in (2, 3, 5):
        reg.refresh(grid, wait=False, server_round=rnd)
    assert reg.clients[1].node_id == old and reg.backoff[grid.new] == (3, 9)
    assert [f.kind for f in reg.drain_failures()].count("duplicate-id") == 3
    grid.lost.add(old)                        # the SuperLink drops the old id
    reg.refresh(grid, wait=False, server_round=6)
    assert reg.clients[1].node_id == grid.new and grid.new not in reg.backoff   # round 6, not round 9


class FlappingGrid(FakeGrid):
    """Node ``cid``'s first registration query is answered by the SuperLink as node-lost (its heartbeat window
    ran out), and the node is online again under the same node id before the registry next lists the nodes:
    no listing ever shows it gone (flwr's reconnect back-off after a Fleet outage; a restarted node whose key
    keeps its node id)."""

    def __init__(self, num_nodes: int, cid: int) -> None:
        super().__init__(num_nodes, behaviours={cid: "dead"}, behaviour_phases=("query",))
        self.cid = cid

    def _deliver(self, msg):
        reply = super()._deliver(msg)
        node = self.node_ids[self.cid]
        if msg.metadata.dst_node_id == node and self.behaviours.pop(self.cid, None) == "dead":
            self.lost.discard(node)                     # back before the next get_node_ids
        return reply


def test_a_node_lost_during_registration_and_back_under_its_id_registers_within_the_same_wait():
    """The run waits for min-train-nodes = 3: before, the lost node's back-off (asked again in round 1) held
    through the whole registration wait of round 0, which failed after round-timeout with 2 clients."""
    grid = FlappingGrid(3, cid=2)
    cfg = RunConfig.from_dict(resolve_run_config({**COMMON, "method": "fedavg", "round-timeout": 5.0,
                                                  "min-train-nodes": 3}))
    reg = FLStrategy(cfg).registry
    reg.refresh(grid, wait=True, server_round=0)
    assert sorted(reg.clients) == [0, 1, 2] and not reg.backoff and not reg.away
    failures = reg.drain_failures()
    assert [(f.kind, f.phase) for f in failures] == [("node-lost", "register")], failures
    assert f"node {grid.node_ids[2]}: " in failures[0].reason
