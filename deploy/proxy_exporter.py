#!/usr/bin/env python
"""The Fleet proxy's counters as Prometheus series (issue ops-live item 4): nginx ``stub_status`` + refused answers.

    python deploy/proxy_exporter.py --run-dir <PROXY_RUN_DIR> [--fleet-status-port 9081]
        [--control-status-port 9082] [--listen 127.0.0.1:9113]

``deploy/proxy.sh`` gives its Fleet and Control nginx instances each a ``stub_status`` page on loopback
(``FLEET_STATUS_PORT``, ``CONTROL_STATUS_PORT``). It also logs the status of every answer of 400 or more to
``<PROXY_RUN_DIR>/{fleet,control}-refused.log``, one number per line. This exporter reads both on every
scrape and serves ``/metrics`` in Prometheus' text format, on loopback by default. Standard library and this
repository's ``flcore/metrics_http.py`` only (the SuperLink image has both; the proxy image has no Python); it
needs the proxy's run directory, so it runs beside the proxy (same host, or a container sharing that
directory and the network namespace). Series, each with ``listener="fleet"|"control"``:

- ``noniid_fl_proxy_up``: 1 when the listener's stub_status answered this scrape;
- ``noniid_fl_proxy_connections{state="active"|"reading"|"writing"|"waiting"}`` (gauges);
- ``noniid_fl_proxy_connections_accepted_total``, ``..._handled_total`` (accepted - handled: connections
  dropped for lack of worker connections), ``noniid_fl_proxy_requests_total``;
- ``noniid_fl_proxy_refused_total{status}``: answers of 400 or more by status. For the Fleet listener, 503 is
  a per-address limit (``FLEET_CONN_PER_IP``, ``FLEET_REQ_RATE``), 413 a body over its route's limit, 502 the
  SuperLink's slots full or the SuperLink down, 401/412 a node without a registered key, 404 a path
  other than ``/v1/fleet/<rpc>``, 408 a slow client timed out. For Control, 400 is a client without an
  operator certificate.

A log file that shrinks (rotated, truncated) is read from its start again; the counters never go down.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from a checkout
from flcore.metrics_http import metrics_handler  # noqa: E402

PREFIX = "noniid_fl_proxy_"
LISTENERS = ("fleet", "control")

_STUB = re.compile(r"Active connections:\s*(\d+)\s*server accepts handled requests\s*(\d+)\s+(\d+)\s+(\d+)\s*"
                   r"Reading:\s*(\d+)\s*Writing:\s*(\d+)\s*Waiting:\s*(\d+)", re.S)


def parse_stub_status(text: str) -> dict[str, int]:
    """nginx's stub_status page -> its seven numbers. Raises ValueError naming what it got otherwise."""
    m = _STUB.search(text)
    if not m:
        raise ValueError(f"not an nginx stub_status page: {text[:120]!r}")
    keys = ("active", "accepted", "handled", "requests", "reading", "writing", "waiting")
    return dict(zip(keys, (int(g) for g in m.groups())))


@dataclass
class RefusalLog:
    """Counts the statuses in one refused-answers log, reading only what was appended since the last call."""

    path: Path
    offset: int = 0
    partial: bytes = b""
    counts: Counter[str] = field(default_factory=Counter)

    def update(self) -> Counter[str]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return self.counts
        if size < self.offset:            # rotated or truncated: the new file from its start
            self.offset, self.partial = 0, b""
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()        # an unfinished last line waits for the next read
        for line in lines:
            status = line.strip().decode("ascii", "replace")
            if status.isdigit() and len(status) == 3:
                self.counts[status] += 1
        return self.counts


def exposition(stubs: dict[str, dict[str, int] | None], refused: dict[str, Counter[str]]) -> str:
    """The Prometheus text of every listener's counters (``None``: its stub_status did not answer)."""
    out: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        out.append(f"# HELP {PREFIX}{name} {help_}")
        out.append(f"# TYPE {PREFIX}{name} {kind}")
        out.extend(f"{PREFIX}{name}{{{labels}}} {value:g}" for labels, value in samples)

    up = [(f'listener="{n}"', 0.0 if s is None else 1.0) for n, s in stubs.items()]
    metric("up", "gauge", "1 when the listener's nginx stub_status answered this scrape", up)
    live = {n: s for n, s in stubs.items() if s is not None}
    metric("connections", "gauge", "client connections by state (nginx stub_status)",
           [(f'listener="{n}",state="{k}"', float(s[k])) for n, s in live.items()
            for k in ("active", "reading", "writing", "waiting")])
    for key, help_ in (("accepted", "client connections accepted"),
                       ("handled", "client connections handled (accepted - handled: dropped at the worker limit)")):
        metric(f"connections_{key}_total", "counter", help_,
               [(f'listener="{n}"', float(s[key])) for n, s in live.items()])
    metric("requests_total", "counter", "client requests", [(f'listener="{n}"', float(s["requests"]))
                                                          for n, s in live.items()])
    metric("refused_total", "counter", "answers with status >= 400, by status",
           [(f'listener="{n}",status="{st}"', float(c)) for n, counts in refused.items()
            for st, c in sorted(counts.items())])
    return "\n".join(out) + "\n"


class ProxyExporter:
    """Scrapes the proxy's stub_status pages and refusal logs on each ``/metrics`` request."""

    def __init__(self, run_dir: Path, status_ports: dict[str, int], timeout: float = 2.0) -> None:
        if not run_dir.is_dir():
            raise FileNotFoundError(f"--run-dir {run_dir}: not a directory (the proxy's PROXY_RUN_DIR)")
        self.status_ports, self.timeout = dict(status_ports), timeout
        self.logs = {n: RefusalLog(run_dir / f"{n}-refused.log") for n in status_ports}
        self._lock = threading.Lock()

    def _stub(self, port: int) -> dict[str, int] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/stub_status", timeout=self.timeout) as resp:
                return parse_stub_status(resp.read().decode("ascii", "replace"))
        except (OSError, ValueError):
            return None

    def render(self) -> str:
        stubs = {n: self._stub(p) for n, p in self.status_ports.items()}
        with self._lock:
            refused = {n: Counter(log.update()) for n, log in self.logs.items()}
        return exposition(stubs, refused)


def serve(exporter: ProxyExporter, host: str, port: int) -> ThreadingHTTPServer:
    try:
        httpd = ThreadingHTTPServer((host, port), metrics_handler(exporter.render))
    except OSError as exc:
        raise OSError(f"--listen {host}:{port}: cannot listen ({exc})") from None
    httpd.daemon_threads = True
    return httpd


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="the proxy's PROXY_RUN_DIR")
    parser.add_argument("--fleet-status-port", type=int, default=9081)
    parser.add_argument("--control-status-port", type=int, default=9082)
    parser.add_argument("--listen", default="127.0.0.1:9113", help="host:port of /metrics [127.0.0.1:9113]")
    ns = parser.parse_args(argv)
    host, _, port = ns.listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--listen {ns.listen!r}: expected host:port")
    try:
        exporter = ProxyExporter(ns.run_dir, {"fleet": ns.fleet_status_port, "control": ns.control_status_port})
        httpd = serve(exporter, host.strip("[]"), int(port))
    except (OSError, FileNotFoundError) as exc:
        parser.exit(2, f"proxy_exporter.py: {exc}\n")
    print(f"proxy_exporter.py: /metrics on {ns.listen} from {ns.run_dir}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()
