"""The kernel's table of this node's TCP connections, read over netlink (``sock_diag``):
what ``ss -t -i`` prints, without starting ``ss``.

The automatic UDP source asks for the kernel's least round trip per peer on every look
for a holder, and S3's distance at every fetch's start. Each ``ss`` was a fork and exec
of iproute2 from the daemon: in the far-region fleet its processes took 0.5 CPU-s of a
run (perf; two cores for four new nodes, two seeders, S3 and the WAN emulator), and one
took 12 ms on an idle machine against 0.7 ms for this dump. (pyroute2 reads the same
table, but its import alone took 0.19 s here.)

One dump per address family: a ``SOCK_DIAG_BY_FAMILY`` request for TCP sockets in every
state but LISTEN, with the ``INET_DIAG_INFO`` extension (``struct tcp_info``, whose
``tcpi_min_rtt`` is the connection's least round trip in microseconds).
"""

from __future__ import annotations

import ipaddress
import math
import socket
import struct
from collections.abc import Iterator
from typing import Final

NETLINK_SOCK_DIAG: Final = 4
SOCK_DIAG_BY_FAMILY: Final = 20
NLM_F_REQUEST: Final = 0x1
NLM_F_DUMP: Final = 0x300
NLMSG_ERROR: Final = 2
NLMSG_DONE: Final = 3
INET_DIAG_INFO: Final = 2
TCP_LISTEN: Final = 10
ALL_BUT_LISTEN: Final = 0xFFF & ~(1 << TCP_LISTEN)

NLMSG_HEADER: Final = struct.Struct("=IHHII")  # len, type, flags, seq, pid
DIAG_REQUEST: Final = struct.Struct("=BBBxI48x")  # family, protocol, ext, states, sockid
DIAG_MESSAGE: Final = struct.Struct("=BBBB2s2s16s16s")  # ..., sport, dport, src, dst
DIAG_MESSAGE_SIZE: Final = 72  # inet_diag_msg: the socket's id, then five u32
RTATTR: Final = struct.Struct("=HH")
TCPI_MIN_RTT: Final = struct.Struct("=148xI")  # tcp_info.tcpi_min_rtt (Linux >= 4.6)
UNMEASURED: Final = 0xFFFFFFFF
"""``tcpi_min_rtt`` of a connection with no round-trip sample yet (``minmax_reset`` to
``~0U``: one still connecting, or just connected)."""

RECEIVE_BYTES: Final = 1 << 16


def _align(n: int) -> int:
    return (n + 3) & ~3


def _messages(sock: socket.socket) -> Iterator[memoryview]:
    """The payloads of a dump's ``SOCK_DIAG_BY_FAMILY`` answers, to its end."""
    while True:
        data = memoryview(sock.recv(RECEIVE_BYTES))
        if not data:
            return
        offset = 0
        while offset + NLMSG_HEADER.size <= len(data):
            length, kind, _, _, _ = NLMSG_HEADER.unpack_from(data, offset)
            if length < NLMSG_HEADER.size or kind in (NLMSG_DONE, NLMSG_ERROR):
                return
            if kind == SOCK_DIAG_BY_FAMILY:
                yield data[offset + NLMSG_HEADER.size : offset + length]
            offset += _align(length)


def _min_rtt(attributes: memoryview) -> float | None:
    """``tcpi_min_rtt`` in seconds from a message's attributes (None without it, or not
    measured yet: 0, or the kernel's initial ``~0U``, which read as 4295 s once made
    ``swarm fetch`` take a near S3 for one in another region)."""
    offset = 0
    while offset + RTATTR.size <= len(attributes):
        length, kind = RTATTR.unpack_from(attributes, offset)
        if length < RTATTR.size:
            return None
        if kind == INET_DIAG_INFO and length - RTATTR.size >= TCPI_MIN_RTT.size:
            (micros,) = TCPI_MIN_RTT.unpack_from(attributes, offset + RTATTR.size)
            return micros / 1e6 if 0 < micros < UNMEASURED else None
        offset += _align(length)
    return None


def plain_address(ip: str) -> str:
    """``ip`` as libtorrent names a peer, and as :func:`tcp_min_rtts` keys it: no zone,
    an IPv4-mapped IPv6 address as IPv4."""
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped if mapped is not None else address)


def _peer(family: int, raw: bytes) -> str:
    """A diag message's peer address (:func:`plain_address`)."""
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    return plain_address(socket.inet_ntop(socket.AF_INET6, raw))


def tcp_min_rtts() -> dict[str, float]:
    """The least round trip the kernel has measured on this network namespace's TCP
    connections, per peer address, in seconds; empty where netlink's ``sock_diag`` is not
    to be had (a kernel without it, a sandbox that forbids netlink)."""
    found: dict[str, float] = {}
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as sock:
            sock.settimeout(2.0)
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
                request = DIAG_REQUEST.pack(
                    family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), ALL_BUT_LISTEN
                )
                size = NLMSG_HEADER.size + len(request)
                header = NLMSG_HEADER.pack(
                    size, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
                )
                sock.send(header + request)
                for message in _messages(sock):
                    if len(message) < DIAG_MESSAGE_SIZE:
                        continue
                    rtt = _min_rtt(message[DIAG_MESSAGE_SIZE:])
                    if rtt is None:
                        continue
                    fam, *_, dst = DIAG_MESSAGE.unpack_from(message)
                    peer = _peer(fam, dst)
                    found[peer] = min(found.get(peer, math.inf), rtt)
    except OSError:
        pass  # what was read stands; none if netlink is not to be had
    return found
