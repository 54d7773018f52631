"""What the UDP server sees of the daemon: the fleet secret as UDP's key material, and
the pieces held, by artifact (:class:`HeldArtifacts`, a :class:`swarm.udp.PieceProvider`);
and the daemon's UDP server itself, started a second after the daemon serves
(:class:`DeferredUdpServer`)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from swarm.agent import treefs
from swarm.agent.registry import Artifact
from swarm.udp.wire import MIN_SECRET_LEN

if TYPE_CHECKING:
    from swarm.agent.daemon import Daemon
    from swarm.udp.pieces import PieceProvider
    from swarm.udp.server import UdpServer

log = logging.getLogger(__name__)

UDP_LINK_SHARE = 0.93
"""The UDP server's send budget is this share of the node's link as the coordinator
measured it (:func:`swarm.coordinator.rates.link_capacity`). That figure is payload over
report intervals, and overstates a shaped link: far-region's seeders showed 210-217
Mbit/s for their 200 Mbit/s uplinks, and a datagram carries 42 bytes of IP, UDP and
Ethernet headers (3% of its 1,470) beside what the pacer counts. Budgeted at the whole
of it, the sessions kept the seeder's uplink queue full: their round trips ran at
0.22-0.31 s against 0.10 s (NAK rounds and session tails twice as long); at 0.88,
0.14-0.20 s, and sixteen alternating pairs ran 8.18 s mean (median 8.09, faster in ten)
against 8.30 (8.20). 0.93 since a node's S3 reads keep as few GETs in flight as fill its
link (:mod:`swarm.sources.s3width`): eight flows had overshot the shaped link, two do
not (the seeders' figures 192-209 Mbit/s, their budgets at 0.88 169-184 against 186-203
before; six alternating pairs ran 8.36 s mean against 7.82); twelve pairs at 0.93 ran
8.07 s against 8.00."""

UDP_SERVE_DELAY = 1.0
"""Seconds after a fresh daemon serves before its UDP server starts (its ports are bound
from the start, :func:`swarm.udp.api.reserve_ports`): loading the server is a third of
the daemon's imports, ~45 ms, and a new node has nothing to serve in its first second,
while its first S3 GET waits for the CPU (six nodes starting at once on two cores, the
s3-fast fleet)."""


def udp_secret(secret: str | None) -> bytes | None:
    """The fleet secret as UDP's key material; None (UDP off) without one or if too short."""
    if not secret:
        return None
    if len(secret.encode()) < MIN_SECRET_LEN:
        log.warning("SWARM_SECRET is shorter than %d bytes: UDP stays off", MIN_SECRET_LEN)
        return None
    return secret.encode()


@dataclass(frozen=True)
class HeldPieces:
    """An artifact this daemon holds, as the UDP server sees it (held pieces only)."""

    artifact: Artifact

    @property
    def piece_size(self) -> int:
        return self.artifact.manifest.piece_size

    @property
    def piece_count(self) -> int:
        return self.artifact.manifest.layout.count

    @property
    def total_size(self) -> int:
        return self.artifact.manifest.size

    def has(self, index: int) -> bool:
        return self.artifact.sink.have(index)

    def read(self, index: int) -> bytes:
        if self.artifact.manifest.is_tree:
            return treefs.read_piece(self.artifact.manifest, self.artifact.data_path, index)
        layout = self.artifact.manifest.layout
        with self.artifact.data_path.open("rb") as data:
            return os.pread(data.fileno(), layout.length(index), layout.offset(index))


class HeldArtifacts:
    """The daemon's :class:`swarm.udp.PieceProvider`."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def lookup(self, info_hash_hex: str) -> HeldPieces | None:
        artifact = self.daemon.artifacts.get(info_hash_hex.lower())
        return HeldPieces(artifact) if artifact else None


class DeferredUdpServer:
    """The daemon's UDP server, on the ports :func:`swarm.udp.api.reserve_ports` bound at
    the daemon's start, started by :meth:`run` (see :data:`UDP_SERVE_DELAY`). If it cannot
    start, the ports are closed (peers are refused at once rather than left waiting in
    the listen queue) and the node still fetches over UDP itself."""

    def __init__(
        self,
        key: bytes,
        provider: PieceProvider,
        sockets: tuple[socket.socket, socket.socket],
        host: str,
        port: int,
        rate_cap_bps: int,
    ) -> None:
        self.key, self.provider, self.sockets = key, provider, sockets
        self.host, self.port, self.rate_cap_bps = host, port, rate_cap_bps
        self.server: UdpServer | None = None
        self._link: float | None = None
        """The node's link as the coordinator last measured it, bytes/s (the budget)."""

    def follow_link(self, bytes_per_s: float) -> None:
        """The send budget follows the measured link (:data:`UDP_LINK_SHARE` of it), also
        when it is measured before the server runs."""
        self._link = bytes_per_s
        if self.server is not None:
            self.server.set_rate_cap(bytes_per_s * 8 * UDP_LINK_SHARE)

    async def run(self, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            from swarm.udp.server import UdpServer  # loads here: see UDP_SERVE_DELAY

            server = UdpServer(
                self.key, self.provider, host=self.host, port=self.port,
                rate_cap_bps=self.rate_cap_bps,
            )  # fmt: skip
            await server.start(self.sockets)  # which closes them if it cannot start
        except Exception:
            self._close_sockets()
            log.exception("udp: cannot serve held pieces; peers fetch them over TCP")
            return
        self.server = server
        if self._link is not None:
            self.follow_link(self._link)
        log.info("serving held pieces over UDP on %s:%d", self.host, self.port)

    async def close(self) -> None:
        if self.server is not None:
            await self.server.close()
        self._close_sockets()  # those of a server that never ran (closing twice is a no-op)

    def _close_sockets(self) -> None:
        for sock in self.sockets:
            sock.close()
