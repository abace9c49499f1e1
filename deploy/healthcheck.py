#!/usr/bin/env python
"""Container health check: GET ``/health`` of the local Flower process; exit 0 when it answers 200.

    python deploy/healthcheck.py superlink   # https://127.0.0.1:$SUPERLINK_PORT/health, verified with $CERTS_DIR/ca.crt
    python deploy/healthcheck.py supernode   # http://127.0.0.1:$RUNTIME_PORT/health (the node's Runtime API)

Used by the images' HEALTHCHECK and the Kubernetes exec probes: both Flower processes listen on loopback
only (deploy/superlink.sh, deploy/supernode.sh), which an exec probe reaches and an httpGet probe does
not. A SuperNode's /health says only that its Runtime API is up, so for a SuperNode the check also reads the
poll stamp that deploy/node_guard.py writes: unhealthy when the polling loop stopped, or when no poll
completed for ``POLL_STALE`` seconds (default 120: nodes poll every 3 s or faster and back off at most
20 s between retries) while no message is being processed, or when one message has been processed for over
``BUSY_STALE`` seconds (default 900: longer than the ServerApp's default round-timeout of 600 s, so the server
has stopped waiting for it: a hung or stolen task, not a slow one). A node whose stamp is missing is unhealthy.
"""

from __future__ import annotations

import argparse
import http.client
import os
import ssl
import sys
import time
from pathlib import Path


def poll_state(stale_s: float, now: float | None = None, busy_stale_s: float = 900.0) -> tuple[bool, str]:
    """(polling, detail) from the SuperNode's poll stamp (deploy/node_guard.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from deploy.node_guard import read_stamp, stamp_path

    path = stamp_path()
    try:
        state, when, detail = read_stamp(path)
    except (OSError, ValueError) as exc:
        return False, f"no poll stamp at {path} ({exc})"
    age = (time.time() if now is None else now) - when
    if state == "stopped":
        return False, f"polling stopped {age:.0f} s ago: {detail}"
    if state == "idle" and age > stale_s:
        return False, f"no poll of the SuperLink for {age:.0f} s (> POLL_STALE={stale_s:.0f})"
    if state == "busy" and age > busy_stale_s:
        return False, f"one message busy for {age:.0f} s (> BUSY_STALE={busy_stale_s:.0f}): hung or taken"
    return True, f"{state} {age:.0f} s ago"


def probe(kind: str, timeout: float = 5.0) -> tuple[bool, str]:
    """(healthy, detail) for ``kind`` in {superlink, supernode}, configured like the start scripts."""
    if kind == "superlink":
        port = int(os.environ.get("SUPERLINK_PORT", "9091"))
        certs = os.environ.get("CERTS_DIR", "")
        if certs:
            ctx = ssl.create_default_context(cafile=str(Path(certs) / "ca.crt"))
            conn: http.client.HTTPConnection = http.client.HTTPSConnection("localhost", port, timeout=timeout,
                                                                           context=ctx)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    elif kind == "supernode":
        port = int(os.environ.get("RUNTIME_PORT", "9094"))
        polling, why = poll_state(float(os.environ.get("POLL_STALE", "120")),
                                  busy_stale_s=float(os.environ.get("BUSY_STALE", "900")))
        if not polling:
            return False, f"{kind} on port {port}: {why}"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    else:
        raise ValueError(f"kind must be superlink or supernode, got {kind!r}")
    try:
        conn.request("GET", "/health")
        status = conn.getresponse().status
    except (OSError, ssl.SSLError, http.client.HTTPException) as exc:
        return False, f"{kind} on port {port}: {exc}"
    finally:
        conn.close()
    return status == 200, f"{kind} on port {port}: HTTP {status}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("superlink", "supernode"))
    parser.add_argument("--timeout", type=float, default=5.0)
    ns = parser.parse_args(argv)
    ok, detail = probe(ns.kind, ns.timeout)
    print(("healthy: " if ok else "unhealthy: ") + detail)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
