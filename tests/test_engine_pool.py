"""The worker-process pool (engines/pool.py) with the small counter ClientApp of tests/engine_apps.py:
per-node state in the owning worker, migration between workers, error replies, dead workers."""

from __future__ import annotations

import os
from pathlib import Path
import time

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode

from engines.local import server_identity
from engines.pool import PoolGrid
from strategies.exchange import push_and_pull

APP = "tests.engine_apps:counter"


@pytest.fixture(autouse=True)
def _server_process_identity():
    with server_identity(1):
        yield


@pytest.fixture
def grid():
    g = PoolGrid(6, 2, None, run_config={"seed": 0, "method": "fedavg"}, client_app=APP)
    yield g
    g.close()


def _send(grid: PoolGrid, nodes: list[int], mtype: str = "train", **config) -> dict[int, Message]:
    content = RecordDict({"config": ConfigRecord(config)}) if config else RecordDict()
    msgs = [Message(content, dst_node_id=n, message_type=mtype, group_id="0") for n in nodes]
    replies = push_and_pull(grid, msgs, timeout=60.0, poll=0.05)
    return {r.metadata.src_node_id: r for r in replies}


def _n(reply: Message) -> int:
    return int(reply.content["metrics"]["n"])


def test_each_nodes_state_persists_in_its_worker_across_exchanges(grid):
    pids_seen = set()
    for expected in (1, 2, 3):
        replies = _send(grid, grid.node_ids)
        assert {n: _n(r) for n, r in replies.items()} == {n: expected for n in grid.node_ids}
        assert [int(replies[n].content["metrics"]["partition-id"]) for n in grid.node_ids] == list(range(6))
        assert all(int(r.content["metrics"]["run-config-keys"]) == 2 for r in replies.values())
        pids_seen |= {int(r.content["metrics"]["pid"]) for r in replies.values()}
    assert pids_seen == set(grid.worker_pids()) and os.getpid() not in pids_seen


def test_a_migrated_node_takes_its_state_to_the_new_worker(grid):
    _send(grid, grid.node_ids)  # the first exchange places the nodes on whichever worker was free
    assert grid.dynamic_exchanges == 1 and set(grid.owner) == set(grid.node_ids)
    crowded = max(range(2), key=lambda w: sum(o == w for o in grid.owner.values()))
    heavy = [n for n in grid.node_ids if grid.owner[n] == crowded]
    assert len(heavy) >= 3
    a = heavy[0]
    pid_a = int(_send(grid, [a])[a].content["metrics"]["pid"])
    # every node of the crowded worker costs 10, the others nothing: the plan moves some of them over
    for n in grid.node_ids:
        grid.costs[(n, "train")] = 10.0 if n in heavy else 0.001
    before = dict(grid.owner)
    replies = _send(grid, grid.node_ids)
    moved = [n for n in grid.node_ids if grid.owner[n] != before[n]]
    assert grid.migrations >= 1 and any(before[n] == crowded for n in moved)  # (a swap moves one back)
    assert {n: _n(r) for n, r in replies.items()} == {n: (3 if n == a else 2) for n in grid.node_ids}
    for n in moved:  # ran in the other worker, with the state it had
        assert int(replies[n].content["metrics"]["pid"]) != (pid_a if n == a else -1)
    replies = _send(grid, grid.node_ids)  # and it stays where it went, state intact
    assert {n: _n(r) for n, r in replies.items()} == {n: (4 if n == a else 3) for n in grid.node_ids}
    assert grid.dynamic_exchanges == 1  # every cost is known now: planned, not dynamic


def test_the_first_exchange_goes_to_whichever_worker_is_free(grid):
    """Unknown costs: a slow message keeps one worker busy while the other takes the rest."""
    slow = grid.node_ids[0]
    content = {n: RecordDict({"config": ConfigRecord({"sleep": 1.0 if n == slow else 0.0})}) for n in grid.node_ids}
    msgs = [Message(content[n], dst_node_id=n, message_type="train", group_id="0") for n in grid.node_ids]
    replies = {r.metadata.src_node_id: r for r in push_and_pull(grid, msgs, timeout=60.0, poll=0.05)}
    pids = {n: int(r.content["metrics"]["pid"]) for n, r in replies.items()}
    assert len(set(pids.values())) == 2
    assert sum(p == pids[slow] for p in pids.values()) == 1  # the slow node's worker did nothing else


def test_a_raising_clientapp_gives_code_2_and_keeps_the_old_state(grid):
    node = grid.node_ids[3]
    assert _n(_send(grid, [node])[node]) == 1
    reply = _send(grid, [node], **{"raise-after-count": True})[node]
    assert reply.has_error() and reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert "RuntimeError: node 3 failed on purpose" in reply.error.reason
    assert _n(_send(grid, [node])[node]) == 2


def test_a_dead_worker_answers_code_8_for_its_messages_and_is_replaced(grid):
    _send(grid, grid.node_ids)
    for n in grid.node_ids:  # equal costs: one planned exchange balances the owners, which then stay put
        grid.costs[(n, "train")] = 1.0
    _send(grid, grid.node_ids)
    for n in grid.node_ids:
        grid.costs[(n, "train")] = 1.0
    settled = grid.migrations
    victim = grid.node_ids[2]
    w = grid.owner[victim]
    old_pid = grid.worker_pids()[w]
    same_worker = [n for n in grid.node_ids if grid.owner[n] == w]
    other = [n for n in grid.node_ids if grid.owner[n] != w]
    content = {n: RecordDict({"config": ConfigRecord({"exit": n == victim, "sleep": 0.2 if n != victim else 0.0})})
               for n in grid.node_ids}
    order = [victim] + [n for n in grid.node_ids if n != victim]  # the victim's worker dies on its first message
    msgs = [Message(content[n], dst_node_id=n, message_type="train", group_id="1") for n in order]
    replies = {r.metadata.src_node_id: r for r in push_and_pull(grid, msgs, timeout=60.0, poll=0.05)}
    assert grid.migrations == settled
    assert set(replies) == set(grid.node_ids)  # every message is answered
    for n in same_worker:  # queued or running in the dead worker: an error each
        assert replies[n].has_error() and replies[n].error.code == ErrorCode.CLIENT_APP_CRASHED
        assert f"pid {old_pid}" in replies[n].error.reason and "lost their context.state" in replies[n].error.reason
    for n in other:
        assert _n(replies[n]) == 3
    assert grid.replaced == 1 and grid.worker_pids()[w] != old_pid
    after = _send(grid, grid.node_ids)
    for n in same_worker:  # a fresh Context on the new worker: the count starts again
        assert _n(after[n]) == 1 and int(after[n].content["metrics"]["pid"]) == grid.worker_pids()[grid.owner[n]]
    for n in other:
        assert _n(after[n]) == 4


def test_pull_waits_briefly_and_a_timeout_leaves_the_reply_missing(grid):
    node = grid.node_ids[0]
    msg = Message(RecordDict({"config": ConfigRecord({"sleep": 1.5})}), dst_node_id=node, message_type="train",
                  group_id="0")
    replies = push_and_pull(grid, [msg], timeout=0.6, poll=0.1)
    assert replies == []  # returned at its timeout, before the 1.5 s reply existed (no wall-clock budget)
    fast = _send(grid, [grid.node_ids[1]])  # the other worker is free
    assert _n(fast[grid.node_ids[1]]) == 1


def test_close_stops_every_worker():
    g = PoolGrid(3, 2, None, run_config={}, client_app=APP)
    pids = g.worker_pids()
    g.close()
    time.sleep(0.2)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    with pytest.raises(RuntimeError, match="closed"):
        g.push_messages([Message(RecordDict(), dst_node_id=g.node_ids[0], message_type="train", group_id="0")])


@pytest.mark.slow  # spawned workers import torch themselves: seconds each on 2 cores
def test_spawned_workers_need_an_importable_app_and_work():
    with pytest.raises(ValueError, match="module:attribute"):
        PoolGrid(2, 2, run_config={}, client_app=lambda m, c: m, start_method="spawn")
    g = PoolGrid(2, 2, None, run_config={"a": 1}, client_app=APP, start_method="spawn")
    try:
        replies = _send(g, g.node_ids, mtype="query")
        assert sorted(_n(r) for r in replies.values()) == [1, 1]
    finally:
        g.close()


@pytest.mark.slow
def test_workers_end_when_the_driver_is_killed(tmp_path):
    """A driver killed with SIGKILL cannot stop its workers: they notice and exit by themselves. Slow tier: it
    starts a driver process (4 s of imports)."""
    import signal
    import subprocess
    import sys

    code = ("import time\n"
            "import engines.pool\n"
            "engines.pool.warm_imports = lambda: None  # not needed here: saves a second\n"
            "from engines.local import server_identity\n"
            "from engines.pool import PoolGrid\n"
            "with server_identity(1):\n"
            "    g = PoolGrid(2, 2, None, run_config={}, client_app='tests.engine_apps:counter')\n"
            "    print(' '.join(map(str, g.worker_pids())), flush=True)\n"
            "    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    def alive(pid: int) -> bool:  # an exited worker waiting to be reaped (state Z) has ended
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False

    deadline = time.time() + 30  # the workers notice within seconds; a loaded 2-core CI box needed more than 10
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)
