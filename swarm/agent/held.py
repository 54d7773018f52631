"""What the UDP server sees of the daemon: the fleet secret as UDP's key material, and
the pieces held, by artifact (:class:`HeldArtifacts`, a :class:`swarm.udp.PieceProvider`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from swarm.agent import treefs
from swarm.agent.registry import Artifact
from swarm.udp.wire import MIN_SECRET_LEN

if TYPE_CHECKING:
    from swarm.agent.daemon import Daemon

log = logging.getLogger(__name__)


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
