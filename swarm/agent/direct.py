"""S3 straight into the data file, for a node with nobody to share with yet.

Handing every S3 piece to libtorrent (``add_piece``) costs a copy into its block
buffers, a SHA-1 and a write per 16 KiB block on its disk threads: a fresh node fetching
1 GiB through its daemon spent ~3x the CPU of ``--no-daemon`` (bench/s3get.py). When no
peer is connected and no coordinator plan asks for stripes, nothing would be shared
before the end anyway, so the S3 reader writes pieces at their offsets itself, as
``--no-daemon`` does, and the whole-file SHA-256 (which the finisher computes anyway)
checks every byte. Once it matches, the daemon hands the verified file to libtorrent in
seed mode (no hash pass; libtorrent checks each piece the first time a peer asks).
Pieces that peers deliver meanwhile still land through libtorrent, in the same file.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from pathlib import Path

from swarm.agent.hybrid import TorrentSink
from swarm.agent.store import no_space, write_at
from swarm.errors import SwarmError


class DirectSink:
    """A :class:`~swarm.sources.PieceSink` writing into the torrent's own data file."""

    def __init__(self, torrent: TorrentSink, path: Path) -> None:
        self.torrent = torrent
        self.path = path
        self.layout = torrent.manifest.layout
        self.written: set[int] = set()
        self._lock = threading.Lock()
        self._fd_lock = threading.Lock()
        """Held while the file is synced or closed (not while pieces are written)."""
        # Sparse, like libtorrent's file (see TorrentSession.add): the daemon checked the
        # free space before the fetch, and a disk that fills meanwhile fails in write_at.
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(self._fd).st_size < self.layout.size:
                os.ftruncate(self._fd, self.layout.size)
        except OSError:
            os.close(self._fd)
            raise

    @property
    def bytes_by_source(self) -> dict[str, int]:
        return self.torrent.bytes_by_source

    def held(self) -> set[int]:
        """Pieces in the file: written here, or kept by libtorrent (from peers)."""
        with self._lock:
            return self.written | self.torrent.state.held

    def have(self, index: int) -> bool:
        return index in self.written or self.torrent.have(index)

    def missing(self) -> list[int]:
        held = self.held()
        return [i for i in range(self.layout.count) if i not in held]

    def complete(self) -> bool:
        return len(self.held()) >= self.layout.count

    @property
    def bytes_done(self) -> int:
        return sum(self.layout.length(i) for i in self.held())

    def offer(
        self,
        index: int,
        data: bytes | memoryview,
        source: str,
        counted: Mapping[str, int] | None = None,
    ) -> bool:
        """Write the piece at its offset (checked later, with the whole file).
        ``counted``: as :meth:`TorrentSink.offer <swarm.agent.hybrid.TorrentSink.offer>`'s."""
        length = len(data)
        if length != self.layout.length(index):
            return False
        if self.have(index):
            return True
        write_at(self._fd, data, self.layout.offset(index), self.path)
        with self._lock:
            self.written.add(index)
        self.torrent.count(counted or {source: length})
        self.torrent.state.note_arrival()
        return True

    def share(self) -> int:
        """Hand libtorrent the pieces written here that it lacks (read back from the
        file; it checks each one's SHA-1): once the node shares with peers again (the
        coordinator took ALL back), peers can get them from it, and libtorrent does not
        fetch them a second time. Returns how many were handed over."""
        with self._lock:
            unknown = sorted(self.written - self.torrent.state.held)
        for index in unknown:
            data = os.pread(self._fd, self.layout.length(index), self.layout.offset(index))
            self.torrent.offer(index, data, None)  # counted when it was written here
        self.torrent.settle(unknown)
        return len(unknown)

    def drop_bad(self) -> int:
        """After a whole-file mismatch: forget written pieces whose SHA-1 does not match
        (read again from S3); returns how many."""
        hashes = self.torrent.manifest.piece_hashes
        bad = set()
        for index in sorted(self.written):
            data = os.pread(self._fd, self.layout.length(index), self.layout.offset(index))
            if hashlib.sha1(data).digest() != hashes[index]:
                bad.add(index)
        with self._lock:
            self.written -= bad
            self.torrent.hash_failures += len(bad)
        return len(bad)

    def write_back(self) -> None:
        """Start the file's dirty pages on their way to disk and wait for them (the
        hasher calls it after each extent it hashed): :meth:`close`'s fsync then has
        only the last extent left, not the whole file (76 ms for 128 MiB here)."""
        with self._fd_lock:  # not _lock: the readers' offers go on meanwhile
            if self._fd >= 0:
                try:
                    os.fdatasync(self._fd)
                except OSError as error:  # delayed allocation on the sparse file: ENOSPC
                    full = no_space(error, self.path)
                    raise full or SwarmError(
                        f"swarm: cannot write {self.path}: {error.strerror}"
                    ) from error

    def close(self) -> None:
        with self._fd_lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1
