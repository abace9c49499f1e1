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

The plaintext side only binds loopback addresses, and anyone able to connect to it would act as this
operator (the full Control API). So on Linux the tunnel serves only connections opened by its own user:
it reads the connecting socket's owner from ``/proc/net/tcp`` / ``tcp6`` and closes connections of other
local users (logged). Where that table does not exist the tunnel refuses to start unless
``--allow-other-local-users`` says that every local user may act as the operator.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
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


PROC_NET_TCP = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def _proc_address(host: str, port: int) -> str:
    """An address as /proc/net/tcp writes it: the IP's bytes as host-order 32-bit hex words, ':', the port."""
    packed = ipaddress.ip_address(host).packed
    words = [packed[i:i + 4][::-1].hex().upper() for i in range(0, len(packed), 4)]
    return "".join(words) + f":{port:04X}"


def socket_owner(local: tuple[str, int], remote: tuple[str, int], tables=PROC_NET_TCP) -> int | None:
    """uid owning the TCP socket whose local end is ``local`` and remote end ``remote`` (Linux
    /proc/net/tcp*), or None when no table lists it."""
    candidates = set()
    for lhost, rhost in ((local[0], remote[0]), (f"::ffff:{local[0]}", f"::ffff:{remote[0]}")):
        try:
            candidates.add((_proc_address(lhost, local[1]), _proc_address(rhost, remote[1])))
        except ValueError:
            continue
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 7 and (cols[1], cols[2]) in candidates:
                return int(cols[7])
    return None


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
                server_name: str, ready: asyncio.Future | None = None, only_uid: int | None = None) -> None:
    """Forward every loopback connection to ``upstream`` over mTLS until cancelled; with ``only_uid``, only
    connections whose socket that user owns (the others are closed at once)."""

    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        if only_uid is not None:
            peer, here = c_writer.get_extra_info("peername")[:2], c_writer.get_extra_info("sockname")[:2]
            owner = socket_owner(peer, here)  # the client's socket: local end = its address, remote = ours
            if owner != only_uid:
                print(f"operator_tunnel: refused a connection from {peer[0]}:{peer[1]} owned by uid {owner} "
                      f"(only uid {only_uid} may use this operator's certificate)", file=sys.stderr, flush=True)
                c_writer.close()
                return
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
    parser.add_argument("--allow-other-local-users", action="store_true",
                        help="serve every local user (needed where /proc/net/tcp does not exist)")
    ns = parser.parse_args(argv)
    try:
        listen, upstream = split_address(ns.listen, allow_any_port=True), split_address(ns.connect)
        if not is_loopback(listen[0]):
            raise ValueError(f"--listen must be a loopback address (the CLI side is plaintext), got {listen[0]!r}")
        ctx = client_context(ns.ca, ns.cert, ns.key)
        if not ns.allow_other_local_users and not PROC_NET_TCP[0].exists():
            raise ValueError(f"{PROC_NET_TCP[0]} does not exist, so the tunnel cannot tell which local user "
                             "connects; pass --allow-other-local-users if every local user may act as the operator")
    except (ValueError, OSError, ssl.SSLError) as exc:
        parser.exit(2, f"operator_tunnel: {exc}\n")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        asyncio.run(serve(listen, upstream, ctx, ns.server_name or upstream[0],
                          only_uid=None if ns.allow_other_local_users else os.getuid()))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
