"""The UDP sockets of a transfer: batched sends (UDP GSO), batched receives (UDP GRO), and
never an IP fragment.

- **GSO** (``UDP_SEGMENT``, Linux >= 4.18): one ``sendmsg`` carries up to
  :data:`GSO_MAX_SEGMENTS` datagrams sealed back to back (a :class:`~swarm.udp.batch.Batch`);
  the kernel cuts them at ``segment`` bytes, each a datagram of its own with its own
  header and tag, so loss still costs one block.
- **GRO** (``UDP_GRO``, Linux >= 5.0): the kernel hands a socket that asks for it up to
  64 KiB of datagrams of one flow in one receive, with their size in a control message.
  It batches what arrives through a NAPI receive path (physical NICs; a veth with GRO on),
  and on loopback a GSO send arrives whole.
- **No fragments**: both sockets set "don't fragment" (``IP_PMTUDISC_DO``), and block sizes
  are chosen to fit the route's MTU (:func:`path_mtu`), so the kernel refuses to fragment
  rather than sending fragments that stall on a lossy path.

Where the kernel lacks an option, :class:`DataSocket` falls back (one ``sendto`` per
datagram, one ``recv`` per datagram) and says so in :attr:`DataSocket.gso`/``gro``: slower,
same bytes. ``SWARM_UDP_NO_GSO=1`` / ``SWARM_UDP_NO_GRO=1`` force the fallbacks (tests,
and kernels whose offloads misbehave).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import struct
from typing import Final

from swarm.udp.batch import Batch

log = logging.getLogger(__name__)

SOL_UDP: Final = getattr(socket, "SOL_UDP", 17)
UDP_SEGMENT: Final = getattr(socket, "UDP_SEGMENT", 103)
UDP_GRO: Final = getattr(socket, "UDP_GRO", 104)
IP_MTU_DISCOVER: Final = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO: Final = getattr(socket, "IP_PMTUDISC_DO", 2)
IP_MTU: Final = getattr(socket, "IP_MTU", 14)
IPV6_MTU_DISCOVER: Final = getattr(socket, "IPV6_MTU_DISCOVER", 23)
IPV6_PMTUDISC_DO: Final = getattr(socket, "IPV6_PMTUDISC_DO", 2)
IPV6_MTU: Final = getattr(socket, "IPV6_MTU", 24)
# Linux's values; Python's socket module has no names for them.
SO_SNDBUFFORCE: Final = getattr(socket, "SO_SNDBUFFORCE", 32)
SO_RCVBUFFORCE: Final = getattr(socket, "SO_RCVBUFFORCE", 33)

GSO_MAX_SEGMENTS: Final = 64
"""Datagrams per GSO send: the kernel's UDP_MAX_SEGMENTS (64 until Linux 6.9, 128 since)."""
GSO_MAX_BYTES: Final = 65000
"""Bytes per GSO send: one IP datagram's worth of payload (65507), rounded down."""
RECV_BUFFER: Final = 1 << 16
"""One receive: the largest datagram, or a GRO batch (at most 64 KiB)."""
RECV_BUDGET: Final = 64
"""Receives per readable event before the event loop gets a turn (4 MiB with GRO)."""
SOCKET_BUFFER: Final = 32 << 20
"""UDP receive buffer: at 1 Gbit/s, 32 MiB is 250 ms of data, enough to ride out a slow
event-loop turn (a GC pause, a piece read) without dropping. Above net.core.rmem_max
only root can set it (SO_RCVBUFFORCE); otherwise the kernel clamps it."""
SEND_BUFFER: Final = 512 << 10
"""UDP send buffer (the kernel doubles it: 1 MiB in flight). A datagram counts against it
until this host's own queue (qdisc, NIC) has sent it, so a full buffer is the local link
pushing back: the send waits (EAGAIN) instead of the queue dropping. With 32 MiB, the
far-region fleet's seeders overran their 200 Mbit uplink's queue: 20% of their GSO sends
were dropped there (``SndbufErrors``: UDP counts the qdisc's drops and returns success),
64 datagrams each, that the receivers had to NAK a round trip later. 1 MiB is 40 ms of a
200 Mbit link and 8 ms of 1 Gbit: more than a pacer turn."""
_GRO_CMSG: Final = socket.CMSG_SPACE(4)
_U16: Final = struct.Struct("=H")
_INT: Final = struct.Struct("=i")


def tune_buffers(
    sock: socket.socket, receive: int = SOCKET_BUFFER, send: int = SEND_BUFFER
) -> None:
    """Socket buffers of ``receive`` and ``send`` bytes: forced past
    ``net.core.[rw]mem_max`` with CAP_NET_ADMIN (root), else as much as those limits allow."""
    for force, plain, size in (
        (SO_RCVBUFFORCE, socket.SO_RCVBUF, receive),
        (SO_SNDBUFFORCE, socket.SO_SNDBUF, send),
    ):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, plain, size)


def forbid_fragments(sock: socket.socket) -> None:
    """Set "don't fragment": a datagram larger than the route's MTU fails with EMSGSIZE."""
    with contextlib.suppress(OSError):
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_DO)
        else:
            sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)


def path_mtu(sock: socket.socket) -> int | None:
    """The MTU of a connected socket's route (None if the kernel does not say)."""
    try:
        if sock.family == socket.AF_INET6:
            return sock.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU)
        return sock.getsockopt(socket.IPPROTO_IP, IP_MTU)
    except OSError:
        return None


def route_mtu(host: str, port: int, family: int = socket.AF_INET) -> int | None:
    """The MTU of our route to ``host`` (a throwaway connected socket; nothing is sent)."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((host, port))
            return path_mtu(sock)
    except OSError:
        return None


def _disabled(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


class DataSocket:
    """A non-blocking UDP socket with GSO sends and GRO receives where the kernel has them."""

    def __init__(self, sock: socket.socket, gso: bool = True, gro: bool = True) -> None:
        self.sock = sock
        sock.setblocking(False)
        tune_buffers(sock)
        forbid_fragments(sock)
        self.gso = gso and not _disabled("SWARM_UDP_NO_GSO") and self._probe_gso()
        self.gro = gro and not _disabled("SWARM_UDP_NO_GRO") and self._enable_gro()
        self._buf = bytearray(RECV_BUFFER)
        self._view = memoryview(self._buf)

    def _probe_gso(self) -> bool:
        try:
            # 0 = no segmentation by default; a kernel without UDP GSO says ENOPROTOOPT.
            self.sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
        except OSError:
            return False
        return True

    def _enable_gro(self) -> bool:
        try:
            self.sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        except OSError:
            return False
        return True

    @property
    def max_segments(self) -> int:
        return GSO_MAX_SEGMENTS if self.gso else 1

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def send_batch(self, batch: Batch, addr: tuple[str, int] | None = None) -> bool:
        """Send every datagram of ``batch`` (to ``addr``, or the connected peer). False if the
        socket buffer is full and nothing was sent: retry the same batch once writable.

        Raises:
            OSError: the kernel refused the datagrams (EMSGSIZE: larger than the route MTU).
        """
        sock = self.sock
        try:
            if batch.count == 1 or not self.gso:
                if batch.count == 1:
                    self._send_one(batch.data, addr)
                    return True
                return self._send_each(batch, addr)
            cmsg = [(SOL_UDP, UDP_SEGMENT, _U16.pack(batch.segment))]
            if addr is None:
                sock.sendmsg([batch.data], cmsg)
            else:
                sock.sendmsg([batch.data], cmsg, 0, addr)
            return True
        except BlockingIOError:
            return False
        except OSError as error:
            if batch.count > 1 and self.gso and error.errno in (errno.EIO, errno.EINVAL):
                # The route's device cannot take GSO (an xfrm tunnel...): fall back for good.
                log.warning("udp: GSO send failed (%s); sending datagrams one by one", error)
                self.gso = False
                return self._send_each(batch, addr)
            raise

    def _send_one(self, data: bytes | bytearray | memoryview, addr: tuple[str, int] | None) -> None:
        if addr is None:
            self.sock.send(data)
        else:
            self.sock.sendto(data, addr)

    def _send_each(self, batch: Batch, addr: tuple[str, int] | None) -> bool:
        datagrams = batch.datagrams()
        sent = 0
        try:
            for datagram in datagrams:
                self._send_one(datagram, addr)
                sent += 1
        except BlockingIOError:
            if sent == 0:
                return False
            # Part of the batch went: the rest is lost as if dropped on the path (the
            # receiver NAKs it), which is cheaper than tracking partial batches.
        return True

    def receive(self) -> tuple[memoryview, int, int, tuple[str, int] | None] | None:
        """One receive: ``(buffer, size, segment, source)``, datagrams of ``segment`` bytes
        back to back in ``buffer[:size]`` (``segment == size`` for one datagram), or None
        when nothing is waiting. The buffer is reused by the next call."""
        try:
            if self.gro:
                size, ancdata, flags, addr = self.sock.recvmsg_into([self._buf], _GRO_CMSG)
                segment = size
                for level, kind, data in ancdata:
                    if level == SOL_UDP and kind == UDP_GRO and len(data) >= _INT.size:
                        segment = _INT.unpack_from(data)[0]
                if flags & socket.MSG_TRUNC:
                    return self._view, 0, 1, addr  # larger than any datagram of ours: drop
                return self._view, size, segment, addr
            size, addr = self.sock.recvfrom_into(self._buf)
            return self._view, size, size, addr
        except (BlockingIOError, InterruptedError):
            return None
        except ConnectionRefusedError:
            # ICMP port unreachable for an earlier send (the peer is not listening yet).
            return self._view, 0, 1, None
