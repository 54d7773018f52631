"""Pieces a plan's batch keeps from peers, given back once S3 falls behind the plan.

A planned batch kept from peers as a whole (:func:`swarm.batch.kept_from_peers`: a
direct share, ALL, a fill) waits on S3 alone, and was planned on the S3 rate the
coordinator measured (``OriginPlan.s3_estimate``). When S3 then gives much less (the
origin throttled, shared with another fleet, or failing and retried), those pieces wait
on it however fast peers could bring them: a direct share may hold 32 MiB. In a lab
fleet whose origin fell to a seventh of what the plans assumed, every piece a node
lacked was held so, no peer (seeders included) had anything the node would take, the
seeders choked the new nodes, and the fleet took 5.6-7.2x T*.

:class:`BehindWatch` measures the batch's S3 bytes over a sliding window and, once they
fall below :data:`BEHIND_SHARE` of the plan's rate, tells the reader
(:func:`swarm.agent.origin.read_origin`), which gives the held pieces back to peers (the
batch's GETs go on; a peer that brings a piece first cuts its GET short), holds no
later batch as a whole, and lets a WIDE batch stop once the plan narrows.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

BEHIND_SHARE = 1 / 3
"""S3 has fallen behind the plan when a batch gets less than this share of the plan's
S3 rate over :data:`WINDOW` seconds (as :data:`swarm.coordinator.originmeter.ALL_SLOWED`
judges a slowed S3 under ALL: at a smaller shortfall, a downlink S3 shares with peers
would release batches that were on time)."""

WINDOW = 2.0
"""Seconds of S3 bytes the shortfall is judged on: a GET's first byte and TCP's ramp
take part of the first second, and whole pieces arrive in bursts."""

CHECK_PERIOD = 0.25
"""Seconds between two looks at the byte counter."""


def behind(samples: deque[tuple[float, int]], expected_rate: float, now: float) -> bool:
    """Whether the bytes of ``samples`` ((time, total streamed), oldest first) over the
    last :data:`WINDOW` seconds fall short of :data:`BEHIND_SHARE` of ``expected_rate``
    (bytes/s). False until the samples span a window. Drops the samples older than the
    newest one a window old (the watch's deque stays a window long)."""
    if not samples or expected_rate <= 0 or now - samples[0][0] < WINDOW:
        return False
    while len(samples) > 1 and now - samples[1][0] >= WINDOW:
        samples.popleft()  # the oldest sample still at least a window old stays
    then, before = samples[0]
    latest = samples[-1][1]
    return (latest - before) / (now - then) < BEHIND_SHARE * expected_rate


class BehindWatch:
    """While a batch runs (``with BehindWatch(...)``), samples ``streamed()`` (the
    artifact's S3 byte counter) and calls ``on_behind()`` once, from its own thread,
    when the batch falls behind ``expected_rate`` (see :func:`behind`); nothing without
    an expected rate."""

    def __init__(
        self,
        streamed: Callable[[], int],
        expected_rate: float,
        on_behind: Callable[[], object],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._streamed = streamed
        self._expected = expected_rate
        self._on_behind = on_behind
        self._clock = clock
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="behind-watch", daemon=True)

    def __enter__(self) -> BehindWatch:
        if self._expected > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        samples: deque[tuple[float, int]] = deque([(self._clock(), self._streamed())])
        while not self._done.wait(CHECK_PERIOD):
            now = self._clock()
            samples.append((now, self._streamed()))
            if behind(samples, self._expected, now):
                self._on_behind()
                return
