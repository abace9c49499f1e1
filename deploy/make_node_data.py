"""Write node-local data files for a deployment trial: client i's partition of a named dataset as
``OUT_DIR/client-<i>.npz`` (arrays x_train, y_train, x_test, y_test, num_classes), the format
``data_partitioning/federated.py:node_arrays`` reads for node config ``data-path``.

    python -m deploy.make_node_data OUT_DIR --num-clients 3 -c "dataset='digits' partition='dirichlet'"

The split is the one a simulation with the same run config and ``num-partitions`` would use, so a run
on these files with ``client-id=i data-path='OUT_DIR/client-<i>.npz'`` trains on the same data as the
simulation. Real deployments bring their own files in this format (x float32 (N, ...) normalised like
the dataset the run names; y int class ids; the 75/25 train/test split can be left to the node by
storing only ``x`` and ``y``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from data_partitioning.federated import client_arrays
from flcore.config import RunConfig, resolve_run_config


def write_node_files(out_dir: Path, num_clients: int, overrides: dict) -> list[Path]:
    """Write one ``client-<i>.npz`` per client; returns the paths."""
    if num_clients < 1:
        raise ValueError(f"--num-clients must be >= 1, got {num_clients}")
    cfg = RunConfig.from_dict(resolve_run_config(overrides))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for cid in range(num_clients):
        arr = client_arrays(cfg, cid, num_clients)
        path = out_dir / f"client-{cid}.npz"
        np.savez(path, x_train=arr.x_train, y_train=arr.y_train, x_test=arr.x_test, y_test=arr.y_test,
                 num_classes=np.int64(arr.num_classes))
        paths.append(path)
    return paths


def main() -> None:
    from deploy.localfed import _parse_overrides

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--num-clients", type=int, required=True)
    parser.add_argument("-c", "--run-config", default="", help="run-config overrides, TOML key=value pairs")
    ns = parser.parse_args()
    overrides = _parse_overrides(ns.run_config)
    for path in write_node_files(Path(ns.out_dir), ns.num_clients, overrides):
        with np.load(path) as z:
            print(f"{path}: {len(z['y_train'])} train / {len(z['y_test'])} test examples")


if __name__ == "__main__":
    main()
