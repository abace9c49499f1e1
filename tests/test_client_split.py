"""The client split's digest (data_partitioning.federated.split_digest) and the experiment runner's use of it:
a finished run whose recorded split is not the one its config draws now is redone, not reported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from data_partitioning.federated import client_indices, split_digest
from experiments.run import SPLIT_FILE, is_complete, planned_config, split_change, write_split


def _cfg(**over):
    return planned_config({"dataset": "digits", "partition": "dirichlet", "dirichlet-alpha": 0.3, "seed": 1,
                           "num-server-rounds": 2, **over})


def test_the_digest_is_the_clients_indices() -> None:
    cfg = _cfg()
    d = split_digest(cfg, 5)
    assert d == split_digest(_cfg(), 5) and len(d) == 16
    assert d == split_digest(_cfg(lr=0.5, method="fedprox"), 5)          # training keys do not split the data
    others = {split_digest(_cfg(seed=2), 5), split_digest(_cfg(**{"dirichlet-alpha": 0.5}), 5),
              split_digest(cfg, 6), split_digest(_cfg(partition="iid"), 5),
              split_digest(_cfg(**{"local-test-fraction": 0.3}), 5)}
    assert d not in others and len(others) == 5
    # every sample of the pool in at most one client's split, and the digest covers them all
    seen = np.concatenate([np.concatenate(client_indices(cfg, c, 5)) for c in range(5)])
    assert len(seen) == len(set(seen.tolist()))


def _finished_run(path: Path, cfg) -> None:
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps({"run_config": cfg.to_dict(), "rounds": [{}, {}], "final": {}}))


def test_a_run_recorded_on_another_split_is_not_complete(tmp_path: Path) -> None:
    cfg = _cfg()
    run = tmp_path / "run"
    _finished_run(run, cfg)
    assert is_complete(run, cfg, 5)                       # no split recorded (older runs): not compared
    write_split(run, cfg, 5)
    assert json.loads((run / SPLIT_FILE).read_text()) == {"digest": split_digest(cfg, 5), "num_partitions": 5}
    assert is_complete(run, cfg, 5) and split_change(run, cfg, 5) is None
    # the same config, but the split it draws is another one (as after a partitioner change): redone
    (run / SPLIT_FILE).write_text(json.dumps({"digest": "0123456789abcdef", "num_partitions": 5}))
    assert not is_complete(run, cfg, 5)
    assert split_change(run, cfg, 5) == f"client split: 0123456789abcdef -> {split_digest(cfg, 5)}"
    assert is_complete(run, cfg)                          # without the federation's size: config only
