"""TCP connects that a lost SYN does not hold up for a second.

A connect whose SYN (or SYN-ACK) is lost waits for the kernel's first retransmission,
one second later (RFC 6298's initial timeout), whatever the path's round trip. On a far
node's start that second is on the critical path: in far-region (100 ms, 0.5% loss each
way), one run of six had a node whose first report reached the coordinator 1.17 s after
its daemon listened (the others' 0.14-0.2 s), and that node finished 0.7 s after the rest
(8.20 s against a median node's 7.52). :func:`race_connect` sends two SYNs at once on
two sockets and keeps the first that connects (redundant requests, as in Vulimiri et
al., "Low Latency via Redundancy", CoNEXT 2013): both are lost together at about 0.01%
where one was at 1%. The loser is closed at once; a server sees a connection that ends
before its first byte. Used where a far node's start waits on a connect: its reports
(the first brings its plan) and its UDP sessions' control connections; ``swarm fetch``
already reads the manifest twice at once (``ManifestPreread``).
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import struct
import time
from typing import Any, Final

DUPLICATE_SYNS: Final = 2
"""Sockets a connect opens at once; the first to connect is kept."""


def race_connect(
    address: tuple[str, int],
    timeout: Any = socket._GLOBAL_DEFAULT_TIMEOUT,  # type: ignore[attr-defined]
    source_address: tuple[str, int] | None = None,
    *,
    all_errors: bool = False,
) -> socket.socket:
    """:func:`socket.create_connection` (same arguments and errors; ``all_errors`` is
    accepted and ignored: the last error is raised), connecting :data:`DUPLICATE_SYNS`
    sockets to each address at once. The socket returned is blocking, under ``timeout``
    as ``create_connection`` leaves it."""
    limit = None if timeout is socket._GLOBAL_DEFAULT_TIMEOUT else timeout  # type: ignore[attr-defined]
    deadline = None if limit is None else time.monotonic() + limit
    host, port = address
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        try:
            sock = _first_of(family, kind, proto, sockaddr, source_address, deadline)
        except OSError as failed:
            error = failed
            continue
        sock.setblocking(True)
        if limit is not None:
            sock.settimeout(limit)
        return sock
    raise error if error is not None else OSError(f"getaddrinfo returned nothing for {host}")


def _first_of(
    family: int,
    kind: int,
    proto: int,
    sockaddr: Any,
    source_address: tuple[str, int] | None,
    deadline: float | None,
) -> socket.socket:
    """The first of :data:`DUPLICATE_SYNS` non-blocking connects to ``sockaddr`` to
    complete; the others closed."""
    pending: list[socket.socket] = []
    error: OSError | None = None
    with selectors.DefaultSelector() as selector:
        try:
            for _ in range(DUPLICATE_SYNS):
                sock = socket.socket(family, kind, proto)
                pending.append(sock)
                sock.setblocking(False)
                if source_address is not None:
                    sock.bind(source_address)
                code = sock.connect_ex(sockaddr)
                if code == 0:
                    pending.remove(sock)
                    return sock
                if code != errno.EINPROGRESS:
                    raise OSError(code, os.strerror(code))
                selector.register(sock, selectors.EVENT_WRITE)
            while pending:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise TimeoutError(errno.ETIMEDOUT, "timed out")
                for key, _ in selector.select(wait):
                    sock = key.fileobj  # type: ignore[assignment]
                    selector.unregister(sock)
                    pending.remove(sock)
                    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code == 0:
                        return sock
                    error = OSError(code, os.strerror(code))
                    sock.close()
            raise error if error is not None else OSError("connect failed")
        finally:
            for sock in pending:
                sock.close()


TCP_INFO_RTT_OFFSET: Final = 68
"""Offset of ``tcpi_rtt`` (microseconds) in Linux's ``struct tcp_info``."""


def handshake_rtt(sock: socket.socket) -> float | None:
    """The kernel's round-trip estimate of a TCP socket (seconds), stamped by the kernel,
    so a busy node's late wake-up is not in it: on a just-connected socket its SYN to
    SYN-ACK time, on an accepted one with a request read its smoothed estimate since.
    None where the platform has no ``TCP_INFO``."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        (micros,) = struct.unpack_from("I", info, TCP_INFO_RTT_OFFSET)
    except (AttributeError, OSError, struct.error):
        return None
    return micros / 1e6 if micros > 0 else None
