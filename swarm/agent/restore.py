"""What a starting daemon takes over from its earlier runs under ``SWARM_HOME``: its
node id (:func:`node_id`) and the records of the artifacts it held (:func:`held_records`),
which ``Daemon.restore`` seeds again.

Separate from :mod:`.daemon` because it runs once, at start, and reads what a previous
process left behind (records, resume data, data files that may be gone or replaced
meanwhile); the daemon's own lifecycle of an artifact starts at ``Daemon._add``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from swarm.agent import registry
from swarm.errors import NoSpaceError, SwarmError
from swarm.manifest import Manifest

log = logging.getLogger("swarm.agent.daemon")  # the daemon's log, as before the split


def node_id(home: Path) -> str:
    """This node's stable id; a fresh one if the file is missing, empty or unreadable
    (written atomically, so a full disk cannot leave an empty id behind)."""
    path = home / "node_id"
    with contextlib.suppress(OSError):
        existing = path.read_text().strip()
        if existing:
            return existing
    new = secrets.token_hex(8)
    tmp = path.with_name("node_id.tmp")
    try:
        tmp.write_text(new)
        os.replace(tmp, path)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        if error.errno == errno.ENOSPC:
            raise NoSpaceError(
                f"swarm: no space left in SWARM_HOME {home} to write the node id (ENOSPC); "
                "free some space"
            ) from error
        raise SwarmError(f"swarm: cannot write {path}: {error.strerror}") from error
    return new


@dataclass(frozen=True)
class HeldRecord:
    """An artifact a previous run held, as its record under ``SWARM_HOME`` says."""

    manifest: Manifest
    data_path: Path
    dest: Path | None
    verified: bool
    """The whole file matched the manifest before the stop (else a fetch was under way)."""


def held_records(home: Path, forget_resume: Callable[[str], None]) -> Iterator[HeldRecord]:
    """The artifacts held before a restart whose data is still there. A record that does
    not load is skipped; one whose file was replaced while the daemon was stopped is
    forgotten, and one whose data is gone with its resume data too (``forget_resume``,
    by info-hash): neither is advertised."""
    for path in sorted((home / "artifacts").glob("*.swarm")):
        try:
            manifest = Manifest.loads(path.read_bytes(), origin=str(path))
        except SwarmError as error:
            log.warning("skipping %s: %s", path, error)
            continue
        try:
            data_path, dest, verified = registry.load_record(home, manifest)
        except registry.FileReplacedError as replaced:
            log.warning(
                "not seeding %s: %s was replaced while the daemon was stopped",
                manifest.name,
                replaced,
            )
            registry.forget_record(home, manifest.info_hash)
            continue
        if not data_path.exists():
            log.warning("not seeding %s: its data %s is gone", manifest.name, data_path)
            registry.forget_record(home, manifest.info_hash)
            forget_resume(manifest.info_hash)
            continue
        yield HeldRecord(manifest, data_path, dest, verified)
