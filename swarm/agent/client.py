"""The CLI's side of the daemon: start it on demand, ask it for an artifact, place DEST.

The daemon's API is HTTP over ``$SWARM_HOME/daemon.sock`` (mode 0600: only this user).
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swarm.agent.store import ensure_space, partial_path
from swarm.errors import DeadlineError, IntegrityError, NoSpaceError, SwarmError
from swarm.pieces import file_sha256

DAEMON_START_TIMEOUT = 30.0
STATUS_INTERVAL = 0.5
COPY_CHUNK = 8 << 20


def copy_file(src: int, dst: int, size: int) -> None:
    """Copy ``size`` bytes between file descriptors in the kernel, or by read and write
    where ``copy_file_range`` is refused (an old kernel, some network filesystems)."""
    copied = 0
    try:
        while copied < size:
            n = os.copy_file_range(src, dst, size - copied)
            if n == 0:
                raise IntegrityError(f"swarm: the daemon's data file ended at {copied} bytes")
            copied += n
        return
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    os.lseek(src, copied, os.SEEK_SET)
    os.lseek(dst, copied, os.SEEK_SET)
    while copied < size:
        chunk = os.read(src, min(COPY_CHUNK, size - copied))
        if not chunk:
            raise IntegrityError(f"swarm: the daemon's data file ended at {copied} bytes")
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]
        copied += len(chunk)


def sock_path(home: Path) -> Path:
    """The daemon's local API socket for a node home."""
    return home / "daemon.sock"


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float = 30.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class DaemonClient:
    def __init__(self, home: Path, token: str | None = None) -> None:
        self.home = home
        self.sock = sock_path(home)
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, body: Any = None, timeout: float = 120.0) -> Any:
        conn = UnixHTTPConnection(self.sock, timeout)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=payload, headers=self.headers)
            response = conn.getresponse()
            data = json.loads(response.read() or b"null")
        finally:
            conn.close()
        if response.status != 200:
            error = SwarmError(data.get("error", f"daemon answered {response.status}"))
            error.exit_code = int(data.get("exit_code", 1))
            raise error
        return data

    def alive(self) -> bool:
        try:
            self.call("GET", "/v1/health", timeout=2)
            return True
        except (OSError, SwarmError, http.client.HTTPException):
            return False


def ensure_daemon(
    home: Path,
    listen: str | None,
    coordinator: str | None,
    peers_from_asg: str | None = None,
    token: str | None = None,
) -> DaemonClient:
    """Return a client of this home's daemon, starting one in the background if none answers.

    The fleet secret reaches the daemon through the environment, never its command line."""
    client = DaemonClient(home, token)
    if client.alive():
        return client
    home.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "swarm", "daemon"]
    if listen:
        args += ["--listen", listen]
    if coordinator:
        args += ["--coordinator", coordinator]
    if peers_from_asg:
        args += ["--peers-from-asg", peers_from_asg]
    log = (home / "daemon.log").open("ab")
    process = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={**os.environ, "SWARM_HOME": str(home)},
    )
    log.close()
    deadline = time.monotonic() + DAEMON_START_TIMEOUT
    while not client.alive():
        if process.poll() is not None and not client.alive():
            tail = (home / "daemon.log").read_text(errors="replace")[-2000:]
            if "already runs" not in tail:
                raise SwarmError(f"swarm: the daemon exited at start; its log says:\n{tail}")
        if time.monotonic() > deadline:
            raise SwarmError(
                f"swarm: the daemon did not answer within {DAEMON_START_TIMEOUT:.0f}s; "
                f"see {home / 'daemon.log'}"
            )
        time.sleep(0.1)
    return client


def place(data_path: Path, dest: Path, sha256: str, size: int) -> None:
    """Copy the daemon's verified data to DEST, check the copy's SHA-256, then rename.

    A copy, not a link: the application may write to DEST (an index.db opened read-write),
    and the daemon must keep seeding the original bytes. The copy is made in the kernel
    (``copy_file_range``: one page-cache copy instead of a read and a write through
    Python, and a reflink on XFS or btrfs), and the hash reads the *copy* through mmap, so
    what is checked is what the application will open.
    """
    ensure_space(dest.parent, size)
    tmp = partial_path(dest).with_suffix(".placing")
    try:
        with data_path.open("rb") as src, tmp.open("wb") as out:
            copy_file(src.fileno(), out.fileno(), size)
            os.fsync(out.fileno())
        digest = file_sha256(tmp)
        if digest != sha256:
            raise IntegrityError(
                f"swarm: {data_path} has SHA-256 {digest}, the manifest says {sha256}"
                ": the daemon's copy is damaged; remove it and fetch again"
            )
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    dir_fd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def daemon_error(status: dict[str, Any]) -> SwarmError:
    """A libtorrent storage error as the CLI reports it (a full disk is exit code 6)."""
    if status.get("error_no_space"):
        return NoSpaceError(
            f"swarm: the daemon's data directory is full ({status['error']}, ENOSPC); free "
            "space and rerun"
        )
    return SwarmError(f"swarm: the daemon cannot store the artifact: {status['error']}")


def fetch_via_daemon(
    client: DaemonClient,
    request: dict[str, Any],
    dest: Path,
    *,
    deadline: float | None,
    on_status: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Ask the daemon for the artifact, follow its progress, then place DEST."""
    started = time.monotonic()
    status = client.call("POST", "/v1/fetch", request)
    ensure_space(dest.parent, status["size"])
    path = f"/v1/artifacts/{status['info_hash']}"
    while not status["complete"]:
        on_status(status)
        if status.get("error"):
            raise daemon_error(status)
        if deadline and time.monotonic() - started > deadline:
            raise DeadlineError(
                f"swarm: deadline of {deadline:g}s passed at {status['have_bytes']} of "
                f"{status['size']} bytes; the daemon keeps fetching, rerun to wait again"
            )
        time.sleep(STATUS_INTERVAL)  # polling our own daemon's API, not libtorrent
        status = client.call("GET", path)
    on_status(status)
    place(Path(status["path"]), dest, status["sha256"], status["size"])
    status["seconds"] = round(time.monotonic() - started, 3)
    return status
