#!/usr/bin/env python
"""Register a SuperNode key and bind it to the client id (partition) it may claim (issue 32).

    python -m deploy.register_node certs/keys/supernode-3.pub 3 prod --bindings /state/superlink/node-bindings.json

runs ``flwr supernode register KEY CONNECTION`` (FLWR_HOME as for the flwr CLI), reads the node id Flower
assigned to the key and adds ``node id -> client id`` to the bindings table (flcore/node_bindings.py),
which the ServerApp reads from ``NODE_BINDINGS`` on the SuperLink host: run this there (connection to the
SuperLink's loopback port) or copy the table there. A client id or key that is already bound is refused
(unbind it first with ``--unbind CLIENT_ID`` after ``flwr supernode unregister``). ``--examples N`` declares the
client's training-set size: the ServerApp then weights it by at most N and refuses a larger claim; without it the
client's claim is capped at ``examples-cap-ratio`` x the median claim (strategies/client_registry.py).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flcore.node_bindings import Binding, load, write  # noqa: E402

REGISTERED = re.compile(r"SuperNode (\d+) registered successfully")


def bind(table: Path, node_id: int, client_id: int, public_key: str, examples: int | None = None) -> list[Binding]:
    """Add one binding to ``table`` (created if missing); ValueError when the id, node or key is bound already."""
    current = load(table) if table.exists() else []
    for b in current:
        if b.client_id == client_id:
            raise ValueError(f"client id {client_id} is already bound to node {b.node_id} in {table}")
        if b.node_id == node_id or b.public_key == public_key:
            raise ValueError(f"this key (node {b.node_id}) is already bound to client id {b.client_id} in {table}")
    updated = [*current, Binding(node_id, client_id, public_key, examples)]
    write(table, updated)
    return updated


def unbind(table: Path, client_id: int) -> list[Binding]:
    current = load(table)
    kept = [b for b in current if b.client_id != client_id]
    if len(kept) == len(current):
        raise ValueError(f"client id {client_id} is not bound in {table}")
    write(table, kept)
    return kept


def register(key: Path, connection: str, flwr: str = "flwr") -> int:
    """``flwr supernode register``; the node id it printed."""
    res = subprocess.run([flwr, "supernode", "register", str(key), connection], capture_output=True, text=True,
                         timeout=120)
    found = REGISTERED.search(res.stdout)
    if res.returncode != 0 or not found:
        raise RuntimeError(f"flwr supernode register {key} {connection} failed (exit {res.returncode}):\n"
                           f"{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("key", nargs="?", type=Path, help="the node's public key (.pub)")
    parser.add_argument("client_id", nargs="?", type=int, help="the client id (partition) this key owns")
    parser.add_argument("connection", nargs="?", help="flwr connection name (deploy/connection.py)")
    parser.add_argument("--bindings", required=True, type=Path, help="the bindings table (NODE_BINDINGS)")
    parser.add_argument("--unbind", type=int, metavar="CLIENT_ID", help="remove the binding of this client id")
    parser.add_argument("--examples", type=int, metavar="N", help="the client's training-set size, declared by the "
                        "operator (aggregation weight at most N; a larger claim is refused)")
    parser.add_argument("--flwr", default=shutil.which("flwr") or "flwr")
    ns = parser.parse_args(argv)
    try:
        if ns.unbind is not None:
            unbind(ns.bindings, ns.unbind)
            print(f"unbound client id {ns.unbind} in {ns.bindings}")
            return
        if ns.key is None or ns.client_id is None or ns.connection is None:
            parser.error("KEY CLIENT_ID CONNECTION are required (or --unbind)")
        if ns.client_id < 0:
            parser.error(f"client id must be >= 0, got {ns.client_id}")
        if ns.examples is not None and ns.examples < 1:
            parser.error(f"--examples must be >= 1, got {ns.examples}")
        public_key = ns.key.read_text().strip()
        current = load(ns.bindings) if ns.bindings.exists() else []
        taken = [b for b in current if b.client_id == ns.client_id or b.public_key == public_key]
        if taken:   # checked before registering, so a refused binding leaves no registered key behind
            raise ValueError(f"client id {ns.client_id} or this key is already bound (node {taken[0].node_id} -> "
                             f"client id {taken[0].client_id}) in {ns.bindings}")
        node_id = register(ns.key, ns.connection, ns.flwr)
        bind(ns.bindings, node_id, ns.client_id, public_key, ns.examples)
    except (ValueError, RuntimeError, OSError) as exc:
        parser.exit(2, f"register_node: {exc}\n")
    print(f"registered {ns.key} as node {node_id}, bound to client id {ns.client_id} in {ns.bindings}")


if __name__ == "__main__":
    main()
