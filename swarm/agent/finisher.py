"""The end of a daemon fetch: the whole-file SHA-256 while pieces arrive, then DEST.

The daemon keeps an artifact's data in one file: the hidden partial beside DEST while
it downloads, DEST itself afterwards (one copy on disk). :class:`Finisher` follows the
contiguous prefix of pieces libtorrent holds, has libtorrent flush it to the file (a
held piece may still sit in its write queue), and hashes it from the page cache on a
thread of its own, so the digest is ready moments after the last piece. Then the file is
made read-only (the daemon serves it to peers) and renamed to DEST, atomically:

- DEST absent (the usual case): libtorrent renames its own file (``rename_file``, a
  fence after every pending write), so it never loses track of it;
- DEST present (a rerun over an older version): libtorrent refuses to overwrite, so the
  torrent is paused, the partial replaces DEST with ``rename(2)``, libtorrent is told the
  new name (the old one being gone, it only records it), and the torrent resumes.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

from swarm.agent.stuck import STUCK_AFTER, StuckPieces
from swarm.errors import IntegrityError, SwarmError
from swarm.manifest import Manifest

if TYPE_CHECKING:  # the client imports this module for copy_verified: no libtorrent there
    from swarm.sources.peers import TorrentSession

log = logging.getLogger(__name__)

HASH_EXTENT = 32 << 20
"""Bytes of held prefix hashed per flush: a flush is a fence in libtorrent's disk queue,
so not per piece; small enough that the tail left after the last piece is hashed in
well under the 0.25 s per GiB budget."""

SLOW_PIECE_LOG = 10.0
"""Seconds the hash may wait for the next piece before the log says so."""

STUCK_POLL = 2.0
"""Seconds between looks at libtorrent's download queue for stuck pieces (see
:mod:`.stuck`), once the hash has waited ``STUCK_AFTER`` for its next piece."""

CANCEL_POLL = 0.05
"""Seconds between looks at the cancel flag while the hash waits for pieces (an arriving
piece wakes it at once)."""

READ_CHUNK = 16 << 20
"""Bytes read back and hashed at once (one reused buffer: no allocation per read)."""

DEST_MODE = 0o444
"""DEST is read-only: the daemon serves its bytes to peers, and a write would be served
as a bad piece. ``--copy`` gives a private writable copy instead."""


class Finisher:
    """Hash one artifact's file in order while it downloads; then place it at DEST."""

    def __init__(
        self,
        session: TorrentSession,
        manifest: Manifest,
        data_path: Path,
        cancel: threading.Event,
        held: Callable[[], Collection[int]] | None = None,
        on_stuck: Callable[[list[int]], None] | None = None,
        on_hashed: Callable[[], None] | None = None,
    ) -> None:
        self.session = session
        self.manifest = manifest
        self.data_path = data_path
        self.cancel = cancel
        self.state = session.torrents[manifest.info_hash]
        self.held = held or (lambda: self.state.held)
        """Pieces in the file: libtorrent's, plus the S3 reader's own (``DirectSink``)."""
        self.on_stuck = on_stuck
        """Told of pieces libtorrent will never keep (:mod:`.stuck`): the daemon repairs them."""
        self.on_hashed = on_hashed
        """Called (on the hasher's thread) after each extent is hashed."""
        self._stuck = StuckPieces()
        self._stuck_polled = -math.inf
        self.hashed_pieces = 0
        self.digest: str | None = None
        self.error: SwarmError | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"sha256-{manifest.name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self.digest = self._hash()
        except SwarmError as error:
            self.error = error
        except OSError as error:
            self.error = SwarmError(f"swarm: cannot read {self.data_path}: {error.strerror}")
        finally:
            self.done.set()

    def _held_prefix_end(self, start: int) -> int:
        held, count = self.held(), self.manifest.layout.count
        end = start
        while end < count and end in held:
            end += 1
        return end

    def _hash(self) -> str:
        layout = self.manifest.layout
        count = layout.count
        per_extent = max(1, HASH_EXTENT // layout.piece_size)
        digest = hashlib.sha256()
        buffer = memoryview(bytearray(min(READ_CHUNK, max(self.manifest.size, 1))))
        fd = -1  # opened after the first flush: libtorrent creates the file at its first write
        try:
            index = 0
            waiting_since, told = time.monotonic(), False
            while index < count:
                seen = self.state.arrivals
                end = self._held_prefix_end(index)
                if end < count and end - index < per_extent:
                    if self.cancel.is_set():
                        raise SwarmError("swarm: the fetch was cancelled")
                    self.state.wait_arrival(seen, CANCEL_POLL)
                    waited = time.monotonic() - waiting_since
                    if not told and waited > SLOW_PIECE_LOG:
                        told = True  # a fetch that stalls here says where it stands
                        log.info(
                            "sha256 of %s waits for piece %d (%d of %d held)",
                            self.manifest.name, end, len(self.held()), count,
                        )  # fmt: skip
                    if waited > STUCK_AFTER:
                        self._look_for_stuck_pieces()
                    continue
                waiting_since, told = time.monotonic(), False
                if not self.session.flush(self.manifest.info_hash):
                    continue  # no answer from libtorrent yet: ask again
                if fd < 0:
                    fd = os.open(self.data_path, os.O_RDONLY)
                offset = layout.offset(index)
                stop = layout.offset(end - 1) + layout.length(end - 1)
                while offset < stop:
                    length = min(len(buffer), stop - offset)
                    got = os.preadv(fd, [buffer[:length]], offset)
                    if got <= 0:
                        raise SwarmError(f"swarm: {self.data_path} ended at {offset} bytes")
                    digest.update(buffer[:got])
                    offset += got
                index = end
                self.hashed_pieces = index
                if self.on_hashed is not None:
                    self.on_hashed()
        finally:
            if fd >= 0:
                os.close(fd)
        return digest.hexdigest()

    def _look_for_stuck_pieces(self) -> None:
        now = time.monotonic()
        if self.on_stuck is None or now - self._stuck_polled < STUCK_POLL:
            return
        self._stuck_polled = now
        try:
            queue = self.state.handle.get_download_queue()
        except RuntimeError:  # the handle is gone (the fetch is being cancelled)
            return
        stuck = self._stuck.update(queue, self.held(), now)
        if stuck:
            self.on_stuck(stuck)

    def wait(self, timeout: float | None = None) -> str:
        """The verified digest, once every piece is hashed; IntegrityError on mismatch."""
        if not self.done.wait(timeout):
            raise SwarmError("swarm: internal error: the SHA-256 of the artifact is late")
        if self.error:
            raise self.error
        assert self.digest is not None
        if self.digest != self.manifest.sha256:
            raise IntegrityError(
                f"swarm: {self.manifest.name} has SHA-256 {self.digest} but the manifest says "
                f"{self.manifest.sha256}: every piece matched, so the manifest itself is "
                "wrong; republish the artifact"
            )
        return self.digest


def place(session: TorrentSession, info_hash: str, partial: Path, dest: Path) -> None:
    """Rename the verified ``partial`` (libtorrent's file) to ``dest``, atomically."""
    os.chmod(partial, DEST_MODE)
    if not dest.exists():
        error = session.rename(info_hash, dest.name)
        if error is None:
            fsync_dir(dest.parent)
            return
        log.info("rename to %s refused (%s): replacing it", dest, error)
    if not session.pause(info_hash):
        raise SwarmError(f"swarm: libtorrent did not pause {dest.name} to replace {dest}")
    try:
        os.replace(partial, dest)
        fsync_dir(dest.parent)
        error = session.rename(info_hash, dest.name)
        if error is not None:
            raise SwarmError(f"swarm: libtorrent cannot follow {dest}: {error}")
    finally:
        session.torrents[info_hash].handle.resume()


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_verified(
    src: Path, dest: Path, sha256: str, size: int, copy: Callable[[int, int, int], None]
) -> None:
    """``dest`` as a private copy of the verified ``src`` (reflink where the file system
    can), checked again, renamed into place; writable (``--copy``)."""
    from swarm.agent.store import partial_path
    from swarm.pieces import file_sha256

    tmp = partial_path(dest).with_name(f"{partial_path(dest).name}.{os.getpid()}.copy")
    try:
        with src.open("rb") as source, tmp.open("wb") as out:
            copy(source.fileno(), out.fileno(), size)
            os.fsync(out.fileno())
        if file_sha256(tmp) != sha256:
            raise IntegrityError(
                f"swarm: {src} no longer matches its manifest: the node's copy was changed; "
                "delete it and fetch again"
            )
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    finally:
        tmp.unlink(missing_ok=True)
