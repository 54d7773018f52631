"""What the UDP server serves: the pieces of the artifacts this node holds.

:class:`~swarm.udp.server.UdpServer` looks each request's info-hash up in a
:class:`PieceProvider` (never a path) and reads pieces through :class:`ArtifactPieces` in a
worker thread. :class:`FilePieces` and :class:`StaticProvider` serve complete files (a
seeder's artifact, tests, bench); the daemon's provider is
:class:`swarm.agent.held.HeldArtifacts`.
"""

from __future__ import annotations

import functools
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from swarm.udp import protocol as p


class ArtifactPieces(Protocol):
    """The pieces of one artifact this node holds."""

    @property
    def piece_size(self) -> int: ...

    @property
    def piece_count(self) -> int: ...

    @property
    def total_size(self) -> int: ...

    def has(self, index: int) -> bool: ...

    def read(self, index: int) -> bytes | memoryview:
        """The piece's bytes (blocking is fine: called in a worker thread)."""
        ...


class PieceProvider(Protocol):
    def lookup(self, info_hash_hex: str) -> ArtifactPieces | None:
        """The artifact with this info-hash (lowercase hex), or None if we have none."""
        ...


@dataclass(frozen=True)
class FilePieces:
    """A complete file as :class:`ArtifactPieces` (a seeder's artifact, tests, bench).

    Pieces are views of one read-only memory map of the file: the sender seals straight
    from the page cache, with no copy and no allocation per piece. The file must not
    shrink while it is served (a read checks its size first)."""

    path: Path
    piece_size: int
    total_size: int

    @classmethod
    def open(cls, path: Path | str, piece_size: int) -> FilePieces:
        return cls(Path(path), piece_size, Path(path).stat().st_size)

    @property
    def piece_count(self) -> int:
        return p.piece_count_for(self.total_size, self.piece_size)

    def has(self, index: int) -> bool:
        return 0 <= index < self.piece_count

    @functools.cached_property
    def _map(self) -> mmap.mmap:
        with self.path.open("rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def read(self, index: int) -> memoryview:
        offset = index * self.piece_size
        length = min(self.piece_size, self.total_size - offset)
        if self.path.stat().st_size < offset + length or len(self._map) < offset + length:
            raise OSError(f"{self.path}: short read of piece {index} (the file shrank)")
        return memoryview(self._map)[offset : offset + length]


class StaticProvider:
    """A fixed map of info-hash (hex) -> pieces."""

    def __init__(self, artifacts: dict[str, ArtifactPieces]) -> None:
        self._artifacts = {k.lower(): v for k, v in artifacts.items()}

    def lookup(self, info_hash_hex: str) -> ArtifactPieces | None:
        return self._artifacts.get(info_hash_hex.lower())


__all__ = [
    "ArtifactPieces",
    "FilePieces",
    "PieceProvider",
    "StaticProvider",
]
