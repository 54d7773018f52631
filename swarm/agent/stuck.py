"""Pieces libtorrent counts as written but never keeps: found, so the fetch can repair them.

Seen in about 2 fleet runs of 25 (session 9's kept run): a node's libtorrent listed every
block of four pieces as "writing" for 100 s, its ``total_wanted_done`` said the file was
complete, the pieces never passed, and the data file held 16 KiB holes there. Nothing
would ever bring those pieces: libtorrent does not request a block it counts as written,
``add_piece`` skips such blocks, and the S3 reader leaves pieces in libtorrent's queue to
the peers. The cause inside libtorrent is not found; a write takes milliseconds, so a
piece seen that way for ``STUCK_AFTER`` seconds is stuck, and the daemon repairs it
(see ``Completion._repair``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from swarm.sources.blocks import BLOCK_WRITING

STUCK_AFTER = 10.0
"""Seconds a piece may have every block written or writing without libtorrent keeping
it. A write and a SHA-1 take milliseconds; even a CPU-starved node does both well
within this."""


class StuckPieces:
    """Follows libtorrent's download queue; says which pieces have been stuck long enough."""

    def __init__(self, after: float = STUCK_AFTER) -> None:
        self.after = after
        self._since: dict[int, float] = {}
        self.reported: set[int] = set()

    def update(
        self, queue: Iterable[Mapping[str, Any]], held: Collection[int], now: float
    ) -> list[int]:
        """Pieces stuck for ``after`` seconds and not reported before (each once)."""
        since: dict[int, float] = {}
        for piece in queue:
            index = piece["piece_index"]
            blocks = piece["blocks"]
            if index in held or not blocks:
                continue
            if all(block["state"] >= BLOCK_WRITING for block in blocks):
                since[index] = self._since.get(index, now)
        self._since = since
        stuck = sorted(
            i for i, t in since.items() if now - t >= self.after and i not in self.reported
        )
        self.reported.update(stuck)
        return stuck
