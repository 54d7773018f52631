"""Pieces from S3 by parallel ranged GETs.

Shape (after s3transfer): a pure range planner (:func:`swarm.pieces.plan_ranges`), a
bounded pool of requests, one sink written at offsets, a named tuple of retryable errors,
capped jittered backoff, and a cancellation check per piece.

Two layers of retry: the client (:class:`swarm.s3http.S3Client`) retries a request that
fails before its body starts (503 SlowDown, 500, connection refused/reset). A failure
while streaming the body, or a piece whose hash does not match, is retried here, for the
pieces of that range still missing.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from swarm.errors import IntegrityError, SwarmError
from swarm.manifest import Manifest
from swarm.pieces import DEFAULT_RANGE_SIZE, ByteRange, PieceLayout, plan_ranges
from swarm.s3http import (
    RETRYABLE_STATUS,
    S3Error,
    S3ResponseError,
    S3Url,
    backoff_delay,
    raise_for,
)
from swarm.sources import Cancelled, PieceSink
from swarm.sources.s3width import GetWidth

log = logging.getLogger(__name__)

SOURCE = "s3"

DEFAULT_CONCURRENCY = 8
"""Ranged GETs in flight. 8 x 16 MiB saturates a 10 Gbit link in AWS's own guidance
(one request tops out at ~100 MB/s); more only adds memory here."""

RECV_LOWAT = 256 << 10
"""Bytes a body read waits for before it wakes (``SO_RCVLOWAT``). Without it, each of the
eight reading threads woke per few packets (more often the slower the link), took the
GIL and went back to sleep: on 250 Mbit links, at a quarter of that rate, the readers
of one node spent 2-2.7 CPU-s per 128 MiB, against ~0.4 CPU-s at full rate on loopback."""

OVERTAKEN_CHECK = 256 << 10
"""A piece is read this many bytes at a time, and given up between two when another
source brought it meanwhile: across a WAN one GET reads a 1 MiB piece in seconds."""

MAX_RANGE_ATTEMPTS = 6
"""Tries per range (a range that made progress resets to its missing pieces)."""

RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (
    http.client.HTTPException,  # e.g. IncompleteRead: the body ended early
    ConnectionError,  # also the client's S3ConnectionError
    TimeoutError,
    ssl.SSLError,
)
"""Failures worth another try of the same range; anything else is final."""


def _http_response(body: Any) -> http.client.HTTPResponse | None:
    """The ``http.client`` response of a :class:`swarm.s3http.Body` (or the body itself,
    if it is one), or None when the body is something else (a test double, a directory
    artifact's spanning body)."""
    if isinstance(body, http.client.HTTPResponse):
        return body
    response = getattr(body, "response", None)
    return response if isinstance(response, http.client.HTTPResponse) else None


def _body_socket(body: Any) -> socket.socket | None:
    """The TCP socket under a body, or None."""
    response = _http_response(body)
    sock = getattr(getattr(response and response.fp, "raw", None), "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


READ_BUFFER_SLACK = 32 << 10
"""Body bytes that may have left the kernel's queue without reaching the reader: over
HTTPS, OpenSSL holds a partly received TLS record (up to 16 KiB and its overhead). A
read leaves at least this much more than its mark still to come. (``http.client``'s own
read buffer does not count: ``readinto`` hands out what it holds before it receives.)"""


def set_lowat(sock: socket.socket | None, nbytes: int) -> None:
    """``SO_RCVLOWAT``: a read (and the poll before it) waits for ``nbytes`` queued."""
    if sock is not None:
        with contextlib.suppress(OSError):  # closed meanwhile: the read reports it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, max(1, nbytes))


class LowWater:
    """A body socket's low-water mark (:data:`RECV_LOWAT`), and how much one read may
    ask for under it.

    Python polls a socket with a timeout before each receive, and the poll waits for the
    mark itself; the buffered reader under ``http.client`` receives until it has all it
    was asked for. A mark above what is still to come stalls the read until the timeout,
    so each read must leave at least the mark to come after it. Far from the body's end
    a read asks for all it wants at :data:`RECV_LOWAT`; near it, for half of what is
    left (the mark the other half); the last ``2 * READ_BUFFER_SLACK`` bytes at mark 1.
    (The mark was 1 for a body's whole last piece: a read woke per few packets there,
    with 4 MiB GETs for a quarter of the bytes; in the s3-fast fleet 4 MiB GETs then cost
    a node ~0.5 CPU-s more per 128 MiB than 16 MiB ones, ~0.25 after this.) Reset to 1
    before the connection is reused: the next response's headers, or a short error body,
    would wait otherwise."""

    def __init__(self, sock: socket.socket | None) -> None:
        self.sock = sock
        self.mark = 0

    def next_read(self, body_left: int, wanted: int) -> int:
        """Set the mark for a read of up to ``wanted`` bytes with ``body_left`` bytes of
        the body unread; returns how many to ask for."""
        ask, mark = wanted, RECV_LOWAT
        if body_left - wanted - READ_BUFFER_SLACK < RECV_LOWAT:  # near the end
            if body_left <= 2 * READ_BUFFER_SLACK:
                mark = 1
            else:
                ask = min(wanted, (body_left - READ_BUFFER_SLACK) // 2)
                mark = min(RECV_LOWAT, body_left - READ_BUFFER_SLACK - ask)
        if mark != self.mark:
            set_lowat(self.sock, mark)
            self.mark = mark
        return ask

    def reset(self) -> None:
        set_lowat(self.sock, 1)
        self.mark = 1


def read_exactly(body: Any, view: memoryview, water: LowWater | None = None) -> memoryview:
    """Fill ``view`` with the next ``len(view)`` bytes of ``body``; IncompleteReadError if
    the body ends first.

    Through the ``http.client`` response under the body: its ``readinto`` moves the bytes
    from the socket straight into our buffer (botocore's ``StreamingBody.read(n)`` went
    through urllib3, which copied every chunk two or three times: at hundreds of MB/s a
    good part of a core). Anything else (a test double, a directory artifact's spanning
    body) is read with ``read``. ``water``'s mark
    follows what the response says is left (``length``), so an object shorter than its
    range ends in ``IncompleteRead`` at once, not after a read timeout per try."""
    length = len(view)
    response = _http_response(body)
    got = 0
    while got < length:
        ask = length - got
        if response is not None:
            if water is not None and response.length is not None:
                ask = water.next_read(response.length, ask)
            n = response.readinto(view[got : got + ask])
        else:
            chunk = body.read(ask)
            n = len(chunk)
            view[got : got + n] = chunk
        if not n:  # EOF: truncated
            raise http.client.IncompleteRead(b"", length - got)
        got += n
    return view


@dataclass
class S3SourceConfig:
    """Tuning of the S3 source.

    Attributes:
        concurrency: ranged GETs in flight (>= 1).
        range_size: bytes per GET, rounded down to whole pieces (>= one piece).
    """

    concurrency: int = DEFAULT_CONCURRENCY
    range_size: int = DEFAULT_RANGE_SIZE

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.range_size < 1:
            raise ValueError(f"range_size must be >= 1, got {self.range_size}")


class S3Source:
    """Fetch given pieces of one artifact from its S3 object into a sink."""

    def __init__(
        self,
        client: Any,
        manifest: Manifest,
        sink: PieceSink,
        cancel: threading.Event,
        config: S3SourceConfig | None = None,
        rng: random.Random | None = None,
        on_retry: Callable[[str | None], None] | None = None,
        width: GetWidth | None = None,
        streamed: Callable[[int], object] | None = None,
        reading: Callable[[list[int], bool], object] | None = None,
        overtaken: Callable[[int], object] | None = None,
    ) -> None:
        self.client = client
        self.url = S3Url(manifest.bucket, manifest.key)
        self.layout: PieceLayout = manifest.layout
        self.tree = (
            (manifest.tree_layout, [manifest.key + e.path for e in manifest.files])
            if manifest.files is not None
            else None
        )
        """A directory artifact: its layout and each file's key (a logical range is
        one GET per file it touches)."""
        self.sink = sink
        self.cancel = cancel
        self.config = config or S3SourceConfig()
        self.rng = rng or random.Random()
        self.retries = 0
        self.on_retry = on_retry
        """Told each retry's reason as it happens (None once a range succeeds again)."""
        self.width = width
        """How many of the ``concurrency`` GETs may be in flight at once (None: all)."""
        self.streamed = streamed
        """Told the size of each part of a piece as it is read (a byte counter)."""
        self.reading = reading
        """Told the pieces a GET is about to read (``True``) and, once it is over, the
        same pieces (``False``), the sink's own excepted."""
        self.overtaken = overtaken
        """Told the bytes read in vain (a byte counter): of a piece another source
        brought while this one read it, whether the read was given up or finished."""

    def fetch(self, pieces: Iterable[int], stop: Callable[[], bool] | None = None) -> None:
        """Fetch ``pieces`` (those the sink still misses); return when all are stored, or,
        once ``stop()`` says so, when each GET in flight has finished its current piece
        (the rest are left missing: the caller chose to read them otherwise)."""
        ranges = plan_ranges(self.layout, pieces, self.config.range_size)
        if not ranges:
            return
        # A failed range stops its siblings of this call only: ``self.cancel`` belongs to
        # the caller (in the daemon, the artifact), and setting it would stop every other
        # source of the artifact for good.
        halt = threading.Event()
        with ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="s3-get") as pool:
            futures = [pool.submit(self._fetch_range, r, halt, stop) for r in ranges]
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception()]
            if failed:
                halt.set()
                for future in futures:
                    future.cancel()
                errors = [f.exception() for f in failed]
                # The most telling error first: a final one (403, 404) over a Cancelled.
                errors.sort(key=lambda e: isinstance(e, Cancelled))
                raise errors[0]  # type: ignore[misc]

    def _stopped(self, halt: threading.Event) -> None:
        if self.cancel.is_set() or halt.is_set():
            raise Cancelled

    def _sleep(self, seconds: float, halt: threading.Event) -> None:
        """Back off for ``seconds``, waking within a quarter second of either stop."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if halt.wait(min(left, 0.25)) or self.cancel.is_set():
                raise Cancelled
        self._stopped(halt)

    def _fetch_range(
        self, byte_range: ByteRange, halt: threading.Event, stop: Callable[[], bool] | None
    ) -> None:
        attempt = 0
        while True:
            self._stopped(halt)
            if stop is not None and stop():
                return
            wanted = [i for i in byte_range.pieces if not self.sink.have(i)]
            if not wanted:
                return
            current = plan_ranges(self.layout, wanted, self.config.range_size)
            try:
                bad = sum(self._get(r, halt, stop) for r in current)
                if not bad:
                    if attempt and self.on_retry:
                        self.on_retry(None)
                    continue  # loop once more to confirm nothing is missing
                reason = f"{bad} piece(s) failed their hash"
            except RETRYABLE_ERRORS as error:
                reason = f"{type(error).__name__}: {error}"
            except S3ResponseError as error:
                if error.status not in RETRYABLE_STATUS:
                    raise_for(error, self.url)
                reason = f"HTTP {error.status} {error.code}"
            except S3Error as error:  # e.g. no credentials: final
                raise_for(error, self.url)
            attempt += 1
            self.retries += 1
            if self.on_retry:
                self.on_retry(reason)
            if attempt >= MAX_RANGE_ATTEMPTS:
                if reason.endswith("hash"):
                    raise IntegrityError(
                        f"swarm: {self.url} {byte_range.header}: pieces still fail their "
                        f"SHA-1 after {attempt} tries: the object differs from its manifest; "
                        "republish it"
                    )
                raise SwarmError(f"swarm: {self.url} {byte_range.header} failed: {reason}")
            delay = backoff_delay(attempt, self.rng)
            log.warning(
                "s3 retry %d/%d for %s %s in %.2fs: %s",
                attempt,
                MAX_RANGE_ATTEMPTS,
                self.url,
                byte_range.header,
                delay,
                reason,
            )
            self._sleep(delay, halt)

    def _get(
        self, byte_range: ByteRange, halt: threading.Event, stop: Callable[[], bool] | None = None
    ) -> int:
        """One ranged GET; offer each piece as it completes, and stop at the first the sink
        holds already (checked as each piece comes in), or at the next piece once
        ``stop()`` says so. Returns the count of bad pieces.

        Every piece of the range is read into one buffer: ``offer`` gets a view that is
        valid only during the call (a sink copies what it keeps; ``PieceFile`` writes it
        out before returning). A fresh 1 MiB bytearray per piece was the largest holder
        of the GIL in a profile: it is zero-filled, page-faulted, with the GIL held.
        """
        width = self.width
        if width is not None:

            def give_up() -> bool:
                return self.cancel.is_set() or halt.is_set() or (stop is not None and stop())

            if not width.acquire(give_up):
                self._stopped(halt)
                return 0  # stop() said so: the caller reads the rest otherwise
        reading = self.reading
        pieces: list[int] = []
        if reading is not None:
            pieces = [i for i in byte_range.pieces if not self.sink.have(i)]
            reading(pieces, True)
        try:
            bad = self._get_body(byte_range, halt, stop)
        finally:
            if reading is not None:
                reading(pieces, False)
            if width is not None:
                width.release()
        settle = getattr(self.sink, "settle", None)
        if settle is not None:  # a sink that checks pieces after offer returned
            bad += settle(byte_range.pieces)
        return bad

    def _get_body(
        self, byte_range: ByteRange, halt: threading.Event, stop: Callable[[], bool] | None
    ) -> int:
        """The GET of :meth:`_get` and the reading of its body; the count of pieces the
        sink refused at once."""
        if self.tree is not None:
            layout, keys = self.tree
            body: Any = SpanningBody(
                self.client,
                self.url.bucket,
                [
                    (keys[s.file], s.offset, s.length)
                    for s in layout.spans(byte_range.start, byte_range.end)
                ],
            )
        else:
            response = self.client.get_object(
                Bucket=self.url.bucket, Key=self.url.key, Range=byte_range.header
            )
            body = response["Body"]
        bad = 0
        buffer = memoryview(bytearray(self.layout.piece_size))
        water = LowWater(_body_socket(body))
        try:
            for index in byte_range.pieces:
                self._stopped(halt)
                if stop is not None and stop():
                    break  # the caller reads the rest otherwise (the body is dropped)
                length = self.layout.length(index)
                data = buffer[:length]
                if not self._read_piece(body, data, index, water):
                    # Another source brought it while this GET ran: the body's rest is
                    # dropped (the connection with it) and the caller asks again for what
                    # is still missing. Read to the end, a far node's slow GETs carried
                    # 74 MB the fleet already had for 16 MB it used.
                    break
                if self.overtaken is not None and self.sink.have(index):
                    self.overtaken(length)  # brought as it was read: counted, offered anyway
                if not self.sink.offer(index, data, SOURCE):
                    bad += 1
                    log.warning("s3 piece %d of %s failed its SHA-1; will refetch", index, self.url)
        finally:
            water.reset()
            body.close()  # the connection back to the pool if the body was read to its end
        return bad

    def _read_piece(self, body: Any, view: memoryview, index: int, water: LowWater) -> bool:
        """Fill ``view`` with piece ``index`` from ``body``, :data:`OVERTAKEN_CHECK` bytes
        at a time; False as soon as the sink holds the piece (nothing more is read)."""
        for start in range(0, len(view), OVERTAKEN_CHECK):
            if self.sink.have(index):
                if start and self.overtaken is not None:
                    self.overtaken(start)  # the part read in vain
                return False
            part = read_exactly(body, view[start : start + OVERTAKEN_CHECK], water)
            if self.streamed is not None:
                self.streamed(len(part))
            if self.width is not None:
                self.width.tick()
        return True


class SpanningBody:
    """One logical range of a directory artifact read as consecutive ranged GETs, one per
    file it touches (empty files touch none: no GET), behind a ``read``/``close`` body.

    Each GET starts when the previous file's part is read, so only one response is open
    at a time; a part that ends early is an ``IncompleteReadError`` (retried like any
    truncated body)."""

    def __init__(self, client: Any, bucket: str, parts: list[tuple[str, int, int]]) -> None:
        self.client = client
        self.bucket = bucket
        self.parts = parts
        self._index = -1
        self._body: Any = None
        self._left = 0

    def read(self, size: int) -> bytes:
        while self._left == 0:
            self._next()
            if self._body is None:
                return b""
        chunk: bytes = self._body.read(min(size, self._left))
        if not chunk:
            raise http.client.IncompleteRead(b"", self._left)
        self._left -= len(chunk)
        return chunk

    def _next(self) -> None:
        self.close()
        self._index += 1
        if self._index >= len(self.parts):
            return
        key, offset, length = self.parts[self._index]
        response = self.client.get_object(
            Bucket=self.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}"
        )
        self._body, self._left = response["Body"], length

    def close(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None
