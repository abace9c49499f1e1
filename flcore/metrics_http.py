"""Serving Prometheus' text exposition over HTTP with the standard library only (the ServerApp's
``server_app/metrics.py`` and the proxy's ``deploy/proxy_exporter.py`` both serve one this way)."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler
from typing import Any, Callable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"   # Prometheus text exposition format 0.0.4


def metrics_handler(render: Callable[[], str]) -> type[BaseHTTPRequestHandler]:
    """A request handler that answers ``GET /metrics`` with ``render()`` and everything else with 404; scrapes
    are not logged."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
            return

    return Handler
