"""S3 completes a piece that peers have partly sent: only its missing blocks are read.

A piece the S3 reader takes whole while libtorrent holds some of its blocks from peers
throws those blocks away. Where uploads are slow next to S3 (the slow-uploads fleet:
20 Mbit uplinks, S3 at 1000) libtorrent has some twenty pieces partly received at any
time, each from a peer sending a few hundred kB/s, and the reader's direct shares, fills
and last ALL batches take some of them: peers' bytes for nothing were 4-14 MB a node,
about half of all that peers sent, most of it in pieces S3 then wrote (session 59,
``bench/fleet.py --trace-peers``).

A piece with at least :data:`MIN_BLOCKS` blocks that libtorrent has written (its download
queue's *finished* state: the blocks are in the data file) is read here as those blocks
from the file and one ranged GET from its first missing block to its last, checked
against the manifest's SHA-1 before it is handed over. Any miss (a block not in the file
after all, an S3 error, a short body) leaves the piece to the S3 reader's ordinary whole
reads, which retry as they always do.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, Protocol

from swarm.manifest import Manifest
from swarm.sources.s3 import read_exactly

log = logging.getLogger(__name__)

BLOCK_SIZE: Final = 16 << 10
"""libtorrent's block: what a peer sends per request, and the download queue's unit."""

MIN_BLOCKS: Final = 4
"""Fewer finished blocks than this (64 KiB) are not worth a second look: the piece is read
whole."""

MAX_IN_FLIGHT: Final = 4
"""Top-up GETs in flight at once, beside the batch's whole reads. One after another, ahead
of them, a batch with eight partly sent pieces would wait eight first-byte latencies
before its whole reads began (slow uploads at full rates, one run each: 11.71 s so, four
nodes in the tail; 10.33 s beside them)."""


class CountingSink(Protocol):
    """A sink that counts a piece's bytes per source as told (the daemon's both are)."""

    def have(self, index: int) -> bool: ...

    def offer(
        self,
        index: int,
        data: bytes | memoryview,
        source: str,
        counted: Mapping[str, int] | None = None,
    ) -> bool: ...


def span(length: int, finished: frozenset[int]) -> tuple[int, int] | None:
    """The bytes ``[start, end)`` of a piece of ``length`` bytes that S3 must send when
    the blocks ``finished`` are in the file: from the first block not among them to the
    last; None when there is nothing worth a top-up (too few blocks, or none missing)."""
    blocks = -(-length // BLOCK_SIZE)
    missing = [i for i in range(blocks) if i not in finished]
    if len(finished) < MIN_BLOCKS or not missing:
        return None
    return missing[0] * BLOCK_SIZE, min(length, (missing[-1] + 1) * BLOCK_SIZE)


def top_up(
    client: Any,
    manifest: Manifest,
    data_path: Path,
    index: int,
    finished: frozenset[int],
    streamed: Callable[[int], object] | None = None,
) -> tuple[bytearray, int] | None:
    """Piece ``index`` from the data file's finished blocks and S3's rest: the piece,
    checked against its SHA-1, and the bytes S3 sent for it; None if that cannot be
    done (the caller reads the piece whole)."""
    layout = manifest.layout
    length, offset = layout.length(index), layout.offset(index)
    wanted = span(length, finished)
    if wanted is None:
        return None
    start, end = wanted
    piece = bytearray(length)
    view = memoryview(piece)
    try:
        fd = os.open(data_path, os.O_RDONLY)
        try:
            got = os.preadv(fd, [view], offset)
        finally:
            os.close(fd)
        if got != length:
            return None
        response = client.get_object(
            Bucket=manifest.bucket,
            Key=manifest.key,
            Range=f"bytes={offset + start}-{offset + end - 1}",
        )
        body = response["Body"]
        try:
            read_exactly(body, view[start:end])  # all of it, or IncompleteRead
        finally:
            body.close()
    except Exception as error:  # the ordinary read takes the piece, with its retries
        log.debug("piece %d not topped up: %s", index, error)
        return None
    if streamed is not None:
        streamed(end - start)
    if hashlib.sha1(piece).digest() != manifest.piece_hashes[index]:
        log.debug("piece %d not topped up: its blocks in the file do not match", index)
        return None
    return piece, end - start


class TopUps:
    """The top-ups of one batch's pieces, run in threads beside its whole reads::

        with TopUps(...) as top_ups:
            reader.fetch(top_ups.whole)
        reader.fetch(top_ups.failed)

    ``finished``: libtorrent's written blocks per piece
    (:func:`~swarm.agent.downloadqueue.finished_blocks`, perhaps a second old: it then
    knows fewer)."""

    def __init__(
        self,
        client: Any,
        manifest: Manifest,
        data_path: Path,
        target: CountingSink,
        pieces: Iterable[int],
        finished: Mapping[int, frozenset[int]],
        streamed: Callable[[int], object] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.client, self.manifest, self.data_path = client, manifest, data_path
        self.target, self.streamed, self.cancel = target, streamed, cancel
        layout = manifest.layout
        self.partly_sent: dict[int, frozenset[int]] = {}
        self.whole: list[int] = []
        """The pieces to read whole."""
        for index in pieces:
            blocks = finished.get(index)
            if (
                blocks is not None
                and not manifest.is_tree
                and span(layout.length(index), blocks) is not None
                and not target.have(index)
            ):
                self.partly_sent[index] = blocks
            else:
                self.whole.append(index)
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[int, Future[bool]] = {}

    def __enter__(self) -> TopUps:
        if self.partly_sent:
            workers = min(MAX_IN_FLIGHT, len(self.partly_sent))
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="s3-top-up")
            self._futures = {
                index: self._pool.submit(self._one, index, blocks)
                for index, blocks in self.partly_sent.items()
            }
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    @property
    def failed(self) -> list[int]:
        """The partly sent pieces not topped up (read them whole); once the block ended."""
        return [index for index, future in self._futures.items() if not future.result()]

    def _one(self, index: int, blocks: frozenset[int]) -> bool:
        if (self.cancel is not None and self.cancel.is_set()) or self.target.have(index):
            return True  # nothing to read (cancelled: the caller's reads stop too)
        got = top_up(self.client, self.manifest, self.data_path, index, blocks, self.streamed)
        if got is None:
            return False
        data, from_s3 = got
        # the peers' blocks are in libtorrent's payload counter already
        return self.target.offer(index, data, "s3", counted={"s3": from_s3})
