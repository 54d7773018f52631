"""Piece math: sizes, ranges and hashing. Pure functions, no I/O beyond a given file object."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

KiB = 1024
MiB = 1024 * KiB

MIN_PIECE_SIZE = 1 * MiB
"""Smallest default piece. Below ~1 MiB the per-piece costs (a hash check, an ``add_piece``
call, a coordinator stripe entry, an S3 request) start to dominate on fast links."""

MAX_PIECE_SIZE = 16 * MiB
"""Largest default piece: the top of AWS's recommended 8-16 MiB ranged-GET size, and a
bound on what one bad piece costs to fetch again."""

TARGET_PIECE_COUNT = 2048
"""Default piece size aims at about this many pieces, enough for a swarm of hundreds of
nodes to exchange different pieces, while the metainfo stays around 40 KiB of SHA-1s."""

DEFAULT_RANGE_SIZE = 16 * MiB
"""S3 ranged GETs are this size (AWS recommends 8-16 MiB), rounded down to whole pieces."""


def default_piece_size(size: int) -> int:
    """The piece size used when ``--piece-size`` is not given.

    Rule: the smallest power of two that gives at most ``TARGET_PIECE_COUNT`` pieces,
    clamped to [``MIN_PIECE_SIZE``, ``MAX_PIECE_SIZE``]. So 128 MiB -> 1 MiB pieces,
    4 GiB -> 2 MiB, 64 GiB and up -> 16 MiB. An empty file still gets ``MIN_PIECE_SIZE``.
    """
    piece = MIN_PIECE_SIZE
    while piece < MAX_PIECE_SIZE and piece * TARGET_PIECE_COUNT < size:
        piece *= 2
    return piece


MAX_ACCEPTED_PIECE_SIZE = 64 * 1024 * 1024
"""The largest ``--piece-size`` swarm publishes and accepts: libtorrent refuses torrents
whose pieces are much larger (a 512 MiB piece made a daemon fetch fail with a 500), and a
daemon holds pieces in memory on their way to disk."""


def validate_piece_size(piece_size: int) -> None:
    """BitTorrent clients expect a power of two of at least 16 KiB (BEP 3 practice, BEP 52);
    libtorrent and the daemon's memory bound cap it at :data:`MAX_ACCEPTED_PIECE_SIZE`."""
    top = MAX_ACCEPTED_PIECE_SIZE
    if piece_size < 16 * KiB or piece_size & (piece_size - 1) or piece_size > top:
        raise ValueError(
            f"piece size must be a power of two from 16 KiB to {top >> 20} MiB, got {piece_size}"
        )


@dataclass(frozen=True)
class PieceLayout:
    """How a file of ``size`` bytes splits into pieces of ``piece_size`` (the last may be short)."""

    size: int
    piece_size: int

    @property
    def count(self) -> int:
        return max(1, -(-self.size // self.piece_size)) if self.size else 0

    def offset(self, index: int) -> int:
        return index * self.piece_size

    def length(self, index: int) -> int:
        if not 0 <= index < self.count:
            raise IndexError(f"piece {index} out of range 0..{self.count - 1}")
        return min(self.piece_size, self.size - index * self.piece_size)


@dataclass(frozen=True)
class ByteRange:
    """A run of consecutive pieces ``[first, first + count)`` as one ranged GET."""

    first: int
    count: int
    start: int
    end: int  # exclusive

    @property
    def header(self) -> str:
        """The HTTP ``Range`` header value (inclusive end, RFC 9110)."""
        return f"bytes={self.start}-{self.end - 1}"

    @property
    def pieces(self) -> range:
        return range(self.first, self.first + self.count)


def plan_ranges(
    layout: PieceLayout, wanted: Iterable[int], range_size: int = DEFAULT_RANGE_SIZE
) -> list[ByteRange]:
    """Group the wanted pieces into ranged GETs of at most ``range_size`` (whole pieces only).

    Consecutive wanted pieces share a request; a gap starts a new one. A range holds at
    least one piece even if a piece is bigger than ``range_size``.
    """
    per_range = max(1, range_size // layout.piece_size)
    ranges: list[ByteRange] = []
    run: list[int] = []

    def close() -> None:
        if run:
            first, count = run[0], len(run)
            start = layout.offset(first)
            end = layout.offset(first + count - 1) + layout.length(first + count - 1)
            ranges.append(ByteRange(first, count, start, end))
            run.clear()

    for index in sorted(set(wanted)):
        if run and (index != run[-1] + 1 or len(run) >= per_range):
            close()
        run.append(index)
    close()
    return ranges


def sha1_pieces(stream: BinaryIO, piece_size: int) -> Iterator[tuple[bytes, bytes]]:
    """Yield ``(piece_bytes, sha1_digest)`` for each piece read from ``stream``."""
    while True:
        chunk = stream.read(piece_size)
        if not chunk:
            return
        yield chunk, hashlib.sha1(chunk).digest()


SIZE_UNITS = {"": 1, "K": KiB, "M": MiB, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'1M', '4MiB', '262144' -> bytes (binary units); ValueError for anything else."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not a size (examples: 1M, 4MiB, 262144)")
    return int(match.group(1)) * SIZE_UNITS[match.group(2).upper()]


def file_sha256(path: Path, chunk: int = 8 * MiB) -> str:
    """Hex SHA-256 of a file, read with ``readinto`` into one reused buffer (hashlib
    drops the GIL while it hashes each slice). Not mmap: a file another process
    truncates meanwhile would kill this one with SIGBUS instead of a short read."""
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(chunk))
    with path.open("rb", buffering=0) as stream:
        while got := stream.readinto(buffer):  # type: ignore[attr-defined]
            digest.update(buffer[:got])
    return digest.hexdigest()


def write_random_file(path: Path, size: int, seed: int | None = None) -> str:
    """Fill ``path`` with ``size`` incompressible bytes (repeatable with ``seed``);
    return their SHA-256. For demos, tests and benchmarks."""
    import random

    rng = random.Random(seed)
    digest = hashlib.sha256()
    with path.open("wb") as out:
        left = size
        while left:
            block = rng.randbytes(min(left, 8 * MiB))
            digest.update(block)
            out.write(block)
            left -= len(block)
    return digest.hexdigest()
