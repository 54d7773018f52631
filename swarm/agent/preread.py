"""What ``swarm fetch`` reads from S3 while the daemon it has just started comes up.

A fresh node's daemon serves 0.2 s after its launch alone, 0.8 s when eight start at
once on two cores (imports and libtorrent's session: CPU, not network), and its link
stood idle until then. ``swarm fetch`` has nothing else to do meanwhile: it reads the
manifest (:class:`ManifestPreread`) and then the artifact's first pieces
(:class:`DataPreread`) into a staging file in the node's home, and hands both over with
its fetch request. The daemon checks each piece's SHA-1 (libtorrent does, as for any S3
piece) and reads the rest; a piece that fails is read again like any other.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from swarm.agent.hybrid import TorrentSink
    from swarm.manifest import Manifest

log = logging.getLogger(__name__)

PREREAD_WAIT: Final = 1.0
"""Seconds ``swarm fetch`` waits, once its daemon answers, for the manifest it is reading
(:class:`ManifestPreread`); then the daemon reads it itself."""

MAX_PREREAD_BYTES: Final = 512 << 10
"""A manifest larger than this in the request (JSON-quoted) is left to the daemon: a
request body holds at most 1 MiB (:data:`swarm.agent.api.MAX_BODY`)."""

PREREAD_READS: Final = 2
"""Reads of the manifest side by side (:class:`ManifestPreread`): two GETs of a small
object cost nothing beside a fetch, and two lost packets at once are rare."""


class ManifestPreread:
    """The artifact's manifest, read from S3 by ``swarm fetch`` while the daemon it has
    just started comes up (0.3-0.4 s on a fleet node), so that the daemon need not read
    it after: across a WAN the catalog entry and the manifest were four round trips (0.38
    s of far-region's start), three since the entry holds the manifest
    (:func:`swarm.catalog.lookup`): far-region's daemons now have it 0.01-0.05 s after
    they listen, not 0.08-0.2. Read :data:`PREREAD_READS` times at once, on connections of
    their own, and the first answer taken: on a lossy path one lost SYN or segment holds
    a read for a retransmission timeout (one far-region node had its manifest 0.6 s after
    the others, at 0.5% loss). No retries: on any failure the daemon reads it itself,
    retrying, and says what is wrong. Only for a daemon this command starts (it has the
    same settings and credentials)."""

    def __init__(
        self, source: str, catalog: str | None, endpoint_url: str | None, secret: str | None
    ) -> None:
        self._text: str | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._left = PREREAD_READS  # reads not finished yet
        for n in range(PREREAD_READS):
            threading.Thread(
                target=self._read,
                args=(source, catalog, endpoint_url, secret),
                name=f"manifest-preread-{n}",
                daemon=True,
            ).start()

    def _read(
        self, source: str, catalog: str | None, endpoint_url: str | None, secret: str | None
    ) -> None:
        text: str | None = None
        try:
            text = self._read_once(source, catalog, endpoint_url, secret)
        finally:
            with self._lock:
                self._left -= 1
                if text is not None and self._text is None:
                    self._text = text
                if self._text is not None or not self._left:
                    self._done.set()

    @staticmethod
    def _read_once(
        source: str, catalog: str | None, endpoint_url: str | None, secret: str | None
    ) -> str | None:
        from swarm import catalog as catalogs
        from swarm.s3http import S3Client

        try:
            client = S3Client(endpoint_url, max_attempts=1)
            try:
                url, inline = catalogs.lookup(client, source, catalog)
                _, data = catalogs.read_manifest(client, url, secret, inline)
            finally:
                client.close()
        except Exception as error:  # the daemon reads it, and reports what is wrong
            log.debug("manifest of %s not read ahead: %s", source, error)
            return None
        text = data.decode()
        return text if len(json.dumps(text)) <= MAX_PREREAD_BYTES else None  # as it travels

    def result(self, timeout: float = PREREAD_WAIT) -> str | None:
        """The manifest's text, or None (not read within ``timeout``, failed, or large)."""
        self._done.wait(timeout)
        with self._lock:
            return self._text


PREREAD_DIR: Final = "preread"
"""The folder of the node's home that holds the staging files (``IH.PID``)."""

PREREAD_STREAMS: Final = 2
"""GETs side by side, one piece each (:class:`DataPreread`). Few, so that each piece
lands soon: the pieces still on their way when the daemon serves hold its fetch request
back (:data:`HANDOVER_WAIT`)."""

HANDOVER_WAIT: Final = 0.5
"""Seconds ``swarm fetch`` waits, once its daemon serves, for the pieces it is still
reading; a piece not in by then is left (the daemon reads it)."""

MANIFEST_WAIT: Final = 30.0
"""Seconds the data preread waits for the manifest (it ends at the handover anyway)."""

_STAGING_NAME = re.compile(r"([0-9a-f]{40})\.([0-9]+)")


def staging_dir(home: Path) -> Path:
    return home / PREREAD_DIR


class DataPreread:
    """The artifact's pieces, read from S3 by ``swarm fetch`` from the moment it has the
    manifest until its daemon serves (:meth:`finish`), into a staging file
    ``$SWARM_HOME/preread/IH.PID`` at their offsets. :data:`PREREAD_STREAMS` GETs of one
    piece each, from a random piece on (nodes starting together read different pieces,
    which they then trade; each piece leaves S3 about once when the origin is the
    bottleneck). Nothing is read for a directory artifact (many objects), an artifact
    the node's home already records (the daemon resumes it), or when the manifest was not
    read. No retries: the daemon reads whatever this did not."""

    def __init__(
        self,
        manifest: ManifestPreread,
        home: Path,
        endpoint_url: str | None,
        secret: str | None,
        streams: int = PREREAD_STREAMS,
    ) -> None:
        self.home = home
        self.path: Path | None = None
        self._endpoint_url = endpoint_url
        self._secret = secret
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._done: list[int] = []
        self._order: list[int] = []
        self._next = 0
        self._streams: list[threading.Thread] = []
        self._started = threading.Event()
        """Set once the streams run (or will not)."""
        threading.Thread(
            target=self._run, args=(manifest, streams), name="data-preread", daemon=True
        ).start()

    def _run(self, preread: ManifestPreread, streams: int) -> None:
        try:
            manifest = self._manifest(preread)
            if manifest is None:
                return
            count = manifest.layout.count
            first = random.randrange(count)  # not the daemon's stripe: its id may not exist yet
            with self._lock:  # against discard(): a file made after it would stay behind
                if self._stop.is_set():
                    return
                path = self.path = self._create(manifest.info_hash)
                self._order = [(first + n) % count for n in range(count)]
            for n in range(streams):
                thread = threading.Thread(
                    target=self._stream, args=(manifest, path), name=f"data-preread-{n}"
                )
                thread.daemon = True
                thread.start()
                self._streams.append(thread)
        except Exception as error:  # the daemon reads everything itself
            log.debug("no data read ahead: %s", error)
        finally:
            self._started.set()

    def _manifest(self, preread: ManifestPreread) -> Manifest | None:
        from swarm.manifest import Manifest

        text = preread.result(MANIFEST_WAIT)
        if text is None:
            return None
        manifest = Manifest.loads(text.encode(), self._secret, origin="the manifest read ahead")
        if manifest.is_tree or manifest.size == 0:
            return None
        if (self.home / "artifacts" / f"{manifest.info_hash}.swarm").exists():
            return None  # held (or partly): the daemon resumes it
        return manifest

    def _create(self, info_hash: str) -> Path:
        folder = staging_dir(self.home)
        folder.mkdir(exist_ok=True)
        sweep(folder)
        path = folder / f"{info_hash}.{os.getpid()}"
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return path

    def _stream(self, manifest: Manifest, path: Path) -> None:
        from swarm.s3http import S3Client

        layout = manifest.layout
        # its own descriptor, closed by the stream: the staging file may be unlinked
        # (discard) while a last piece is still on its way here
        fd = os.open(path, os.O_WRONLY)
        client = S3Client(self._endpoint_url, max_connections=1, max_attempts=1)
        try:
            while True:
                with self._lock:
                    if self._stop.is_set() or self._next >= len(self._order):
                        return
                    index = self._order[self._next]
                    self._next += 1
                offset, length = layout.offset(index), layout.length(index)
                answer = client.get_object(
                    Bucket=manifest.bucket,
                    Key=manifest.key,
                    Range=f"bytes={offset}-{offset + length - 1}",
                )
                body = answer["Body"]
                try:
                    data = body.read(length)
                finally:
                    body.close()
                if len(data) != length:
                    return
                view = memoryview(data)
                while view:
                    view = view[os.pwrite(fd, view, offset + length - len(view)) :]
                with self._lock:
                    self._done.append(index)
        except Exception as error:  # S3 or the disk said no: the daemon reads the rest
            log.debug("data read ahead stopped: %s", error)
        finally:
            client.close()
            os.close(fd)

    @property
    def done(self) -> tuple[int, ...]:
        """The pieces in the staging file so far, in the order they landed."""
        with self._lock:
            return tuple(self._done)

    def finish(self, wait: float = HANDOVER_WAIT) -> tuple[str, tuple[int, ...]] | None:
        """Stop taking pieces, wait up to ``wait`` seconds for those on their way, and
        return the staging file and the pieces in it (None: none)."""
        self._stop.set()
        deadline = time.monotonic() + wait
        self._started.wait(wait)
        for thread in self._streams if self._started.is_set() else []:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            done = tuple(sorted(self._done))
            if self.path is None or not done:
                return None
            return str(self.path), done

    def discard(self) -> None:
        """Remove the staging file (once the daemon has taken its pieces, or on failure)."""
        self._stop.set()
        with self._lock:
            path, self.path = self.path, None
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()


def sweep(folder: Path) -> None:
    """Remove staging files whose ``swarm fetch`` is gone (killed before its cleanup)."""
    for entry in folder.iterdir():
        match = _STAGING_NAME.fullmatch(entry.name)
        if match is None or _alive(int(match.group(2))):
            continue
        with contextlib.suppress(OSError):
            entry.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as error:
        return error.errno == errno.EPERM
    return True


def adopt(sink: TorrentSink, home: Path, staging: str, pieces: tuple[int, ...]) -> int:
    """Offer the pieces of a staging file (:class:`DataPreread`) to the torrent, which
    checks each one's SHA-1 before it keeps it; returns how many it kept. A staging file
    outside the home's preread folder, or of another artifact, is refused: the request
    names a path, and the daemon reads only its own."""
    from swarm.errors import UsageError

    path = Path(staging)
    match = _STAGING_NAME.fullmatch(path.name)
    if path.parent != staging_dir(home) or match is None or match.group(1) != sink.info_hash:
        raise UsageError(f"swarm: {staging} is not a staging file of this artifact in {home}")
    layout = sink.manifest.layout
    wanted = sorted({i for i in pieces if 0 <= i < layout.count and not sink.have(i)})
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:  # swarm fetch gave up meanwhile: the sources read them
        log.warning("pieces read ahead not taken: %s", error)
        return 0
    try:
        for index in wanted:
            data = os.pread(fd, layout.length(index), layout.offset(index))
            sink.offer(index, data, "s3")
    finally:
        os.close(fd)
    kept = len(wanted) - sink.settle(wanted)
    log.info(
        "%s: %d of %d pieces as swarm fetch read them from S3 while this daemon started",
        sink.manifest.name, kept, len(wanted),
    )  # fmt: skip
    return kept
