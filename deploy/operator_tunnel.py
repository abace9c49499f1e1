#!/usr/bin/env python
"""Reach a SuperLink's Control API through the proxy with an operator certificate (mTLS).

The ``flwr`` CLI of flwr 1.42 cannot present a client certificate, and the proxy (deploy/proxy.sh) passes
the Control API only to clients that do. This forwarder listens on the operator's own loopback and
opens, for every connection the CLI makes, a TLS connection to the proxy's Control listener that
verifies the proxy against the federation CA and presents the operator's certificate:

    python deploy/operator_tunnel.py --listen 127.0.0.1:9443 --connect superlink.example.org:9443 \\
        --ca certs/ca.crt --cert certs/operators/alice.crt --key certs/operators/alice.key
    python deploy/connection.py prod 127.0.0.1:9443 --default      # insecure: plaintext stays on loopback
    flwr run . prod --stream

The plaintext side only binds loopback addresses (anyone able to connect to it acts as this operator:
on a shared machine, prefer ``ssh -L`` to the SuperLink host's loopback Control API instead).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
import ssl
import sys
from pathlib import Path


def split_address(text: str, allow_any_port: bool = False) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) -> (host, port); port 0 (any free one) only with
    ``allow_any_port``; a clear error for anything else."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 if allow_any_port else 1) <= int(port) < 65536:
        raise ValueError(f"address must be host:port, got {text!r}")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def client_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """TLS client context: verify the proxy with ``ca``, present ``cert``/``key``."""
    for path in (ca, cert, key):
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(cafile=str(ca))
    ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    return ctx


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, RuntimeError):
            pass


async def serve(listen: tuple[str, int], upstream: tuple[str, int], ctx: ssl.SSLContext,
                server_name: str, ready: asyncio.Future | None = None) -> None:
    """Forward every loopback connection to ``upstream`` over mTLS until cancelled."""

    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            u_reader, u_writer = await asyncio.open_connection(upstream[0], upstream[1], ssl=ctx,
                                                               server_hostname=server_name)
        except (OSError, ssl.SSLError) as exc:
            print(f"operator_tunnel: cannot reach {upstream[0]}:{upstream[1]}: {exc}", file=sys.stderr, flush=True)
            c_writer.close()
            return
        await asyncio.gather(_pipe(c_reader, u_writer), _pipe(u_reader, c_writer))

    server = await asyncio.start_server(handle, listen[0], listen[1])
    port = server.sockets[0].getsockname()[1]
    print(f"operator_tunnel: listening on {listen[0]}:{port} -> {upstream[0]}:{upstream[1]} (mTLS)", flush=True)
    if ready is not None:
        ready.set_result(port)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:9443", help="loopback host:port for the flwr CLI (port 0: any)")
    parser.add_argument("--connect", required=True, help="the proxy's Control listener, host:port")
    parser.add_argument("--ca", required=True, type=Path, help="federation CA (verifies the proxy)")
    parser.add_argument("--cert", required=True, type=Path, help="operator certificate (deploy/pki.sh operators/)")
    parser.add_argument("--key", required=True, type=Path, help="operator private key")
    parser.add_argument("--server-name", default="", help="name to verify the proxy certificate against "
                        "(default: the --connect host)")
    ns = parser.parse_args(argv)
    try:
        listen, upstream = split_address(ns.listen, allow_any_port=True), split_address(ns.connect)
        if not is_loopback(listen[0]):
            raise ValueError(f"--listen must be a loopback address (the CLI side is plaintext), got {listen[0]!r}")
        ctx = client_context(ns.ca, ns.cert, ns.key)
    except (ValueError, OSError, ssl.SSLError) as exc:
        parser.exit(2, f"operator_tunnel: {exc}\n")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        asyncio.run(serve(listen, upstream, ctx, ns.server_name or upstream[0]))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
