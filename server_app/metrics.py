"""A Prometheus endpoint for a run (issue ops-live item 4): per-round gauges and counters on ``/metrics``.

Opt-in with the run-config key ``metrics-port`` (0, the default: off). The endpoint binds ``metrics-host``
(default 127.0.0.1, loopback: a remote Prometheus scrapes through whatever the operator exposes on purpose).
It serves the Prometheus text exposition format (version 0.0.4) from the standard library's HTTP server, so
the stack needs no new package. Every series is named ``noniid_fl_*`` and carries no per-client label, so a
large federation does not explode the series count. Per round, from the round's results.json row
(:meth:`RunMetrics.observe`):

- gauges: ``round``, ``round_duration_seconds``, ``sampled_nodes``, ``replied_nodes``, ``failed_nodes``,
  ``rejected_updates`` (replies refused by the update checks or the reply schema), ``registered_nodes``,
  ``global_accuracy`` / ``global_loss`` (G-FL, when evaluated), ``validation_accuracy``, ``local_accuracy``
  (P-FL over the sampled clients), and every numeric entry of the method's metrics as
  ``strategy_metric{name="..."}``;
- counters: ``rounds_total``, ``bytes_sent_total``, ``bytes_received_total``, ``failures_total{kind="..."}``
  (timeout, error, node-lost, rejected, evicted, ...);
- ``run_info{method, dataset, partition}`` = 1 and ``run_start_time_seconds``.

The Fleet proxy's connection and refusal counters are served by ``deploy/proxy_exporter.py`` (``noniid_fl_proxy_*``).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import Counter
from http.server import ThreadingHTTPServer
from typing import Any, Mapping

from flcore.metrics_http import CONTENT_TYPE, metrics_handler  # noqa: F401 - CONTENT_TYPE is re-exported

PREFIX = "noniid_fl_"

# gauge name -> (results.json row key, help)
GAUGES: dict[str, tuple[str, str]] = {
    "round": ("round", "the last round that finished"),
    "round_duration_seconds": ("wall_time_s", "wall time of the last round"),
    "sampled_nodes": ("num_sampled", "clients sampled in the last round"),
    "replied_nodes": ("num_updates", "usable replies in the last round"),
    "failed_nodes": ("num_failures", "failures recorded in the last round (every kind)"),
    "registered_nodes": ("num_registered", "clients registered after the last round"),
    "global_accuracy": ("global_accuracy", "G-FL accuracy of the global model after the last round"),
    "global_loss": ("global_loss", "G-FL loss of the global model after the last round"),
    "validation_accuracy": ("val_accuracy", "validation accuracy after the last round"),
    "local_accuracy": ("local_accuracy", "P-FL accuracy over the sampled clients in the last round"),
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


_NAME = re.compile(r"[^a-zA-Z0-9_:]")


class RunMetrics:
    """The run's series, updated once per round; :meth:`exposition` renders them (thread-safe)."""

    def __init__(self, info: Mapping[str, str], start_time: float | None = None) -> None:
        self.info = dict(info)
        self.start_time = time.time() if start_time is None else start_time
        self.gauges: dict[str, float] = {}
        self.strategy: dict[str, float] = {}
        self.rounds = 0
        self.bytes_sent = 0.0
        self.bytes_received = 0.0
        self.failures: Counter[str] = Counter()
        self._lock = threading.Lock()

    def observe(self, row: Mapping[str, Any]) -> None:
        """Take one round's results.json row."""
        with self._lock:
            for name, (key, _) in GAUGES.items():
                value = _number(row.get(key))
                if value is not None:
                    self.gauges[name] = value
            failures = [f for f in row.get("failures", []) if isinstance(f, Mapping)]
            kinds = Counter(str(f.get("kind", "unknown")) for f in failures)
            self.gauges["rejected_updates"] = float(kinds.get("rejected", 0))
            self.failures.update(kinds)
            self.rounds += 1
            self.bytes_sent += _number(row.get("bytes_sent")) or 0.0
            self.bytes_received += _number(row.get("bytes_received")) or 0.0
            strategy = row.get("strategy") or {}
            if isinstance(strategy, Mapping):
                for key, value in strategy.items():
                    number = _number(value)
                    if number is not None:
                        self.strategy[str(key)] = number

    def exposition(self) -> str:
        """The Prometheus text format of every series."""
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            full = PREFIX + name
            out.append(f"# HELP {full} {help_}")
            out.append(f"# TYPE {full} {kind}")
            out.extend(f"{full}{labels} {_value(v)}" for labels, v in samples)

        with self._lock:
            labels = ",".join(f'{_NAME.sub("_", k)}="{_label(v)}"' for k, v in sorted(self.info.items()))
            metric("run_info", "gauge", "the run: method, dataset, partition", [(f"{{{labels}}}", 1.0)])
            metric("run_start_time_seconds", "gauge", "when the run started (unix time)", [("", self.start_time)])
            for name, (_, help_) in GAUGES.items():
                if name in self.gauges:
                    metric(name, "gauge", help_, [("", self.gauges[name])])
            if "rejected_updates" in self.gauges:
                metric("rejected_updates", "gauge", "replies rejected in the last round (update checks, reply schema)",
                       [("", self.gauges["rejected_updates"])])
            metric("rounds_total", "counter", "rounds finished by this process", [("", float(self.rounds))])
            metric("bytes_sent_total", "counter", "bytes of records sent to clients", [("", self.bytes_sent)])
            metric("bytes_received_total", "counter", "bytes of records received from clients",
                   [("", self.bytes_received)])
            metric("failures_total", "counter", "failures recorded, by kind",
                   [(f'{{kind="{_label(k)}"}}', float(n)) for k, n in sorted(self.failures.items())])
            if self.strategy:
                metric("strategy_metric", "gauge", "the method's own round metrics (results.json 'strategy')",
                       [(f'{{name="{_label(k)}"}}', v) for k, v in sorted(self.strategy.items())])
        return "\n".join(out) + "\n"


class MetricsServer:
    """``/metrics`` of a :class:`RunMetrics` over HTTP on (host, port), in a daemon thread; ``port`` 0 picks a
    free one (:attr:`port` says which)."""

    def __init__(self, metrics: RunMetrics, host: str, port: int) -> None:
        registry = metrics

        handler = metrics_handler(registry.exposition)
        self.metrics = metrics
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise OSError(f"run-config keys metrics-host/metrics-port: cannot listen on {host}:{port} ({exc})") from None
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
