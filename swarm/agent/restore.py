"""What a starting daemon takes over from its earlier runs under ``SWARM_HOME``: its
node id (:func:`node_id`) and the artifacts it held, seeded again (:func:`restore`).

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
from pathlib import Path
from typing import TYPE_CHECKING

from swarm.agent import registry
from swarm.agent.destlock import DestLock
from swarm.errors import NoSpaceError, SwarmError
from swarm.manifest import Manifest

if TYPE_CHECKING:
    from swarm.agent.daemon import Daemon

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


def restore(daemon: Daemon, clean: bool = True) -> None:
    """Seed again everything held before a restart (resume data spares a re-download;
    after an unclean stop, ``clean`` False, the data files are hashed instead). An
    artifact whose file is gone is forgotten, not advertised."""
    for path in sorted((daemon.home / "artifacts").glob("*.swarm")):
        try:
            manifest = Manifest.loads(path.read_bytes(), origin=str(path))
        except SwarmError as error:
            log.warning("skipping %s: %s", path, error)
            continue
        try:
            data_path, dest, verified = registry.load_record(daemon.home, manifest)
        except registry.FileReplacedError as replaced:
            log.warning(
                "not seeding %s: %s was replaced while the daemon was stopped",
                manifest.name,
                replaced,
            )
            registry.forget_record(daemon.home, manifest.info_hash)
            continue
        if not data_path.exists():
            log.warning("not seeding %s: its data %s is gone", manifest.name, data_path)
            registry.forget_record(daemon.home, manifest.info_hash)
            daemon.session.resume_dir.joinpath(f"{manifest.info_hash}.resume").unlink(
                missing_ok=True
            )
            continue
        # An unfinished fetch may hold pieces the S3 reader wrote itself (direct.py),
        # which libtorrent's resume data does not list: have it check the file.
        artifact = daemon._add(
            manifest,
            data_path,
            dest,
            {"peers"},
            trust_resume=clean and verified,
            verified=verified,
        )
        artifact.restored = True
        artifact.was_verified = verified
        if dest is not None and not verified:  # a fetch into DEST was under way
            lock = DestLock(dest, daemon._lock_owner(manifest))
            artifact.lock = lock if lock.try_acquire() else None
        daemon.completion.start(artifact)
        log.info("restored %s (%s) from %s", manifest.name, manifest.info_hash, data_path)
