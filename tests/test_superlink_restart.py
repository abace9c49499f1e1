"""A SuperLink restart in the middle of a deployed run (issue ops-live item 3).

The SuperLink (SQLite state, TLS, node keys registered) is killed after the run's second round and started
again on the same database. Its run in flight is lost (its ServerApp reaches the SuperLink's Runtime API, and
Flower does not restart it); the SuperNodes, which never stopped, poll the new SuperLink under their old node
ids. The run submitted again with ``resume-from`` continues after the checkpoint's round with every node, and
its results hold each round once."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploy.localfed import LocalFederation, snapshot_app  # noqa: E402
from flcore import safe_files  # noqa: E402

NODES = 3
RUN = {"method": "scaffold", "dataset": "digits", "partition": "dirichlet", "seed": 1, "num-server-rounds": 4,
       "fraction-train": 1.0, "min-train-nodes": NODES, "round-timeout": 60.0}


def _checkpoint_round(path: Path) -> int:
    try:
        return int(safe_files.load(path, "checkpoint")["round"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.slow
def test_a_superlink_restart_mid_run_continues_from_the_checkpoint_with_every_node(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = {**RUN, "out-dir": str(out)}
    fed = LocalFederation(tmp_path / "fed", NODES, tls=True, node_auth=True, tuned=True, database=True,
                          node_configs=[f"partition-id={i} num-partitions={NODES} state-dir='{tmp_path / f'state-{i}'}'"
                                        for i in range(NODES)],   # SCAFFOLD's c_i outlives the process
                          register=list(range(NODES)), start_nodes=list(range(NODES)),
                          app_dir=snapshot_app(tmp_path / "app"))
    try:
        fed.start()
        fed.wait_connected(superexec=True)
        ids_before = {int(n["node-id"]) for n in json.loads(
            fed.flwr("supernode", "list", fed.connection, "--format", "json").stdout)["nodes"]}
        started = time.time()
        first = fed.submit(cfg, "before-restart")
        deadline = time.time() + 300
        while _checkpoint_round(out / "checkpoint.pt") < 2:
            assert first.poll() is None and time.time() < deadline, \
                (fed.logs / "before-restart.out").read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        assert fed.superlink is not None
        fed.superlink.signal_group(signal.SIGKILL)       # the SuperLink and its ServerApp, at once
        fed.superlink.popen.wait(timeout=30)
        killed_after = _checkpoint_round(out / "checkpoint.pt")
        fed.start_superlink()                            # same database: keys, nodes and runs survive
        lost = fed.finish(first, cfg, "before-restart", started, timeout=60)
        assert not lost.status.startswith("finished:completed"), lost.status
        res = fed.run({**cfg, "resume-from": str(out)}, timeout=600, name="after-restart")
        nodes_alive = all(p.alive() for p in fed.nodes.values())
        listing = json.loads(fed.flwr("supernode", "list", fed.connection, "--format", "json").stdout)["nodes"]
    finally:
        fed.stop()
    assert res.status == "finished:completed", res.output[-3000:]
    assert nodes_alive                                   # no node had to be restarted
    assert {int(n["node-id"]) for n in listing} == ids_before and all(n["status"] == "online" for n in listing)
    rows = res.doc["rounds"]
    assert [r["round"] for r in rows] == [1, 2, 3, 4]    # each round once: none lost, none recorded twice
    resumed = rows[killed_after:]
    assert resumed and all(r["num_updates"] == NODES and not r["failures"] for r in resumed), \
        [(r["round"], r["num_updates"], r["failures"]) for r in resumed]
    print(f"\n[superlink restart] killed after round {killed_after}'s checkpoint; the lost run was still listed "
          f"'{lost.status}' (then stopped with flwr stop); resumed rounds {[r['round'] for r in resumed]} with "
          f"{NODES} nodes each")
