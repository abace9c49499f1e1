"""Which client id each registered SuperNode owns: the operator's binding of node keys to client ids (issue 32).

With SuperNode authentication a node's Flower node id is fixed by its registered public key (``flwr supernode
register`` prints it; the SuperLink activates the node under that id). ``deploy/register_node.py`` registers a
key and records ``node id -> client id`` (and the key) in a JSON table; the ServerApp reads the table named by
the environment variable ``NODE_BINDINGS`` on the SuperLink host, and then accepts a node's claimed client id
(``partition-id`` / ``client-id``) only when its node id is bound to exactly that id
(strategies/client_registry.py). Without ``NODE_BINDINGS`` nothing is bound (simulation; deployments without
node authentication): the first live claim of an id wins, as before.

Format: ``{"version": 1, "nodes": [{"node_id": 123, "client_id": 0, "public_key": "ecdsa-sha2-nistp384 ...",
"examples": 600}]}``; node ids and client ids are unique (one key per client id, one client id per key).
``examples`` (optional) is the training-set size the operator declares for that client: aggregation weights and
the update screen then use it, and a registration claiming more is refused (strategies/client_registry.py); a
bound client without it is weighted by its claim capped at ``examples-cap-ratio`` x the median claim.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

ENV = "NODE_BINDINGS"
VERSION = 1


@dataclass(frozen=True)
class Binding:
    node_id: int
    client_id: int
    public_key: str
    examples: int | None = None  # the training-set size the operator declares, or None


def parse(doc: Any, where: str = "node bindings") -> list[Binding]:
    """Validated bindings from a decoded JSON document; ValueError naming the problem."""
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("nodes"), list):
        raise ValueError(f"{where}: expected {{'version': {VERSION}, 'nodes': [...]}}")
    out: list[Binding] = []
    for i, entry in enumerate(doc["nodes"]):
        if not isinstance(entry, dict) or not {"node_id", "client_id", "public_key"} <= set(entry) <= {
                "node_id", "client_id", "public_key", "examples"}:
            raise ValueError(f"{where}: entry {i} must have node_id, client_id, public_key (and optionally examples)")
        node, cid, key = entry["node_id"], entry["client_id"], entry["public_key"]
        if type(node) is not int or not 0 < node < 2**64 or type(cid) is not int or cid < 0:
            raise ValueError(f"{where}: entry {i}: node_id must be an integer in [1, 2^64), client_id >= 0")
        if not isinstance(key, str) or not key.startswith("ecdsa-sha2-"):
            raise ValueError(f"{where}: entry {i}: public_key must be an OpenSSH ECDSA public key")
        examples = entry.get("examples")
        if examples is not None and (type(examples) is not int or not 0 < examples < 2**53):
            raise ValueError(f"{where}: entry {i}: examples must be an integer in [1, 2^53)")
        out.append(Binding(node, cid, key.strip(), examples))
    for attr in ("node_id", "client_id", "public_key"):
        values = [getattr(b, attr) for b in out]
        dup = sorted({v for v in values if values.count(v) > 1}, key=str)
        if dup:
            raise ValueError(f"{where}: {attr} bound more than once: {str(dup[0])[:60]}")
    return out


def load(path: str | Path) -> list[Binding]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{ENV}={path}: cannot read the node bindings ({exc}); register nodes with "
                         "deploy/register_node.py, which writes them") from exc
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{ENV}={path}: not JSON ({exc})") from exc
    return parse(doc, f"{ENV}={path}")


def owners(bindings: list[Binding]) -> dict[int, int]:
    """node id -> the client id its key owns."""
    return {b.node_id: b.client_id for b in bindings}


def declared_examples(bindings: list[Binding]) -> dict[int, int]:
    """client id -> the training-set size the operator declared for it (clients declared without one absent)."""
    return {b.client_id: b.examples for b in bindings if b.examples is not None}


def write(path: str | Path, bindings: list[Binding]) -> None:
    """Write the table atomically, after validating it. Mode 0644: it holds public keys and ids only (what matters
    is who may write it), and the SuperLink's container user must read it."""
    path = Path(path)
    doc = {"version": VERSION, "nodes": [{"node_id": b.node_id, "client_id": b.client_id, "public_key": b.public_key,
                                          **({"examples": b.examples} if b.examples is not None else {})}
                                         for b in sorted(bindings, key=lambda b: b.client_id)]}
    parse(doc, str(path))
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, path)


def configured(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The table the environment names, or None."""
    value = environ.get(ENV, "")
    return Path(value) if value else None
