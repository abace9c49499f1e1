"""Slow push-object uploads and the SuperLink's upstream slots (issue hostile-participant item 3).

The real proxy (deploy/proxy.sh) stands in front of a stand-in SuperLink that only counts the TCP connections
nginx opens to it. 28 uploaders send a full `push-object` header declaring a body at the route's limit, then one
body byte every 2 s (under client_body_timeout, which bounds only the gap between reads). Streamed
(FLEET_OBJECT_BUFFERING=0, the default) each one opens a connection to the SuperLink at once and holds one of
its FLEET_UPSTREAM_CONNS (24) slots; read whole first (FLEET_OBJECT_BUFFERING=1) none reaches it, and a complete
upload sent meanwhile still goes through."""

from __future__ import annotations

import socket
import ssl
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests._proxy_util import start_proxy  # noqa: E402

OBJECT_LIMIT = 64 * 1024
HEADER = ("POST /v1/fleet/push-object HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/protobuf\r\n"
          "Content-Length: {n}\r\n\r\n")


class CountingUpstream:
    """A TCP listener that accepts and holds every connection (never answers): ``accepted`` counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def _slow_upload(port: int, ctx: ssl.SSLContext, stop: threading.Event, opened: list[int]) -> None:
    conn = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="localhost")
    conn.sendall(HEADER.format(n=OBJECT_LIMIT).encode())
    opened.append(1)
    try:
        while not stop.wait(2.0):
            conn.sendall(b"\0")
    except OSError:
        pass
    conn.close()


def _whole_upload(port: int, ctx: ssl.SSLContext) -> None:
    """A complete push-object body of 40 KiB (the stand-in SuperLink never answers: the request is only sent)."""
    conn = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="localhost")
    conn.sendall(HEADER.format(n=40 * 1024).encode() + b"\0" * (40 * 1024))
    time.sleep(0.5)
    conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("buffering,reach", [("0", 24), ("1", 0)], ids=["streamed", "buffered"])
def test_slow_push_object_uploads_hold_upstream_slots_only_when_streamed(tmp_path: Path, buffering: str,
                                                                         reach: int) -> None:
    upstream = CountingUpstream()
    proxy = start_proxy(tmp_path, upstream=upstream.port, FLEET_OBJECT_MAX_BODY=f"{OBJECT_LIMIT // 1024}k",
                        FLEET_OBJECT_BUFFERING=buffering, CLIENT_BODY_TIMEOUT="10s")
    ctx = ssl.create_default_context(cafile=str(proxy.ca))
    stop, opened = threading.Event(), []
    threads = [threading.Thread(target=_slow_upload, args=(proxy.fleet, ctx, stop, opened), daemon=True)
               for _ in range(28)]
    try:
        for t in threads:
            t.start()
        deadline = time.time() + 15
        while len(opened) < 28 and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)     # headers read; under proxy_connect_timeout (5 s), after which nginx drops an upstream
        held = upstream.accepted
        _whole_upload(proxy.fleet, ctx)
        deadline = time.time() + 3
        while upstream.accepted == held and buffering != "0" and time.time() < deadline:
            time.sleep(0.1)
        after_whole = upstream.accepted
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        proxy.stop()
        upstream.close()
    assert len(opened) == 28
    # streamed: each slow upload holds an upstream slot at once, up to max_conns (FLEET_UPSTREAM_CONNS, 24);
    # buffered: none reaches the SuperLink until its body is whole, and a whole upload still goes through
    assert held == reach, (held, (tmp_path / "proxy.log").read_text()[-2000:])
    if buffering != "0":
        assert after_whole == 1, after_whole
    print(f"\n[push-object slow uploads] FLEET_OBJECT_BUFFERING={buffering}: 28 slow uploads opened {held} "
          f"connections to the SuperLink (FLEET_UPSTREAM_CONNS 24); a whole upload then: {after_whole - held}")
