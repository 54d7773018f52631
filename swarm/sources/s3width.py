"""How many ranged GETs a node keeps in flight: as few as fill what the node can take.

Each GET is a TCP flow, and flows that share the node's downlink each get a share of it.
Every extra flow costs: the sender paces a flow at its rate and cuts its segments to
about a millisecond of it (TSO autosizing), so the more flows share a link, the smaller
the packets and the more of them the node's kernel handles for the same bytes. In the
s3-fast fleet (six nodes of 250 Mbit on two cores) eight GETs per node carried 6-19 KB
per packet against aria2c's ~40 KB, with five times its softirq work (perf); two GETs
cut a node's CPU per GiB by a fifth, and the coordinated fleet finished in 6.05-6.18 s
against 6.77-6.95 with eight.

A flow can also be limited by itself rather than by the link: AWS S3 gives one
connection ~90 MB/s, and across a 100 ms / 0.5% loss WAN one TCP flow carries a few
hundred KB/s. So the width starts at :data:`START_WIDTH` and doubles while doubling
raised what the node received (every source together: flows that only take the link
from peers add nothing) by :data:`GROWTH`; else it goes back and stays there for
:data:`REPROBE_SECONDS`, then tries again (the node's peers or its plan may have changed).

Known limit: where the fleet shares an origin that serves flow by flow (a throttled
bucket, a slow uplink), a doubling pays for the node by taking the origin from the
others, and those that doubled later get less meanwhile. Starting at the cap and halving
instead (which never takes from others) was tried: slow-uploads at a quarter of its
rates, two pairs, 38.35-39.47 s against 39.87-40.35; s3-fast 6.39-7.05 s against
6.02-6.28, the first second at eight flows. Kept: growing from :data:`START_WIDTH`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

START_WIDTH: Final = 1
"""GETs in flight before anything is measured. One, not two, as measured below; the likely
reason, not traced: where the fleet shares the origin, two GETs of 4 MiB ranges each run
at half the node's share and end their first pieces together, twice as late as one GET
ends its first, and a node relays only whole pieces. Alternating pairs (toggled within
one build, ``bench/fleet.py --systems swarm --scenario S``): mixed at a quarter of its
rates, six pairs, 34.87-35.62 s (mean 35.14) against 35.46-37.20 (36.22), faster in six;
slow uploads at a quarter 36.91, 35.93 against 37.37, 36.01; s3-fast at a quarter 19.10,
19.17 against 19.45, 19.73; swarm-bound at a quarter 24.95, 26.17 against 25.90, 25.78;
origin-bound at a quarter 50.32, 48.36 against 48.72, 48.82; existing seeders at a
quarter 29.60, 34.71 against 29.26, 28.08 (its last node's spread: medians 25.75, 26.49
against 26.61, 26.22); at full rates s3-fast 5.67, 5.61, 5.61 against 5.58, 5.67, 5.76
(peers' blocks for nothing 31-36 MB a run against 44-47), mixed 10.11, 10.24, 11.07
against 10.64, 10.37, 10.42, swarm-bound 7.37, 7.60 against 7.52, 7.62, slow uploads
10.41, 10.46 against 10.83, 10.22."""

GROWTH: Final = 1.25
"""Doubling the width stays only if the node then received at least this multiple of
what it received at the narrower width."""

WINDOW_SECONDS: Final = 0.5
"""A width is measured over at least this many seconds with every one of its GETs in
flight (the tail of a batch, with fewer, does not count)..."""

WINDOW_PIECES: Final = 8
"""...and over at least this many pieces received (one piece is then at most an eighth of
the measure)."""

WARMUP_SECONDS: Final = 0.2
"""The first seconds at a new width are not measured: its new connections are in slow
start."""

GAP_SECONDS: Final = 0.1
"""Fewer GETs than the width in flight for longer than this ends the measure (a batch's
tail, or the reader between batches); a shorter gap is a thread between two GETs."""

REPROBE_SECONDS: Final = 10.0
"""Seconds a settled width stands before doubling is tried again."""


class GetWidth:
    """The number of GETs allowed in flight, for the S3 reads of one artifact.

    ``received``: pieces the node holds (from any source); it is read when a measure
    starts and, once it has lasted :data:`WINDOW_SECONDS`, as bytes come in until
    :data:`WINDOW_PIECES` more are held (a direct sink's count is a set union). The
    readers call :meth:`acquire` before a GET, :meth:`release` after it and :meth:`tick`
    as its bytes come in."""

    def __init__(
        self,
        received: Callable[[], int],
        cap: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cap = max(1, cap)
        self.width = min(START_WIDTH, self.cap)
        self._received = received
        self._clock = clock
        self._cond = threading.Condition()
        self._active = 0
        self._tickets = 0
        self._waiting: deque[int] = deque()
        """Tickets of the callers waiting for a slot, in the order they came."""
        self._full_since: float | None = None
        """Since when every one of the width's GETs has been in flight."""
        self._gap_since: float | None = None
        """Since when fewer have been (None: not now)."""
        self._window: tuple[float, int] | None = None
        """(start, pieces held then) of the measure under way."""
        self._narrower: tuple[int, float] | None = None
        """(width, pieces/s) measured before the last doubling."""
        self._settled_at: float | None = None

    def acquire(self, give_up: Callable[[], bool]) -> bool:
        """Wait for a slot, in the order of the calls (a reader's ranges are submitted in
        the file's order, and the whole-file hash follows its prefix); False (no slot
        taken) once ``give_up()`` says so."""
        with self._cond:
            ticket = self._tickets
            self._tickets += 1
            self._waiting.append(ticket)
            try:
                while self._active >= self.width or self._waiting[0] != ticket:
                    if give_up():
                        return False
                    self._cond.wait(0.1)
            finally:
                self._waiting.remove(ticket)
                self._cond.notify_all()
            self._active += 1
            self._look()
            return True

    def release(self) -> None:
        with self._cond:
            self._active -= 1
            self._look()
            self._cond.notify_all()

    def tick(self) -> None:
        """Some of a GET's bytes came in: end the measure if it is long enough."""
        with self._cond:
            self._look()

    def _look(self) -> None:
        now = self._clock()
        if self._active < self.width:
            if self._gap_since is None:
                self._gap_since = now
            return  # nothing is measured until every GET is in flight again
        gap, self._gap_since = self._gap_since, None
        if gap is not None and now - gap > GAP_SECONDS:  # a batch's tail, or between batches
            self._full_since = self._window = None
        if self._settled_at is not None:
            if now - self._settled_at < REPROBE_SECONDS:
                return
            self._settled_at = None
        if self._full_since is None:
            self._full_since = now
        if self._window is None:
            if now - self._full_since >= WARMUP_SECONDS:
                self._window = (now, self._received())
            return
        start, before = self._window
        if now - start < WINDOW_SECONDS:  # (before asking: a tick comes per 256 KiB read)
            return
        held = self._received()
        if held - before < WINDOW_PIECES:
            return
        self._decide((held - before) / (now - start), now)

    def _decide(self, rate: float, now: float) -> None:
        narrower = self._narrower
        if narrower is None or rate >= GROWTH * narrower[1]:
            if self.width < self.cap:  # measured (or doubling paid): try twice as many
                log.info("s3: %d GETs in flight: %.1f pieces/s; trying %d", self.width, rate,
                         min(self.cap, 2 * self.width))  # fmt: skip
                self._narrower = (self.width, rate)
                self._change(min(self.cap, 2 * self.width))
                return
        else:  # doubling did not pay: back to the narrower width
            log.info("s3: %d GETs in flight: %.1f pieces/s, against %.1f with %d: back to %d",
                     self.width, rate, narrower[1], narrower[0], narrower[0])  # fmt: skip
            self._change(narrower[0])
        self._narrower = None
        self._settled_at = now

    def _change(self, width: int) -> None:
        self.width = width
        self._full_since = self._window = self._gap_since = None
        self._cond.notify_all()
