"""Where verified pieces land: a partial file beside DEST, resumable, renamed into place.

``PieceFile`` is the in-process sink of a fetch (``--no-daemon``): every source offers
pieces here; each is checked against the manifest's SHA-1 before it is written, and
DEST appears only after the whole file matched the manifest's SHA-256, by an atomic
rename from a sibling partial file on the same file system. Nothing is ever
half-written at DEST.

Resume: a small state file records which pieces were written. It is only a hint: after
a crash the claimed pieces are hashed again before they count, because the state file
may be newer than the data that reached the disk.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from swarm.errors import IntegrityError, NoSpaceError, SwarmError, UsageError
from swarm.manifest import Manifest

STATE_SAVE_INTERVAL = 1.0
"""Seconds between state-file saves; losing at most this much progress on kill -9."""

PREFIX_HASH_CHUNK = 16 << 20
"""Most bytes the prefix hasher reads back and hashes at once. The whole-file SHA-256 is
one sequential chain and, on a CPU without SHA extensions (~300 MB/s), the critical path
of a fetch. hashlib drops the GIL while it hashes but must take it back after each update;
with 8 download threads cycling through the GIL, updating per 1 MiB piece made the hasher
queue for the GIL every ~3 ms of work. One read and one update per run of up to 16 MiB
of stored pieces (into a reused buffer) took a 512 MiB fetch from ~140 to ~190 MB/s on
2 cores."""


def partial_path(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.swarm-part")


def _bits_to_set(blob: bytes, count: int) -> set[int]:
    return {i for i in range(count) if blob[i // 8] & (0x80 >> (i % 8))}


def _set_to_bits(indexes: set[int], count: int) -> bytes:
    blob = bytearray(-(-count // 8))
    for i in indexes:
        blob[i // 8] |= 0x80 >> (i % 8)
    return bytes(blob)


def check_dest(dest: Path, directory_ok: bool = False) -> None:
    """DEST's directory must exist and be writable; DEST itself must not be a directory
    (``directory_ok``: unless the artifact turns out to be one, checked once it is known)."""
    parent = dest.parent
    if not parent.is_dir():
        raise UsageError(
            f"swarm: the directory {parent} for DEST does not exist: create it first "
            f"(mkdir -p {parent})"
        )
    if dest.is_dir() and not directory_ok:
        raise UsageError(f"swarm: DEST {dest} is a directory: give a file path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(
            f"swarm: cannot write to {parent}: run as a user who may, or choose another DEST"
        )


WRITE_SLICE = 32 << 10
"""Bytes per ``pwrite``. On this lab's VMs (free-page reporting hands freed guest memory
back to the host) writes above 32 KiB into fresh page cache cost up to several times the
CPU of smaller ones. (A likely reason, not verified: the page cache allocates a folio of
about the write's size, and folios above order 3, ``PAGE_ALLOC_COSTLY_ORDER``, do not
come from the per-CPU page lists.)

Measured here, 768 MiB from 8 threads in 1 MiB chunks (alternating runs, sys CPU-s):
16 KiB writes 0.55-0.64, 32 KiB 0.45-0.54, 64 KiB 1.09-1.53, 128 KiB 1.34-1.58, 256 KiB
0.35-1.37; 1 MiB writes cost 1.2-1.5 from one thread. In s3-fast, swarm-solo's nodes
spent 8.1-8.4 CPU-s/GiB with 32 KiB writes against 9.6-11.2 with 256 KiB (s5cmd
writes 32 KiB at a time). 32 calls per MiB cost nothing elsewhere."""


def no_space(error: OSError, path: Path) -> NoSpaceError | None:
    """The :class:`NoSpaceError` a failed write of ``path`` is, if the disk is full."""
    if error.errno != errno.ENOSPC:
        return None
    return NoSpaceError(
        f"swarm: no space left writing {path} (ENOSPC); free space and rerun: the "
        "fetch resumes where it stopped"
    )


def write_at(fd: int, data: bytes | memoryview, offset: int, path: Path) -> None:
    """Write all of ``data`` at ``offset``; a full disk is :class:`NoSpaceError`."""
    view = memoryview(data)
    try:
        while view:
            written = os.pwrite(fd, view[:WRITE_SLICE], offset)
            view, offset = view[written:], offset + written
    except OSError as error:
        if (full := no_space(error, path)) is not None:
            raise full from error
        raise


def ensure_space(directory: Path, needed: int) -> None:
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    if free < needed:
        raise NoSpaceError(
            f"swarm: not enough space in {directory}: need {needed / 2**20:.1f} MiB more, "
            f"{free / 2**20:.1f} MiB free (ENOSPC); free some space or choose another DEST"
        )


class PieceFile:
    """A partial file for one artifact, written at piece offsets by any number of sources."""

    def __init__(self, manifest: Manifest, dest: Path, check_pieces: bool = True) -> None:
        self.manifest = manifest
        self.dest = dest
        self.partial = partial_path(dest)
        self.state_path = self.partial.with_name(self.partial.name + ".state")
        self.layout = manifest.layout
        self._hashes = manifest.piece_hashes
        self._have: set[int] = set()
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._stored = threading.Condition(self._lock)
        self._fd = -1
        self._last_save = 0.0
        self.bytes_by_source: dict[str, int] = {}
        self.hash_failures = 0
        self.check_pieces = check_pieces
        """Check each offered piece's SHA-1 before keeping it. Off for a lone S3 fetch:
        the whole-file SHA-256 checks every byte anyway, and hashing each byte twice was
        a good part of a core; on a mismatch, :meth:`drop_bad_pieces` finds the culprits
        and the fetch reads them again with this on."""
        self.on_piece: Callable[[int, int], None] | None = None
        """Called as ``on_piece(index, length)`` after each newly stored piece."""

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        """Create or reopen the partial file (after checking the space it needs); recover
        verified pieces."""
        check_dest(self.dest)
        resumable = self._load_state()
        try:
            allocated = self.partial.stat().st_blocks * 512
        except FileNotFoundError:
            allocated = 0
        ensure_space(self.dest.parent, max(0, self.manifest.size - allocated))
        try:
            self._fd = os.open(self.partial, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise SwarmError(f"swarm: cannot create {self.partial}: {error.strerror}") from error
        try:
            # Sparse: ensure_space above makes a full disk fail at once; reserving the
            # blocks (posix_fallocate) made every first write into them cost ~10x the
            # CPU on ext4 (unwritten extents: 0.47 against 0.04 CPU-s per 128 MiB).
            os.ftruncate(self._fd, self.manifest.size)
        except OSError as error:
            os.close(self._fd)
            self._fd = -1
            if error.errno == errno.ENOSPC:
                raise NoSpaceError(
                    f"swarm: no space left on the device holding {self.dest.parent} (ENOSPC) "
                    "while reserving the artifact; free some space or choose another DEST"
                ) from error
            raise
        if resumable:
            self._have = {i for i in resumable if self._verify_on_disk(i)}

    def close(self) -> None:
        if self._fd >= 0:
            self._save_state(force=True)
            os.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        """Forget all progress (after a whole-file mismatch, nothing here can be trusted)."""
        self.close()
        for path in (self.partial, self.state_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    # -- the sink every source writes to ---------------------------------------------------

    def missing(self) -> list[int]:
        with self._lock:
            return [i for i in range(self.layout.count) if i not in self._have]

    def have(self, index: int) -> bool:
        return index in self._have

    @property
    def complete(self) -> bool:
        return len(self._have) == self.layout.count

    @property
    def bytes_done(self) -> int:
        with self._lock:
            return sum(self.layout.length(i) for i in self._have)

    def offer(self, index: int, data: bytes | memoryview, source: str) -> bool:
        """Check ``data`` against piece ``index``'s hash; store it if it matches.

        Returns False (and counts a hash failure) when it does not match, so the source
        can fetch it again. A piece already held is accepted and ignored.
        """
        if len(data) != self.layout.length(index) or (
            self.check_pieces and hashlib.sha1(data).digest() != self._hashes[index]
        ):
            with self._lock:
                self.hash_failures += 1
            return False
        if index in self._have:
            return True
        write_at(self._fd, data, self.layout.offset(index), self.partial)
        with self._lock:
            self._have.add(index)
            self.bytes_by_source[source] = self.bytes_by_source.get(source, 0) + len(data)
            self._stored.notify_all()
        self._save_state()
        if self.on_piece:
            self.on_piece(index, len(data))
        return True

    # -- finishing -------------------------------------------------------------------------

    def drop_bad_pieces(self) -> int:
        """After a whole-file mismatch: forget every piece whose SHA-1 does not match
        (they are fetched again, checked this time); returns how many."""
        bad = {i for i in list(self._have) if not self._verify_on_disk(i)}
        with self._lock:
            self._have -= bad
            self.hash_failures += len(bad)
        self.check_pieces = True
        return len(bad)

    def whole_file_matches(self, hasher: Callable[[], str]) -> bool:
        if not self.complete:
            raise SwarmError(f"swarm: internal error: {len(self.missing())} pieces missing")
        return hasher() == self.manifest.sha256

    def finalize(self, hasher: Callable[[], str]) -> None:
        """Check the whole-file SHA-256, then atomically rename the partial file to DEST."""
        if not self.whole_file_matches(hasher):
            self.discard()
            raise IntegrityError(
                f"swarm: {self.manifest.name} does not match the manifest's SHA-256 "
                f"{self.manifest.sha256} though every piece matched its SHA-1: the manifest "
                "itself is wrong; republish the artifact"
            )
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        os.replace(self.partial, self.dest)
        dir_fd = os.open(self.dest.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        with contextlib.suppress(FileNotFoundError):
            self.state_path.unlink()

    def start_prefix_hasher(self) -> Callable[[], str]:
        """Hash the file in order while it downloads, on a thread of its own.

        Pieces arrive out of order but roughly front to back; the hasher follows the
        longest complete prefix (reading it back from the page cache), so the whole-file
        SHA-256 is ready moments after the last piece instead of one more full pass later.
        Returns a function that waits for the digest (call it once the file is complete).
        """
        digest = hashlib.sha256()
        done = threading.Event()
        count = self.layout.count
        per_extent = max(1, PREFIX_HASH_CHUNK // max(1, self.layout.piece_size))

        def follow() -> None:
            buffer = bytearray(min(PREFIX_HASH_CHUNK, max(self.manifest.size, 1)))
            index = 0
            while index < count:
                with self._stored:
                    while index not in self._have and self._fd >= 0:
                        self._stored.wait(0.5)
                    if self._fd < 0:
                        return
                    end = index + 1  # hash the longest stored run, up to one extent
                    while end < count and end - index < per_extent and end in self._have:
                        end += 1
                offset = self.layout.offset(index)
                length = self.layout.offset(end - 1) + self.layout.length(end - 1) - offset
                digest.update(self._read_into(buffer, offset, length))
                index = end
            done.set()

        thread = threading.Thread(target=follow, name="sha256-prefix", daemon=True)
        thread.start()

        def result() -> str:
            thread.join()
            if not done.is_set():
                raise SwarmError("swarm: internal error: the file closed before it was hashed")
            return digest.hexdigest()

        return result

    def read_range(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def _read_into(self, buffer: bytearray, offset: int, length: int) -> memoryview | bytes:
        """``length`` bytes at ``offset``, read into ``buffer`` (reused: no allocation, no
        page faults) when it is large enough, else into a new bytes object."""
        if length > len(buffer):
            return self.read_range(offset, length)
        view = memoryview(buffer)[:length]
        got = 0
        while got < length:
            n = os.preadv(self._fd, [view[got:]], offset + got)
            if not n:
                raise SwarmError(f"swarm: {self.partial} is shorter than expected")
            got += n
        return view

    # -- resume state ----------------------------------------------------------------------

    def _verify_on_disk(self, index: int) -> bool:
        data = os.pread(self._fd, self.layout.length(index), self.layout.offset(index))
        return hashlib.sha1(data).digest() == self._hashes[index]

    def _load_state(self) -> set[int]:
        try:
            state = json.loads(self.state_path.read_bytes())
            if state["info_hash"] != self.manifest.info_hash or not self.partial.exists():
                return set()
            return _bits_to_set(base64.b64decode(state["have"]), self.layout.count)
        except (FileNotFoundError, ValueError, KeyError, TypeError, IndexError):
            return set()

    def _save_state(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_save < STATE_SAVE_INTERVAL:
            return
        # One saver at a time; a worker that finds another saving just moves on.
        if not self._save_lock.acquire(blocking=force):
            return
        try:
            with self._lock:
                self._last_save = now
                bits = _set_to_bits(self._have, self.layout.count)
            state = {"info_hash": self.manifest.info_hash, "have": base64.b64encode(bits).decode()}
            tmp = self.state_path.with_name(self.state_path.name + ".tmp")
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.state_path)
        finally:
            self._save_lock.release()
