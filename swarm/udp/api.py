"""What the daemon names of the UDP transfer at import: the client's and the server's
defaults, the client's errors and statistics. Apart from the client and the server
themselves (the protocol machines, AES-GCM, GSO sockets: a third of the daemon's imports,
~45 ms of a node's start, while six nodes starting at once share two cores in the s3-fast
fleet), which load when a fetch uses UDP or once the daemon serves
(:func:`swarm.agent.serve.serve`). :mod:`swarm.udp.client` and :mod:`swarm.udp.server`
re-export them.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from swarm.errors import AccessDeniedError, SwarmError

DEFAULT_RATE_BPS = 1_000_000_000
"""What a client asks for by default: a 1 Gbit/s NIC. The rate rule finds the real
bottleneck within a few report intervals, and the server's cap bounds it anyway."""
CONNECT_TIMEOUT = 10.0
DEFAULT_RATE_CAP_BPS = 1_000_000_000
"""The server's cap over all its sessions: a 1 Gbit/s NIC's worth. Set it below the NIC
so a seeder's own fetches and BitTorrent traffic keep a share."""


class UdpError(SwarmError):
    """The UDP transfer failed; the message says why and what to check."""


class UdpAuthError(AccessDeniedError):
    """The fleet secrets of the two nodes differ (exit code 4)."""


@dataclass
class FetchStats:
    kept: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    unavailable: list[int] = field(default_factory=list)
    refused: str | None = None
    """The server's reason when it refused the whole request (unknown info-hash)."""
    bytes: int = 0
    """Payload bytes received (duplicates included)."""
    datagrams: int = 0
    duplicates: int = 0
    forged: int = 0
    naks: int = 0
    hash_failures: int = 0
    seconds: float = 0.0
    sender_rate_bps: int = 0
    block_size: int = 0
    """Payload bytes per datagram, as the server accepted it (fits the path MTU)."""
    srtt: float | None = None
    """Smoothed round-trip time of the control channel's reports, seconds."""
    min_rtt: float | None = None
    """The least of those round trips: the path's, without its queues."""
    gro: bool = False
    """Whether receives were batched by UDP GRO."""
    receives: int = 0
    """Receive calls that returned data (datagrams / receives: the GRO batch size)."""
    skipped: int = 0
    """Pieces another source brought first, which the server was told to skip."""

    @property
    def goodput_bps(self) -> float:
        """Payload bits per second over the whole fetch (handshake and tail included)."""
        return 8 * self.bytes / self.seconds if self.seconds > 0 else 0.0


def reserve_ports(host: str, port: int) -> tuple[socket.socket, socket.socket]:
    """Bind a UDP server's TCP control listener and its UDP data socket, both on ``port``
    of ``host`` (0: a free one, the same number for both), for
    :meth:`swarm.udp.server.UdpServer.start` to adopt later: a daemon owns its port (and
    fails on a busy one) from its start, and a peer's connection made before the server
    runs waits in the listen queue instead of being refused. Raises OSError."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's servers
        listener.bind(address)
        listener.listen(100)
        data = socket.socket(family, socket.SOCK_DGRAM)
    except BaseException:
        listener.close()
        raise
    try:
        data.bind((host, listener.getsockname()[1]))
    except BaseException:
        listener.close()
        data.close()
        raise
    return listener, data
