"""How far away a peer is: the round trips the kernel measured on this node's TCP
connections, or a few timed connects. The automatic UDP source (:mod:`.udpauto`) pulls
only from far holders."""

from __future__ import annotations

import socket
import time
from typing import Any, Final
from urllib.parse import urlsplit

from swarm.agent.tcpdiag import plain_address, tcp_min_rtts
from swarm.netconnect import handshake_rtt

RTT_PROBES: Final = 3
"""TCP connects timed before a session (their least is the holder's round trip)."""


def kernel_min_rtts() -> dict[str, float]:
    """The least round trip the kernel has measured on this node's TCP connections, per
    peer address, in seconds (empty if the kernel's table cannot be read:
    :func:`swarm.agent.tcpdiag.tcp_min_rtts`). Linux keeps each connection's minimum over
    a window of minutes (``tcp_min_rtt_wlen``), so a moment with the queues drained is
    enough: on a near path under load, three connects in a row all waited behind full tbf
    queues (40-120 ms in the s3-fast fleet at a quarter of its rates), and every node ran
    two UDP sessions on its LAN, each flooding a 62.5 Mbit uplink for three seconds for
    under 1 MB/s."""
    return tcp_min_rtts()


def _host_port(url: str | None) -> tuple[str, int] | None:
    """The host and port of ``url`` (the scheme's port if it names none), or None."""
    parts = urlsplit(url) if url else None
    if parts is None or not parts.hostname:
        return None
    try:
        return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a port out of range
        return None


def endpoint_addresses(url: str | None) -> set[str]:
    """The addresses the host of ``url`` resolves to, as :func:`kernel_min_rtts` names
    them (empty if it does not resolve, or no ``url``)."""
    endpoint = _host_port(url)
    if endpoint is None:
        return set()
    try:
        infos = socket.getaddrinfo(*endpoint, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError):
        return set()
    return {plain_address(str(info[4][0])) for info in infos}


def least_round_trip(rtts: dict[str, float], addresses: set[str]) -> float | None:
    """The least of ``rtts`` (by address, as :func:`kernel_min_rtts` gives them) over
    ``addresses``; None if the kernel has no connection to any of them."""
    return min((rtts[ip] for ip in addresses if ip in rtts), default=None)


def endpoint_round_trip(url: str | None) -> float | None:
    """The round trip to the host of ``url`` (an S3 endpoint), in seconds: the kernel's
    least over this node's connections to it (the catalog's and manifest's GETs leave
    one open, made before any load), else a few timed connects (a name that resolves to
    other addresses now, as S3's do); None if nothing answers (S3 refused) or no
    ``url``."""
    endpoint = _host_port(url)
    addresses = endpoint_addresses(url)
    if endpoint is None or not addresses:
        return None
    least = least_round_trip(kernel_min_rtts(), addresses)
    return least if least is not None else connect_rtt(*endpoint)


def s3_round_trip(client: Any) -> float | None:
    """:func:`endpoint_round_trip` to the endpoint of an S3 client
    (:class:`swarm.s3http.S3Client`), None without one."""
    return endpoint_round_trip(getattr(client, "endpoint_url", None))


def connect_rtt(
    host: str, port: int, tries: int = RTT_PROBES, timeout: float = 1.0
) -> float | None:
    """The least round trip of ``tries`` TCP connects to ``host:port``, or None if none
    connected. Each is the kernel's handshake time (:func:`handshake_rtt`), else the
    connect's wall time (the path's round trip plus this node's wake-up: a near fleet on
    two saturated cores timed its neighbours at 23-103 ms and ran UDP sessions on its
    LAN, sending up to 461 Mbit/s into 100 Mbit uplinks). Each connection is closed at
    once: the server sees a control connection end before its hello."""
    best: float | None = None
    for _ in range(tries):
        started = time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=timeout) as sock:
                took = time.monotonic() - started
                kernel = handshake_rtt(sock)
        except OSError:
            continue
        took = kernel if kernel is not None else took
        best = took if best is None else min(best, took)
    return best
