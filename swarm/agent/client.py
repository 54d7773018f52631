"""The CLI's side of the daemon: start it on demand, ask it for an artifact, place DEST.

The daemon's API is HTTP over ``$SWARM_HOME/daemon.sock`` (mode 0600: only this user).
"""

from __future__ import annotations

import contextlib
import errno
import gc
import http.client
import json
import logging
import os
import select
import socket
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from swarm.agent.destlock import DestLock
from swarm.agent.finisher import copy_verified
from swarm.errors import (
    DeadlineError,
    DestBusyError,
    IntegrityError,
    NoSpaceError,
    NotFoundError,
    SwarmError,
)
from swarm.messages import FetchRequest

if TYPE_CHECKING:
    from swarm.agent.earlyread import EarlyRead

log = logging.getLogger(__name__)

DAEMON_START_TIMEOUT = 30.0
DAEMON_START_POLL = 0.02
"""Seconds between looks for a starting daemon's socket, where its ready pipe said
nothing (:data:`READY_FD_ENV`): each look is one failed connect."""
READY_FD_ENV: Final = "SWARM_READY_FD"
"""The environment variable that gives a forked daemon the pipe it writes one byte to
once it serves (:func:`swarm.agent.serve.tell_ready`): ``swarm fetch`` waits on it
instead of trying the socket every DAEMON_START_POLL, which cost each of six nodes
starting together on two cores 40 connects and the daemon up to 20 ms of its start."""
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


class DaemonGoneError(SwarmError, ConnectionError):
    """The daemon died or stopped while a command talked to it (exit code 1). Also a
    ConnectionError, for callers that wait for a daemon to come up."""


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

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 120.0,
        data: bytes | bytearray | None = None,
    ) -> Any:
        """``method path`` with ``body`` as JSON, or ``data`` as raw bytes (a piece:
        :mod:`swarm.agent.earlyread`); the JSON answer, or the daemon's error raised."""
        # A GET is asked again once if the connection closed without an answer: seen once
        # in some 25 fleet runs mid-fetch, with the daemon alive; a daemon that died
        # refuses the retry's connection, and that error is reported.
        tries = 2 if method == "GET" else 1
        for attempt in range(tries):
            conn = UnixHTTPConnection(self.sock, timeout)
            try:
                headers = self.headers
                payload: bytes | bytearray | None = data
                if data is not None:
                    headers = {**headers, "Content-Type": "application/octet-stream"}
                elif body is not None:
                    payload = json.dumps(body).encode()
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
                raw = response.read()
                break
            except TimeoutError:
                raise
            except (http.client.RemoteDisconnected, ConnectionResetError) as error:
                if attempt + 1 < tries:
                    time.sleep(0.1)
                    continue
                raise self._gone(error) from error
            except (OSError, http.client.HTTPException) as error:
                raise self._gone(error) from error
            finally:
                conn.close()
        try:
            answer = json.loads(raw or b"null")
        except ValueError:
            answer = None
        if not isinstance(answer, dict) and response.status != 200:
            answer = {"error": f"swarm: the daemon answered HTTP {response.status}: {raw[:200]!r}"}
        if response.status != 200:
            refused = SwarmError(answer.get("error", f"daemon answered {response.status}"))
            refused.exit_code = int(answer.get("exit_code", 1))
            raise refused
        return answer

    def _gone(self, error: BaseException) -> DaemonGoneError:
        return DaemonGoneError(
            f"swarm: the node's daemon stopped answering ({error}); see "
            f"{self.home / 'daemon.log'}, then rerun: the fetch resumes where it stopped"
        )

    def alive(self) -> bool:
        try:
            self.call("GET", "/v1/health", timeout=2)
            return True
        except (OSError, SwarmError):
            return False


_forked_daemon = False


def forked_a_daemon() -> bool:
    """Whether this process forked its node's daemon (:func:`fork_daemon`): the two
    share their pages until one writes to them, so this one had better not end by
    tearing its interpreter down (see :func:`swarm.cli.main`)."""
    return _forked_daemon


def fork_daemon(home: Path, args: list[str], coordinator: str | None = None) -> tuple[int, int]:
    """Start ``swarm ARGS`` (the daemon) for ``home`` in a child of this process, in a
    session of its own, its output appended to ``daemon.log``; returns its pid and the
    read end of the pipe it writes one byte to once it serves (:data:`READY_FD_ENV`; the
    caller closes it).

    A fork, not a new interpreter: this process already holds Python, click and the
    CLI's modules, which a fresh ``python -m swarm daemon`` loaded again (0.06-0.07 CPU-s
    of a node's start; six nodes starting at once share two cores in the s3-fast bench,
    so each one's first byte waits for all of them). A fork carries only the calling
    thread: the CLI runs none yet, and loads nothing that starts its own (awscrt's event
    loops, libtorrent's session); tests/integration/test_s3http.py holds it to that.
    ``coordinator`` (the setting as ``swarm fetch`` resolved it): the child opens its
    connection to the first one at once
    (:func:`swarm.agent.reporter.preconnect`)."""
    global _forked_daemon
    sys.stdout.flush()
    sys.stderr.flush()
    ready_read, ready_write = os.pipe()
    # Every object now alive is shared with the child, page by page, until one side
    # writes to it; a collection writes to every object it scans. Frozen, neither
    # side's collections scan them (CPython's advice for forking servers).
    gc.freeze()
    try:
        pid = os.fork()
    except OSError:
        os.close(ready_read)
        os.close(ready_write)
        raise
    if pid:
        os.close(ready_write)  # the child's copy stays open until it is ready or gone
        _forked_daemon = True
        return pid, ready_read
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(home / "daemon.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        os.environ["SWARM_HOME"] = str(home)
        os.close(ready_read)
        os.environ[READY_FD_ENV] = str(ready_write)
        from swarm import config
        from swarm.agent import reporter

        with contextlib.suppress(Exception):  # a bad setting: the daemon says what is wrong
            urls = config.coordinator_urls(coordinator)
            if urls:
                reporter.preconnect(urls[0])
        import setproctitle

        # `ps` shows what runs, not the `swarm fetch` it was forked from
        setproctitle.setproctitle(" ".join(["swarm", *args]))
        logging.root.handlers.clear()  # the CLI's, at its level: the daemon sets its own
        from swarm.cli import cli

        try:
            cli.main(args=args, prog_name="swarm")
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else int(done.code is not None)
    except BaseException:
        traceback.print_exc()
    finally:
        # not through the CLI's frames above this call: they belong to the parent
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def ensure_daemon(
    home: Path,
    listen: str | None,
    coordinator: str | None,
    peers_from_asg: str | None = None,
    token: str | None = None,
    while_starting: Callable[[], object] | None = None,
) -> DaemonClient:
    """Return a client of this home's daemon, starting one in the background if none answers.
    ``while_starting`` runs once a daemon was forked, while it comes up (a thread must not
    start before the fork: the child would hold copies of its locks).

    The fleet secret reaches the daemon through the environment, never its command line."""
    client = DaemonClient(home, token)
    if client.alive():
        return client
    home.mkdir(parents=True, exist_ok=True)
    # -v: daemon.log says what the daemon chose (its UDP server, UDP on or off), not only
    # what went wrong
    args = ["-v", "daemon"]
    if listen:
        args += ["--listen", listen]
    if coordinator:
        args += ["--coordinator", coordinator]
    if peers_from_asg:
        args += ["--peers-from-asg", peers_from_asg]
    pid, ready = fork_daemon(home, args, coordinator)
    deadline = time.monotonic() + DAEMON_START_TIMEOUT
    try:
        if while_starting is not None:
            while_starting()
        # One byte once the daemon serves; none (the end of the pipe) if it exited first
        # (another daemon took the home meanwhile, or it failed: the loop below says which)
        select.select([ready], [], [], max(0.0, deadline - time.monotonic()))
    finally:
        os.close(ready)
    exit_code: int | None = None
    while not client.alive():
        if exit_code is None:
            done, status = os.waitpid(pid, os.WNOHANG)
            exit_code = os.waitstatus_to_exitcode(status) if done else None
        if exit_code is not None and not client.alive():
            tail = (home / "daemon.log").read_text(errors="replace")[-2000:]
            if "already runs" not in tail:
                error = SwarmError(f"swarm: the daemon exited at start; its log says:\n{tail}")
                error.exit_code = exit_code if 0 < exit_code < 9 else 1
                if "ENOSPC" in tail or "No space left" in tail:
                    error.exit_code = NoSpaceError.exit_code
                raise error
        if time.monotonic() > deadline:
            raise SwarmError(
                f"swarm: the daemon did not answer within {DAEMON_START_TIMEOUT:.0f}s; "
                f"see {home / 'daemon.log'}"
            )
        time.sleep(DAEMON_START_POLL)
    return client


def daemon_error(status: dict[str, Any]) -> SwarmError:
    """A libtorrent storage error as the CLI reports it (a full disk is exit code 6)."""
    if status.get("error_no_space"):
        return NoSpaceError(
            f"swarm: no space left for {status['path']} ({status['error']}, ENOSPC): free "
            "space on that file system and rerun; the fetch resumes"
        )
    return SwarmError(f"swarm: the daemon cannot store the artifact: {status['error']}")


def failed_error(status: dict[str, Any]) -> SwarmError:
    error = SwarmError(str(status["failed"]))
    error.exit_code = int(status.get("exit_code") or 1)
    return error


def follow(client: DaemonClient, path: str, dest: Path, timeout: float) -> dict[str, Any]:
    """The artifact's status; an artifact the daemon dropped meanwhile (its file deleted
    or replaced) ends the fetch: what is at DEST now is not what it verified."""
    try:
        return client.call("GET", path, timeout=timeout)  # type: ignore[no-any-return]
    except SwarmError as error:
        if error.exit_code != NotFoundError.exit_code:
            raise
        raise DestBusyError(
            f"swarm: {dest} was deleted or replaced (by another swarm fetch?) before this "
            "fetch returned; rerun it"
        ) from None


def fetch_via_daemon(
    client: DaemonClient,
    request: FetchRequest,
    dest: Path,
    *,
    deadline: float | None,
    on_status: Callable[[dict[str, Any]], None],
    early: EarlyRead | None = None,
) -> dict[str, Any]:
    """Ask the daemon for the artifact and follow its progress until it is at DEST;
    ``early``: the pieces read for it meanwhile, named in ``request``, handed over once
    it holds the artifact.

    The daemon keeps the data at DEST itself (one copy on disk) unless DEST is a private
    ``--copy`` or the node already holds the artifact elsewhere: then DEST is a copy of
    the daemon's verified file (a reflink where the file system can), made here."""
    started = time.monotonic()

    def remaining() -> float:
        if deadline is None:
            return 120.0
        left = deadline - (time.monotonic() - started)
        if left <= 0:
            raise DeadlineError(
                f"swarm: deadline of {deadline:g}s passed before the artifact was complete; "
                "the daemon keeps fetching, rerun to wait again"
            )
        return left

    try:
        status = client.call("POST", "/v1/fetch", request.to_json(), timeout=remaining())
        if early is not None:
            early.finish()  # the daemon reads S3 itself now
            if request.early and not status["complete"]:
                early.hand_over(client, status["info_hash"])
        path = f"/v1/artifacts/{status['info_hash']}"
        while not status["complete"]:
            on_status(status)
            if status.get("failed"):
                raise failed_error(status)
            if status.get("error"):
                raise daemon_error(status)
            # a long poll: the daemon answers once the artifact is done (or after the
            # interval); an older daemon answers at once, so pace the loop here too
            asked = time.monotonic()
            wait = min(STATUS_INTERVAL, remaining())
            status = follow(client, f"{path}?wait={wait:.2f}", dest, timeout=min(30.0, remaining()))
            if not status["complete"]:
                time.sleep(max(0.0, wait - (time.monotonic() - asked)))
    except TimeoutError:
        if deadline is not None:  # the daemon's answer (a manifest read) outlived it
            raise DeadlineError(
                f"swarm: deadline of {deadline:g}s passed while the daemon was still reading "
                "the artifact's manifest (is the S3 endpoint answering?); rerun to wait again"
            ) from None
        raise DaemonGoneError(
            f"swarm: the node's daemon did not answer; see {client.home / 'daemon.log'}"
        ) from None
    on_status(status)
    held = Path(status["path"])
    if held == dest:  # the daemon's own file: make sure it is still the one verified
        follow(client, path, dest, timeout=30.0)
    if held != dest:
        owner = {"pid": os.getpid(), "name": status["name"], "info_hash": status["info_hash"]}
        lock = DestLock(dest, owner)
        if not lock.acquire(status["info_hash"], timeout=remaining()):
            remaining()
        try:
            if held.is_dir():  # a directory artifact: its manifest is in the node's home
                from swarm.agent.treefs import copy_tree_verified
                from swarm.manifest import Manifest

                record = client.home / "artifacts" / f"{status['info_hash']}.swarm"
                manifest = Manifest.loads(record.read_bytes(), origin=str(record))
                copy_tree_verified(manifest, held, dest, writable=request.copy)
            else:
                copy_verified(held, dest, status["sha256"], status["size"], copy_file)
                if request.copy:
                    os.chmod(dest, 0o644)
        finally:
            lock.release()
    status["seconds"] = round(time.monotonic() - started, 3)
    return status
