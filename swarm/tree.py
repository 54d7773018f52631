"""Directory artifacts: the file list, its safety rules, and the logical byte space.

A directory is published as one multi-file torrent (BEP 3 ``files``). Its files are in
one fixed order (:func:`tree_order`: by path components), and the artifact's logical
bytes are the files concatenated in that order, so the piece machinery
(:mod:`swarm.pieces`) works on logical offsets unchanged; :class:`TreeLayout` maps a
logical range back to ``(file, offset, length)`` spans (one S3 ranged GET per span, one
``pwrite`` per span).

Every path a manifest names is checked before anything is written (:func:`check_files`):
no absolute path, no ``.`` or ``..``, no empty component, no control character or
backslash, no duplicate, no file that is also another file's directory. A published
tree may hold no symlink or special file (:func:`scan_dir`): a symlink in the metainfo
(BEP 47) would let a torrent write or expose files outside its directory.

Pure: no I/O here beyond :func:`scan_dir`'s walk of a local directory.
"""

from __future__ import annotations

import os
import re
import stat
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from swarm.errors import ManifestError, UsageError

COMPONENT_MAX = 255
"""Longest path component in bytes (ext4, xfs: 255)."""

PATH_MAX = 4096
"""Longest relative path in bytes (Linux PATH_MAX)."""

MAX_FILES = 100_000
"""Most files in one directory artifact: the manifest and the metainfo stay a few MB."""

BAD_COMPONENT = re.compile(r"[\x00-\x1f\x7f/\\]")
"""Characters no component may hold: control characters (a newline in a name breaks
every line-based tool), the separator, and a backslash (a separator elsewhere)."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a directory artifact: its relative path ('/'-separated), size, SHA-256."""

    path: str
    size: int
    sha256: str

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.path.split("/"))


def tree_order(path: str) -> tuple[str, ...]:
    """The sort key of a file's path: its components, so ``a/b`` sorts with ``a``'s other
    files and before ``a-b`` (a plain string sort would interleave directories)."""
    return tuple(path.split("/"))


def check_path(path: object) -> str:
    """A file path inside a directory artifact, or :class:`ManifestError` saying why not."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"swarm: unsafe file path {path!r} in the manifest: empty or not text")
    why = None
    if path.startswith("/"):
        why = "absolute"
    elif len(path.encode("utf-8", "surrogatepass")) > PATH_MAX:
        why = f"longer than {PATH_MAX} bytes"
    else:
        for part in path.split("/"):
            if part in ("", ".", ".."):
                why = f"component {part!r} (empty, '.' or '..')"
                break
            if BAD_COMPONENT.search(part):
                why = f"component {part!r} holds a control character or backslash"
                break
            if len(part.encode("utf-8", "surrogatepass")) > COMPONENT_MAX:
                why = f"component longer than {COMPONENT_MAX} bytes"
                break
    if why:
        raise ManifestError(
            f"swarm: unsafe file path {path!r} in the manifest ({why}): refusing it; a "
            "directory artifact names relative paths inside itself only"
        )
    return path


def check_files(files: Sequence[FileEntry]) -> None:
    """The whole file list: every path safe, in tree order, no duplicates, no file that
    is also a directory of another file, sizes and digests well formed."""
    if not files:
        raise ManifestError("swarm: the manifest's file list is empty: nothing to fetch")
    if len(files) > MAX_FILES:
        raise ManifestError(f"swarm: the manifest lists {len(files)} files (most: {MAX_FILES})")
    seen: set[str] = set()
    directories: set[str] = set()
    previous: tuple[str, ...] | None = None
    for entry in files:
        check_path(entry.path)
        if not isinstance(entry.size, int) or isinstance(entry.size, bool) or entry.size < 0:
            raise ManifestError(f"swarm: file {entry.path!r} has a bad size {entry.size!r}")
        if not isinstance(entry.sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", entry.sha256):
            raise ManifestError(f"swarm: file {entry.path!r} has no 64-hex-digit sha256")
        if entry.path in seen:
            raise ManifestError(f"swarm: duplicate file path {entry.path!r} in the manifest")
        key = tree_order(entry.path)
        if previous is not None and key < previous:
            raise ManifestError(
                f"swarm: file {entry.path!r} is out of order in the manifest (files are "
                "sorted by path components): republish the directory"
            )
        previous = key
        seen.add(entry.path)
        parts = entry.parts
        directories.update("/".join(parts[:i]) for i in range(1, len(parts)))
    clash = sorted(seen & directories)
    if clash:
        raise ManifestError(
            f"swarm: {clash[0]!r} is both a file and a directory in the manifest: refusing it"
        )


@dataclass(frozen=True)
class Span:
    """Part of a logical range that lies in one file."""

    file: int
    """Index into the file list."""
    offset: int
    """Offset inside that file."""
    length: int
    logical: int
    """Where the span starts in the logical byte space."""


class TreeLayout:
    """Logical offsets (the files concatenated in order) <-> spans of single files."""

    def __init__(self, sizes: Iterable[int]) -> None:
        self.sizes = list(sizes)
        self.starts: list[int] = []
        total = 0
        for size in self.sizes:
            if size < 0:
                raise ValueError(f"negative file size {size}")
            self.starts.append(total)
            total += size
        self.total = total

    def spans(self, start: int, end: int) -> list[Span]:
        """The non-empty per-file pieces of logical ``[start, end)``, in order (empty
        files hold no byte, so they are in no span: nothing reads or writes them)."""
        if not 0 <= start <= end <= self.total:
            raise ValueError(f"range [{start}, {end}) outside 0..{self.total}")
        spans: list[Span] = []
        index = max(0, bisect_right(self.starts, start) - 1)
        position = start
        while position < end:
            while self.starts[index] + self.sizes[index] <= position:
                index += 1  # empty files and files wholly before the position
            file_start = self.starts[index]
            length = min(end, file_start + self.sizes[index]) - position
            spans.append(Span(index, position - file_start, length, position))
            position += length
            index += 1
        return spans


def scan_dir(root: Path) -> list[tuple[str, Path, int]]:
    """The regular files under ``root`` as ``(relative path, path, size)`` in tree order.

    Raises:
        UsageError: a symlink, a special file, an unsafe name, or no file at all.
    """
    found: list[tuple[str, Path, int]] = []

    def walk(directory: Path, prefix: str) -> None:
        with os.scandir(directory) as entries:
            for entry in entries:
                rel = f"{prefix}{entry.name}"
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISLNK(mode):
                    raise UsageError(
                        f"swarm: {directory / entry.name} is a symlink: a directory artifact "
                        "holds regular files only (copy the target in, or remove the link)"
                    )
                if stat.S_ISDIR(mode):
                    walk(Path(entry.path), rel + "/")
                elif stat.S_ISREG(mode):
                    try:
                        check_path(rel)
                    except ManifestError as error:
                        raise UsageError(f"{error}; rename {entry.path}") from error
                    found.append((rel, Path(entry.path), entry.stat(follow_symlinks=False).st_size))
                else:
                    raise UsageError(
                        f"swarm: {entry.path} is not a regular file (a fifo, socket or "
                        "device): a directory artifact holds regular files only"
                    )

    walk(root, "")
    if not found:
        raise UsageError(f"swarm: {root} holds no file: nothing to publish")
    found.sort(key=lambda item: tree_order(item[0]))
    return found


def tree_renames(paths: Iterable[str], root: str) -> dict[int, str]:
    """libtorrent's ``renamed_files`` for a directory artifact kept in the directory
    ``root`` (relative to the save path): file i at ``root/<path>``, whatever the
    torrent's name (the staging directory beside DEST, then DEST itself)."""
    return {index: f"{root}/{path}" for index, path in enumerate(paths)}
