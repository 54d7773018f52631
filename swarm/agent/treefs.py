"""Directory artifacts on disk: a staging directory beside DEST, verified, swapped in.

A directory artifact is fetched into ``.DEST.swarm-part/`` (beside DEST, the same file
system), every file checked against its SHA-256, and only then put at DEST in one step:

- DEST absent: ``rename(2)`` of the staging directory;
- DEST present (an older version): ``renameat2(RENAME_EXCHANGE)`` swaps the two
  directories atomically (Linux >= 3.15; glibc >= 2.28 exports it), so DEST is always
  either the whole old tree or the whole new one; the old tree, now at the staging
  path, is then removed. Where the exchange is refused (an old kernel, a file system
  without it) the old tree is renamed aside, the new one renamed in, the old removed:
  DEST is missing for the moment between the two renames, never half-written.

The daemon (libtorrent writes the staging directory; :class:`TreeFinisher` verifies it;
:func:`place_tree` swaps it in and seeds DEST), ``--no-daemon`` (:class:`TreeSink`,
:func:`fetch_tree`) and the CLI's copies (:func:`copy_tree_verified`) share these.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarm.agent.finisher import DEST_MODE, Finisher, fsync_dir
from swarm.agent.store import ensure_space, partial_path, write_at
from swarm.errors import IntegrityError, SwarmError, UsageError
from swarm.manifest import Manifest

if TYPE_CHECKING:
    from swarm.agent.registry import Artifact
    from swarm.sources.peers import TorrentSession

log = logging.getLogger(__name__)

READ_CHUNK = 8 << 20
AT_FDCWD = -100
RENAME_EXCHANGE = 2
"""``renameat2`` flag (linux/fs.h): swap two paths atomically."""


def check_tree_dest(dest: Path) -> None:
    """DEST's directory must exist and be writable; DEST, if present, a directory."""
    parent = dest.parent
    if not parent.is_dir():
        raise UsageError(
            f"swarm: the directory {parent} for DEST does not exist: create it first "
            f"(mkdir -p {parent})"
        )
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise UsageError(
            f"swarm: DEST {dest} is a file (or a symlink) but the artifact is a directory: "
            "remove it or choose another DEST"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(
            f"swarm: cannot write to {parent}: run as a user who may, or choose another DEST"
        )


def check_dest_kind(manifest: Manifest, dest: Path) -> None:
    """A single-file artifact needs a file DEST, a directory artifact a directory DEST."""
    if manifest.files is not None:
        check_tree_dest(dest)
    elif dest.is_dir():
        raise UsageError(
            f"swarm: DEST {dest} is a directory but {manifest.name} is a single file: give "
            "a file path"
        )


def _renameat2(src: Path, dst: Path, flags: int) -> int:
    """0 on success, else the errno (ENOSYS where libc has no ``renameat2``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        function = libc.renameat2
    except AttributeError:
        return errno.ENOSYS
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    function.argtypes.append(ctypes.c_uint)
    if function(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) == 0:
        return 0
    return ctypes.get_errno()


def swap_in(staging: Path, dest: Path, *, keep_old: bool = False) -> Path | None:
    """Put the verified directory ``staging`` at ``dest``; an older ``dest`` is replaced
    atomically (exchanged), then removed, or (``keep_old``) returned for the caller to
    remove once it is done (the daemon, once it seeds the new tree)."""
    old: Path | None = None
    if dest.is_dir() and not dest.is_symlink():
        code = _renameat2(staging, dest, RENAME_EXCHANGE)
        if code == 0:
            old = staging  # the old tree, now at the staging path
        else:
            log.info(
                "renameat2 exchange refused (%s): renaming the old %s aside",
                os.strerror(code),
                dest,
            )
            old = dest.with_name(f".{dest.name}.swarm-old")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(dest, old)
            os.rename(staging, dest)
    else:
        check_tree_dest(dest)
        os.rename(staging, dest)
    fsync_dir(dest.parent)
    if old is not None and not keep_old:
        shutil.rmtree(old)
        return None
    return old


def verify_tree(root: Path, manifest: Manifest, *, create_empty: bool = False) -> str:
    """Check every file under ``root`` against its size and SHA-256 (fsyncing each);
    return the SHA-256 of the files concatenated (the manifest's ``sha256``).

    ``create_empty``: create empty files that are missing (libtorrent writes no byte to
    them, so it may never create them).

    Raises:
        IntegrityError: a file is missing, has another size or another SHA-256.
    """
    assert manifest.files is not None
    whole = hashlib.sha256()
    buffer = memoryview(bytearray(READ_CHUNK))
    for entry in manifest.files:
        path = root / entry.path
        if entry.size == 0 and create_empty and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        own = hashlib.sha256()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as error:
            raise IntegrityError(
                f"swarm: {path} of {manifest.name} cannot be read ({error.strerror})"
            ) from error
        try:
            size = 0
            while got := os.readv(fd, [buffer]):
                own.update(buffer[:got])
                whole.update(buffer[:got])
                size += got
            os.fsync(fd)
        finally:
            os.close(fd)
        if size != entry.size or own.hexdigest() != entry.sha256:
            raise IntegrityError(
                f"swarm: {entry.path} of {manifest.name} has {size} bytes and SHA-256 "
                f"{own.hexdigest()}, the manifest says {entry.size} bytes and {entry.sha256}"
            )
    return whole.hexdigest()


def tree_matches(dest: Path, manifest: Manifest) -> bool:
    """True if DEST already holds exactly this directory artifact (a rerun)."""
    assert manifest.files is not None
    if not dest.is_dir():
        return False
    listed = {entry.path for entry in manifest.files}
    for path in dest.rglob("*"):
        if not path.is_dir() and path.relative_to(dest).as_posix() not in listed:
            return False
    try:
        return verify_tree(dest, manifest) == manifest.sha256
    except IntegrityError:
        return False


def set_modes(root: Path, manifest: Manifest, mode: int) -> None:
    assert manifest.files is not None
    for entry in manifest.files:
        os.chmod(root / entry.path, mode)


def read_piece(manifest: Manifest, root: Path, index: int) -> bytes:
    """Piece ``index`` of a directory artifact kept under ``root`` (the UDP server's read)."""
    assert manifest.files is not None
    layout = manifest.layout
    start = layout.offset(index)
    parts = []
    for span in manifest.tree_layout.spans(start, start + layout.length(index)):
        with (root / manifest.files[span.file].path).open("rb") as stream:
            parts.append(os.pread(stream.fileno(), span.length, span.offset))
    return b"".join(parts)


# -- the daemon --------------------------------------------------------------------------------


class TreeFinisher(Finisher):
    """The daemon's check of a directory artifact: once every piece is held and flushed,
    every file's SHA-256 (and the concatenation's, which :meth:`Finisher.wait` compares)."""

    def _hash(self) -> str:
        count = self.manifest.layout.count
        while len(self.held()) < count:
            if self.cancel.wait(0.05):
                raise SwarmError("swarm: the fetch was cancelled")
        while not self.session.flush(self.manifest.info_hash):
            if self.cancel.is_set():
                raise SwarmError("swarm: the fetch was cancelled")
        digest = verify_tree(self.data_path, self.manifest, create_empty=True)
        self.hashed_pieces = count
        return digest


def place_tree(
    session: TorrentSession,
    artifact: Artifact,
    trackers: list[str],
    extra_peers: list[tuple[str, int]],
) -> None:
    """The verified staging directory becomes DEST; libtorrent seeds it from there.

    libtorrent cannot follow a directory renamed under it, so the torrent is removed
    (every piece is flushed), the directories are swapped, and the torrent is added
    again at DEST in seed mode (no hash pass: every file matched its SHA-256)."""
    from swarm.agent.hybrid import TorrentSink

    manifest, dest = artifact.manifest, artifact.dest
    assert dest is not None
    old = artifact.sink
    before = old.state.status
    set_modes(artifact.data_path, manifest, DEST_MODE)
    session.remove(artifact.info_hash)
    previous = swap_in(artifact.data_path, dest, keep_old=True)
    state = session.add(manifest, dest, trackers, seed_mode=True)
    for address in extra_peers:
        state.handle.connect_peer(address)
    sink = TorrentSink(session, manifest)
    sink.bytes_by_source, sink.hash_failures = old.bytes_by_source, old.hash_failures
    # the new handle counts from zero: keep what peers gave (shown in the status)
    sink.bytes_by_source["peers"] = old.bytes_by_source.get("peers", 0) + (
        before.total_payload_download if before is not None else 0
    )
    artifact.sink, artifact.data_path = sink, dest
    if previous is not None:  # the old version, removed once the new one is seeded
        shutil.rmtree(previous, ignore_errors=True)


def copy_tree_verified(manifest: Manifest, src: Path, dest: Path, *, writable: bool) -> None:
    """DEST as a private copy of the daemon's verified tree ``src``: copied into a staging
    directory, every file checked again, swapped in (``--copy``, or DEST another's)."""
    assert manifest.files is not None
    check_tree_dest(dest)
    staging = partial_path(dest).with_name(f"{partial_path(dest).name}.{os.getpid()}.copy")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        for entry in manifest.files:
            target = staging / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / entry.path, target, follow_symlinks=False)
        if verify_tree(staging, manifest) != manifest.sha256:
            raise IntegrityError(
                f"swarm: {src} no longer matches its manifest: the node's copy was changed; "
                "delete it and fetch again"
            )
        set_modes(staging, manifest, 0o644 if writable else DEST_MODE)
        swap_in(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# -- --no-daemon -------------------------------------------------------------------------------


class TreeSink:
    """The ``--no-daemon`` sink of a directory artifact: pieces checked against their
    SHA-1, then written across the staging directory's files at their offsets.

    No resume across runs: a rerun starts the staging directory afresh (the single-file
    ``PieceFile`` keeps a state file; a directory's would need one per run of files)."""

    def __init__(self, manifest: Manifest, staging: Path) -> None:
        assert manifest.files is not None
        self.manifest = manifest
        self.files = manifest.files
        self.staging = staging
        self.layout = manifest.layout
        self.tree = manifest.tree_layout
        self._hashes = manifest.piece_hashes
        self._have: set[int] = set()
        self._lock = threading.Lock()
        self.bytes_by_source: dict[str, int] = {}
        self.hash_failures = 0
        self.on_piece: Any = None

    def open(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        ensure_space(self.staging.parent, self.manifest.size)
        self.staging.mkdir()
        for entry in self.files:
            path = self.staging / entry.path
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("wb") as out:
                out.truncate(entry.size)

    def missing(self) -> list[int]:
        with self._lock:
            return [i for i in range(self.layout.count) if i not in self._have]

    def have(self, index: int) -> bool:
        return index in self._have

    @property
    def complete(self) -> bool:
        return len(self._have) == self.layout.count

    def offer(self, index: int, data: bytes | memoryview, source: str) -> bool:
        length = len(data)
        if (
            length != self.layout.length(index)
            or hashlib.sha1(data).digest() != self._hashes[index]
        ):
            with self._lock:
                self.hash_failures += 1
            return False
        if index in self._have:
            return True
        start = self.layout.offset(index)
        view = memoryview(data)
        for span in self.tree.spans(start, start + length):
            path = self.staging / self.files[span.file].path
            fd = os.open(path, os.O_WRONLY)
            try:
                write_at(
                    fd,
                    view[span.logical - start : span.logical - start + span.length],
                    span.offset,
                    path,
                )
            finally:
                os.close(fd)
        with self._lock:
            self._have.add(index)
            self.bytes_by_source[source] = self.bytes_by_source.get(source, 0) + length
        if self.on_piece:
            self.on_piece(index, length)
        return True


def fetch_tree(
    manifest: Manifest,
    client: Any,
    dest: Path,
    started: float,
    deadline: float | None,
    s3_config: Any,
    progress: Any,
) -> Any:
    """``swarm fetch --no-daemon`` of a directory artifact (DEST's lock held by the caller)."""
    from swarm.agent.fetch import FetchResult, run_with_deadline
    from swarm.sources.s3 import S3Source

    def result(**extra: Any) -> FetchResult:
        return FetchResult.of(manifest, dest, started, **extra)

    check_tree_dest(dest)
    if tree_matches(dest, manifest):
        return result(already_present=True)
    staging = partial_path(dest)
    sink = TreeSink(manifest, staging)
    sink.open()
    progress.start(manifest, dest, 0)
    sink.on_piece = lambda _index, length: progress.advance(length)
    cancel = threading.Event()
    s3 = S3Source(client, manifest, sink, cancel, s3_config)
    try:
        left = None if deadline is None else max(deadline - (time.monotonic() - started), 0.001)
        run_with_deadline(left, cancel, lambda: s3.fetch(sink.missing()))
        if not sink.complete:
            raise SwarmError(f"swarm: {len(sink.missing())} pieces still missing after S3 fetch")
        progress.verifying()
        if verify_tree(staging, manifest) != manifest.sha256:
            raise IntegrityError(
                f"swarm: {manifest.name}'s files match their SHA-256 but not the manifest's "
                "whole sha256: the manifest itself is wrong; republish the artifact"
            )
        swap_in(staging, dest)
    except BaseException:
        cancel.set()
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
        raise
    return result(
        bytes_by_source=dict(sink.bytes_by_source),
        retries=s3.retries,
        hash_failures=sink.hash_failures,
    )
