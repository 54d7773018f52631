"""The first pieces, read from S3 by ``swarm fetch`` while the daemon it started comes up.

A fresh node's daemon takes ~0.2 CPU-s to start (its interpreter's imports, libtorrent's
session); a scale-out's nodes start together on few cores, so its first GET came 0.7 s
into the s3-fast fleet (six nodes on two cores) and 1.0 s into the slow-uploads one
(eight), where aria2c's first MB came at 0.1 s and s5cmd's at 0.3-0.4: the node's
downlink idled for most of a second. ``swarm fetch`` itself is idle meanwhile, with the
manifest in hand (:class:`~swarm.agent.preread.ManifestPreread`): it reads pieces into
memory with one ranged GET from a random piece on (nodes starting together read
different pieces), names that GET's range in its fetch request (``early``: the S3 reader
leaves them alone), reads on until the daemon answers (once the fetch has its plan or
its first S3 GET), hands over what it read (``PUT /v1/artifacts/IH/pieces/N``, checked
by libtorrent's SHA-1 like any S3 piece), then says that no more come (the rest of the
range is the daemon's) and what it streamed after its request
(``POST /v1/artifacts/IH/early``).

Only for a single-file artifact of at least :data:`MIN_EARLY_SIZE`, with S3 among the
fetch's sources and near (a far S3 is left to the holders and UDP: see
``swarm.agent.origin``); any failure here is logged at debug level and leaves the daemon
to read those pieces itself.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

# At the top, not in the reading thread: ``swarm fetch`` imports this module before it
# forks its daemon, which needs the same modules for its own S3 reads; imported after
# the fork, each process loaded them (11.5 ms of a daemon's imports here, -X importtime)
from swarm.agent.rtt import s3_round_trip
from swarm.agent.udpchoice import s3_far
from swarm.manifest import Manifest
from swarm.messages import FetchRequest, S3Read
from swarm.s3http import S3Client
from swarm.sources.s3 import read_exactly

if TYPE_CHECKING:
    from swarm.agent.client import DaemonClient
    from swarm.agent.registry import Artifact

log = logging.getLogger(__name__)

MAX_EARLY_BYTES: Final = 32 << 20
"""Most bytes read ahead (held in the CLI's memory until handed over): a 0.3-1 s start at
a node's link rate, with room."""

MAX_EARLY_SHARE: Final = 8
"""Nor more than this fraction (one in eight) of the artifact's pieces: a head start, not
a fetch. Where peers hold the artifact the S3 bytes were not needed, and a small
artifact read ahead on a fast link came mostly from S3 (a late node of the tests' 24 MiB
fleet, which peers fed in full, took 20% from S3)."""

MIN_EARLY_SIZE: Final = 128 << 20
"""Nor for a smaller artifact: the first stripes of a fleet (8 MiB a node, lowest piece
first: :mod:`swarm.coordinator.origin`) reach its upper half before the coordinator
knows of these pieces, and the nodes that read those stripes read them again. CI's
origin-bound fleet (16 MiB, four nodes, two stripes covering all of it) sent 1.08-1.50 F
from its 100 Mbit origin, against 1.00 without, and took as long or longer (2.1-6.2 s
against 2.2-2.9); such a fetch lasts a few seconds and a head start of a few hundred
milliseconds shortens it by little."""

ANSWER_WAIT: Final = 1.0
"""Seconds the daemon's answer to a fetch request that names ``early`` pieces waits at
most for the fetch's first plan or S3 GET (:meth:`Artifact.await_s3_reads
<swarm.agent.registry.Artifact.await_s3_reads>`), while the CLI's GET goes on. Stopped
at the daemon's start instead, that GET left the downlink idle until the daemon's first
one: 0.1-0.3 s in the s3-fast fleet at full rates (the artifact registered, the
coordinator asked), where the daemon listened 0.7-1.2 s in."""

LINGER: Final = 2.0
"""Seconds the CLI reads, after the daemon answered, for the piece in progress; then it
is dropped and the daemon reads it."""

EARLY_WAIT: Final = ANSWER_WAIT + LINGER
"""Seconds the daemon's S3 reader leaves the pieces named ``early`` alone at most (a CLI
that died does not hand them over)."""

PART: Final = 256 << 10
"""Bytes read at a time, between two looks at whether to drop the piece in progress."""


class EarlyRead:
    """Pieces read from S3 in a thread of ``swarm fetch``: started once the manifest
    is read (``manifest_text`` waits for it), named in the fetch request (:meth:`claim`),
    ended by the daemon's answer (:meth:`finish`), handed over as they come
    (:meth:`hand_over`)."""

    def __init__(
        self,
        manifest_text: Callable[[], str | None],
        endpoint_url: str | None,
        secret: str | None,
    ) -> None:
        self._pieces: dict[int, bytearray] = {}  # read, not handed over yet
        self.s3_rtt: float | None = None
        """S3's round trip, measured before the GET (for the fetch request)."""
        self.s3_read: S3Read | None = None
        """The GET's bytes and seconds until :meth:`claim` (for the fetch request; the rest
        is told once handed over)."""
        self._sent_at = 0.0  # when the GET was sent (0: none)
        self._ended_at = 0.0  # when its reading ended (0: not yet)
        self._received = 0  # bytes the GET brought so far
        self._range: range = range(0)  # the GET's pieces
        self._next = 0  # the piece the GET brings next
        self._last: int | None = None  # the last piece to read (None: not stopped)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._drop = threading.Event()  # the piece in progress is dropped too
        self._done = False
        threading.Thread(
            target=self._run, args=(manifest_text, endpoint_url, secret), name="early-read",
            daemon=True,
        ).start()  # fmt: skip

    def claim(self) -> list[int]:
        """The daemon is up and the fetch request goes now: the pieces it names ``early``,
        those read and the rest of the GET's range (none if the GET has not begun). The
        read goes on until the daemon answers the request, which it does once the fetch
        has its first plan or S3 GET (:data:`ANSWER_WAIT`); then :meth:`finish`."""
        with self._lock:
            self.s3_read = self._tally()
            if self._done or not self._range:
                self._last = -1
                return sorted(self._pieces)
            return sorted({*self._pieces, *range(self._next, self._range.stop)})

    def finish(self) -> None:
        """The daemon answered the fetch request: the piece in progress is the last, and the
        rest of the range is the daemon's to read once told (:meth:`hand_over`). Not read
        beside the daemon's own GETs: these halved the S3 rate the coordinator measured
        there, and it kept the s3-fast fleet on stripes (peers 70% of the bytes) where S3
        filled every link."""
        with self._lock:
            if self._last is None:
                self._last = min(self._next, self._range.stop - 1) if self._range else -1

    def _tally(self) -> S3Read | None:
        """The GET's bytes and seconds so far (None: no GET)."""
        if not self._sent_at:
            return None
        return S3Read(self._received, (self._ended_at or time.monotonic()) - self._sent_at)

    def wait(self, timeout: float) -> bool:
        """Whether the read ended (its range read, stopped, or given up) within
        ``timeout``."""
        with self._changed:
            return self._changed.wait_for(lambda: self._done, timeout)

    def hand_over(self, client: DaemonClient, info_hash: str) -> None:
        """Give the daemon each piece as it is read (those named ``early``, for
        :data:`LINGER` at most), then tell it no more come, and what the GET streamed
        after :attr:`s3_read` (the daemon counts both as its S3 reader's). In a thread:
        the caller follows the fetch meanwhile."""
        path = f"/v1/artifacts/{info_hash}"

        def run() -> None:
            until = time.monotonic() + LINGER
            try:
                while True:
                    with self._changed:
                        while not self._pieces and not self._done:
                            left = until - time.monotonic()
                            if left <= 0:
                                self._drop.set()
                                break
                            self._changed.wait(left)
                        pieces, self._pieces = self._pieces, {}
                        done = self._done or self._drop.is_set()
                    for index, data in sorted(pieces.items()):
                        client.call("PUT", f"{path}/pieces/{index}", data=data, timeout=10.0)
                    if done and not pieces:
                        break
                told, tally = self.s3_read or S3Read(0, 0.0), self._tally() or S3Read(0, 0.0)
                rest = S3Read(tally.bytes - told.bytes, max(0.0, tally.seconds - told.seconds))
                client.call("POST", f"{path}/early", rest.to_json(), timeout=10.0)
            except Exception as error:  # the daemon reads them itself after EARLY_WAIT
                log.debug("early pieces not handed over: %s", error)
                self._drop.set()

        threading.Thread(target=run, name="early-hand-over", daemon=True).start()

    def _run(
        self, manifest_text: Callable[[], str | None], endpoint_url: str | None, secret: str | None
    ) -> None:
        try:
            text = manifest_text()
            if text is None or self._last is not None:
                return
            manifest = Manifest.loads(text.encode(), secret, origin="the manifest read ahead")
            if not manifest.is_tree and manifest.size >= MIN_EARLY_SIZE:
                self._read(manifest, endpoint_url)
        except Exception as error:  # the daemon reads everything itself
            log.debug("no early read: %s", error)
        finally:
            with self._changed:
                self._done = True
                self._changed.notify_all()

    def _read(self, manifest: Manifest, endpoint_url: str | None) -> None:
        layout = manifest.layout
        most = min(MAX_EARLY_BYTES // layout.piece_size, layout.count // MAX_EARLY_SHARE)
        count = max(1, most)
        first = early_start(layout.count, count)
        pieces = range(first, first + count)
        client = S3Client(endpoint_url, max_attempts=1)
        try:
            self.s3_rtt = s3_round_trip(client)
            if s3_far(self.s3_rtt):
                return
            end = layout.offset(pieces[-1]) + layout.length(pieces[-1])
            with self._lock:
                if self._last is not None:  # the daemon came first
                    return
                self._range, self._next = pieces, first
                self._sent_at = time.monotonic()
            response = client.get_object(
                Bucket=manifest.bucket,
                Key=manifest.key,
                Range=f"bytes={layout.offset(first)}-{end - 1}",
            )
            body: Any = response["Body"]
            try:
                for index in pieces:
                    with self._lock:
                        if self._last is not None and index > self._last:
                            break
                    buffer = bytearray(layout.length(index))
                    view = memoryview(buffer)
                    for at in range(0, len(buffer), PART):
                        if self._drop.is_set():
                            return
                        self._received += len(read_exactly(body, view[at : at + PART]))
                    with self._changed:
                        self._pieces[index] = buffer
                        self._next = index + 1
                        self._changed.notify_all()
            finally:
                self._ended_at = time.monotonic()
                body.close()
        finally:
            client.close()


def early_start(pieces: int, count: int) -> int:
    """Where a read of ``count`` of ``pieces`` pieces begins: at random (nodes starting
    together read different pieces) in the artifact's upper half, where it fits there.
    The coordinator hands out stripes lowest piece first (:mod:`swarm.coordinator.origin`)
    and learns of these pieces only once the daemon holds them: read from anywhere, they
    were also in other nodes' first stripes, and left S3 twice."""
    last = pieces - count  # the last start at which the read fits
    low = min(pieces // 2, last)
    return low + secrets.randbelow(last - low + 1)


def take_read_ahead(artifact: Artifact, request: FetchRequest, client: S3Client) -> None:
    """The daemon's side of a fetch request's ``early``, ``s3_rtt`` and ``s3_read``,
    with the fetch's S3 client (the round trip is its endpoint's). For a new artifact,
    before the reporter sees it: its first report then carries what the GET streamed as
    a sample of S3's rate. Taken in a later report, those bytes came within one report
    interval (an S3 peak of 42 MB/s on 31 MB/s links in the s3-fast fleet), S3 never
    looked as if it fed every link, and that fleet kept to stripes and peers (no ALL:
    5.7-6.5 s; 5.5-5.7 with these taken first)."""
    artifact.client = client
    if request.early:  # read by swarm fetch meanwhile, handed over next
        artifact.expect_early(request.early, EARLY_WAIT)
    if request.s3_rtt is not None:  # measured before that read filled the downlink
        artifact.know_s3_round_trip(request.s3_rtt)
    if request.s3_read is not None:  # S3's rate to this node, as the reader's own
        artifact.took_s3_read(request.s3_read)


def take_piece(artifact: Artifact, index: int, data: bytes) -> bool:
    """The daemon's side of ``PUT /v1/artifacts/IH/pieces/N``: a piece ``swarm fetch``
    read (:class:`EarlyRead`), kept if libtorrent's SHA-1 check passes (counted as
    S3's). True if the artifact holds it now."""
    try:
        if artifact.direct is not None and artifact.direct.have(index):
            return True
        if not artifact.sink.offer(index, data, "s3") or artifact.sink.settle([index]):
            return False
        artifact.early_bytes.add(len(data))
        return True
    finally:
        artifact.early_arrived(index)
