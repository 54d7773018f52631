"""DEST is owned by one fetch at a time.

A lock file beside DEST (``.NAME.swarm-lock``), held with ``flock`` from the start of a
fetch to the rename into place, in both paths (``--no-daemon`` and the daemon), across
processes and node homes. It holds a line saying who owns it, for the other fetch's
message. The owner unlinks it before letting go; a waiter that gets the lock on a file
that is no longer at that path (unlinked meanwhile) tries again, the usual pattern for
lock files that do not outlive their use.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from swarm.errors import DestBusyError


def lock_path(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.swarm-lock")


class DestLock:
    """The lock on one DEST. ``owner`` describes this fetch (pid, artifact)."""

    def __init__(self, dest: Path, owner: dict[str, object]) -> None:
        self.dest = dest
        self.path = lock_path(dest)
        self.owner = owner
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def try_acquire(self) -> bool:
        """Take the lock if nobody holds it; True if this fetch now owns DEST."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # its owner removed it while we waited: take the new one
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(self.owner).encode() + b"\n", 0)
            self._fd = fd
            return True

    def acquire(self, same_artifact: str, timeout: float) -> bool:
        """Take the lock, or raise :class:`DestBusyError` naming its owner.

        When the owner fetches the same artifact (``same_artifact``, an info-hash) this
        fetch waits up to ``timeout`` seconds for it, then returns False if it still holds
        the lock: the caller may then find DEST complete."""
        deadline = time.monotonic() + timeout
        while not self.try_acquire():
            owner = self.current_owner()
            if owner.get("info_hash") != same_artifact:
                raise DestBusyError(
                    f"swarm: {self.dest} is being fetched by another swarm fetch "
                    f"({describe(owner)}); wait for it, or choose another DEST"
                )
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)  # polling another process's flock: no event to wait on
        return True

    def current_owner(self) -> dict[str, object]:
        with contextlib.suppress(OSError, ValueError):
            owner = json.loads(self.path.read_text() or "{}")
            if isinstance(owner, dict):
                return owner
        return {}

    def release(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = -1


def describe(owner: dict[str, object]) -> str:
    parts = [f"pid {owner.get('pid', '?')}"]
    if owner.get("name"):
        parts.append(f"artifact {owner['name']}")
    if owner.get("home"):
        parts.append(f"SWARM_HOME {owner['home']}")
    return ", ".join(parts)
