"""libtorrent's download queue as the S3 reader sees it: the pieces asked of peers, those
with blocks already in, and the blocks written per piece (``get_download_queue``, a dict
per piece in flight and one per block)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

from swarm.sources.blocks import BLOCK_FINISHED, BLOCK_WRITING

IN_FLIGHT_TTL = 1.0
"""Seconds an :class:`InFlight` answer is reused (a stale one costs at most a duplicate
piece, which libtorrent drops)."""


def queued(queue: list[dict[str, Any]]) -> set[int]:
    """Pieces of libtorrent's download queue (``get_download_queue``): asked of peers."""
    return {piece["piece_index"] for piece in queue}


def partly_received(queue: list[dict[str, Any]]) -> set[int]:
    """Pieces of libtorrent's download queue (``get_download_queue``) with blocks
    already received (being written or written)."""
    return {
        piece["piece_index"]
        for piece in queue
        if any(block["state"] >= BLOCK_WRITING for block in piece["blocks"])
    }


class InFlight:
    """Pieces partly downloaded from peers, asked of libtorrent at most every
    ``IN_FLIGHT_TTL`` seconds: ``get_download_queue`` lists every block in flight as
    Python dicts, and asked for each fill read it took most of a daemon's CPU."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._pieces: set[int] = set()
        self._finished: dict[int, frozenset[int]] = {}
        self._at = -math.inf

    def __call__(self, max_age: float = IN_FLIGHT_TTL) -> set[int]:
        self._look(max_age)
        return self._pieces

    def finished(self, max_age: float = IN_FLIGHT_TTL) -> dict[int, frozenset[int]]:
        """Per piece, the blocks libtorrent has written (:mod:`swarm.agent.topup`). An
        older answer only knows fewer: a written block stays written until its piece is
        held (or fails its hash, and the top-up's SHA-1 check catches that)."""
        self._look(max_age)
        return self._finished

    def _look(self, max_age: float) -> None:
        now = time.monotonic()
        if now - self._at >= max_age:
            queue = self.handle.get_download_queue()
            self._pieces = queued(queue)
            self._finished = finished_blocks(queue)
            self._at = now


def finished_blocks(queue: Iterable[Mapping[str, Any]]) -> dict[int, frozenset[int]]:
    """Per piece of libtorrent's download queue, the blocks it has written."""
    finished = {}
    for piece in queue:
        done = frozenset(
            i for i, block in enumerate(piece["blocks"]) if block["state"] == BLOCK_FINISHED
        )
        if done:
            finished[piece["piece_index"]] = done
    return finished
