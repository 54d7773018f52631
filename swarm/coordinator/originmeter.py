"""What S3 (the origin) gives one artifact's cohort of fetching nodes, from their reports.

The capacity book (:mod:`swarm.coordinator.capacity`) keeps one :class:`OriginMeter` per
artifact beside the nodes' links. The meter sums the readers' S3 rates of the moment
(:attr:`OriginMeter.window_sum`, O(1) a report), keeps the most the origin has given the
cohort (:attr:`OriginMeter.peak`, :attr:`OriginMeter.together`), and tells when S3 has
slowed under the plan that rested on those (:meth:`OriginMeter.slowed_under_all`,
:meth:`OriginMeter.fell_under_mix`), so that its rates are measured afresh.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from swarm.coordinator.links import Link

ALL_SLOWED: Final = 1 / 3
"""Under ALL (once it has stood :data:`swarm.coordinator.capacity.ALL_PROOF`), S3 has
slowed when the median fetching node gets less than this share of the most S3 ever gave
it over one interval (the S3 peak that made ALL), and the fleet as a whole less than this
share of the most the origin gave it on average (:meth:`OriginMeter.slowed_under_all`):
throttled, or an origin another fleet now shares. ALL is taken back, and the origin's
rates are measured afresh. Without this, a slowing S3 kept ALL for good: under ALL a node
takes nothing from peers, its peaks are maxima, and they went on saying that S3 had
filled every link. Not at a smaller slowdown: s3-fast's nodes get about half their
stripes' rate under ALL (two cores for six nodes and MinIO), and peers would not do
better there. Not on the nodes' shares alone: a node's peak may be from a moment it read
alone, and under ALL every node shares the origin. slow-uploads at a quarter of its rates
(origin 250 Mbit, eight nodes of 100 whose uploads are 5 Mbit) had ALL taken back so, once
or twice a run, while the origin sent all it could; its nodes then waited on stripes and
peers."""

MIX_SLOWED_PROOF: Final = 2.0
"""Under a direct share (MIX), S3 has slowed once the readers of the moment have got
less than :data:`ALL_SLOWED` of the origin's peak for this many seconds
(:meth:`OriginMeter.fell_under_mix`); the origin's rates are then measured afresh, as
under ALL."""

RECENT_SECONDS: Final = 2.0
"""The fleet's S3 rate of the moment (:meth:`OriginMeter.slowed_under_all`) is its
readers' byte counters over at least this many seconds: the counters of whole pieces,
reported one interval apart, make a single interval's sum swing by half (a window of one
report per node summed to 8 MB/s of the 31 the origin sent)."""

ORIGIN_WINDOW: Final = 1.0
"""Nodes whose S3 rates were reported within this many seconds read S3 together (one
report interval)."""


@dataclass
class OriginMeter:
    """One artifact's cohort's S3 rates. A new cohort (the first fetching node since the
    last one finished) starts a new meter."""

    peak: float = 0.0
    """The most S3 gave its readers together (the sum of their rates) this cohort:
    what the origin can give at least. The per-reader rate times the readers of the
    moment falls with the readers, and the plan then saw no S3 capacity because it had
    put the nodes on peers (slow-uploads: stripes alone, 4.5x T*)."""
    rates: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Each node's S3 rate over its last report interval, and when it reported it."""
    together: float = 0.0
    """The most those rates summed to, over the nodes that reported within
    :data:`ORIGIN_WINDOW` of each other, as of any report (see
    :func:`swarm.coordinator.links.fed_every_link`). Taken at snapshots only, it missed
    the stripes: a snapshot comes once every piece has left the origin, by when most
    stripes are done, and s3-fast went MIX."""
    window: deque[tuple[float, str]] = field(default_factory=deque)
    """(when, node) of the S3 rates reported within :data:`ORIGIN_WINDOW` (and older
    ones not yet dropped), oldest first."""
    window_sum: float = 0.0
    """The sum of the rates in :attr:`window` still within it, one per node."""
    s3_bytes: dict[str, int] = field(default_factory=dict)
    """Each node's S3 byte counter as last reported (kept when it completes)."""
    s3_read: int = 0
    """Bytes the readers' S3 counters grew by this cohort, summed report by report (a
    node's first report counts whole; a counter that went away or back to zero
    subtracts nothing): what the origin has given the cohort."""
    cohort_start: float = math.inf
    """When the cohort's first fetch started (the coordinator's clock: a report's arrival
    less the node's ``elapsed``)."""
    read_base: int = 0
    """:attr:`s3_read` when the origin's rates were last measured afresh: the cohort's
    average counts from there."""
    measured_since: float = -math.inf
    """When that was (the average's start, if later than :attr:`cohort_start`)."""
    totals: deque[tuple[float, int]] = field(default_factory=deque)
    """(when, :attr:`s3_read`) at each snapshot, the oldest kept at least
    :data:`RECENT_SECONDS` old: the fleet's S3 rate of the moment."""
    measured_afresh: bool = False
    """S3 slowed this cohort (under ALL, or under a direct share) and the origin's rates
    were measured afresh: the origin is what it gave the fleet since (not the per-reader
    estimate, which remembers the faster S3 for tens of seconds); ALL comes back only if
    S3 fills every link at once again."""

    def note_aggregate(self, aggregate: float) -> None:
        """What S3 gives its readers together now (bytes/s), for the peak (not once the
        origin was measured afresh: the readers' averages remember the faster S3)."""
        if not self.measured_afresh:
            self.peak = max(self.peak, aggregate)

    def note_s3(
        self, node: str, rate: float, now: float, total: int = 0, started: float | None = None
    ) -> None:
        """A node's S3 rate over its last report interval (bytes/s, from its counter),
        its S3 byte counter ``total`` and when its fetch started (``started``, the
        coordinator's clock; None if the node sends no clock). O(1) amortized: the sum of
        the rates within :data:`ORIGIN_WINDOW` is kept as reports come and go."""
        recent = now - ORIGIN_WINDOW
        while self.window and self.window[0][0] < recent:
            at, gone = self.window.popleft()
            entry = self.rates.get(gone)
            if entry is not None and entry[1] == at:  # its latest rate leaves the window
                self.window_sum -= entry[0]
        self._withdraw(node, recent)  # replaced by this report's
        self.rates[node] = (rate, now)
        self.window.append((now, node))
        self.window_sum = max(0.0, self.window_sum + rate)
        self.together = max(self.together, self.window_sum)
        if started is not None:
            self.s3_read += max(0, total - self.s3_bytes.get(node, 0))
            self.s3_bytes[node] = total
            self.cohort_start = min(self.cohort_start, started)

    def at_snapshot(self, now: float) -> None:
        """Before a snapshot: what the cohort has read from S3 since its first fetch
        started raises the peak (the origin gave at least that on average: the s3-fast
        fleet read the whole object from it in a second and a half, while the readers'
        averaged rates put it at 27 MB/s of 187, and the plan went to stripes alone), and
        the counters' total is kept for the rate of the moment."""
        since = max(self.cohort_start, self.measured_since)
        if now > since:
            self.peak = max(self.peak, (self.s3_read - self.read_base) / (now - since))
        self.totals.append((now, self.s3_read))
        while len(self.totals) > 2 and now - self.totals[1][0] >= RECENT_SECONDS:
            self.totals.popleft()

    def forget(self, node: str) -> None:
        """Drop a departed node's rate and counter."""
        if self.window:  # the window as of the last report
            self._withdraw(node, self.window[-1][0] - ORIGIN_WINDOW)
        self.rates.pop(node, None)
        self.s3_bytes.pop(node, None)

    def _withdraw(self, node: str, recent: float) -> None:
        """Take ``node``'s S3 rate out of the window's sum if it was reported since
        ``recent`` (older ones have left it already)."""
        entry = self.rates.get(node)
        if entry is not None and entry[1] >= recent:
            self.window_sum = max(0.0, self.window_sum - entry[0])

    def slowed_under_all(self, links: dict[str, Link], now: float) -> bool:
        """S3 gives the median fetching node, over its last report interval (reported
        within two :data:`ORIGIN_WINDOW`), less than :data:`ALL_SLOWED` of its S3 peak,
        and the fleet, over the last :data:`RECENT_SECONDS`, less than that share of the
        origin's peak average (where the nodes send their byte counters; else the nodes'
        shares decide), and the median node receives less than that share of its
        download peak from every source (where known). Nodes with no recent report are
        left out (every report carries the node's S3 rate)."""
        shares = []
        for node, link in links.items():
            rate, at = self.rates.get(node, (0.0, -math.inf))
            if link.s3 > 0 and now - at <= 2 * ORIGIN_WINDOW:
                shares.append(rate / link.s3)
        if not shares or statistics.median(shares) >= ALL_SLOWED:
            return False
        # Under ALL a node takes nothing from peers: one that still receives most of its
        # link has not begun reading under it (s3-fast at a quarter: ALL allocated, the
        # nodes on their stripes and peers for 1-3 s more, at 5-7 MB/s of 7.7 from peers
        # and 1.5 from S3; ALL was taken back 2.7 s in, and the fleet finished on stripes
        # and peers a second later than under ALL)
        fed = [k.received / k.down for k in links.values() if k.received >= 0 and k.down > 0]
        if fed and statistics.median(fed) >= ALL_SLOWED:
            return False
        (then, before), (_, latest) = self.totals[0], self.totals[-1]
        if now - then < RECENT_SECONDS or self.peak <= 0 or latest <= 0:
            return True  # no counters (or not for long enough): the shares decide
        return (latest - before) / (now - then) < ALL_SLOWED * self.peak

    def fell_under_mix(self, downs: Iterable[float], now: float) -> bool:
        """The nodes reading S3 now (a rate over their readers' busy seconds, reported
        within two :data:`ORIGIN_WINDOW`) get together less than :data:`ALL_SLOWED` of
        what the origin gave at its peak, or of what their links could take if that is
        less (a few readers cannot take a large origin's rate; ``downs``: the fetching
        nodes' download peaks). The allocation planned each node's direct share on that
        peak: after the mixed fleet's origin (a quarter of its rates) fell to an eighth,
        the peak kept a tenth of every node's bytes on S3 to the end, and the origin read
        78 MiB where nobody held 55, the rest pieces peers held. (Judged on the median S3
        rate the plans take, that of the readers' download rates, it told 7 s after the
        throttle in one run of the bench's s3-slows at a quarter.)"""
        rates = [
            rate for rate, at in self.rates.values() if rate > 0 and now - at <= 2 * ORIGIN_WINDOW
        ]
        if not rates or self.peak <= 0:
            return False
        known = [down for down in downs if down > 0]
        readers = len(rates)
        room = min(self.peak, readers * statistics.median(known)) if known else self.peak
        return statistics.median(rates) * readers < ALL_SLOWED * room

    def measure_afresh(self, now: float) -> None:
        """Forget what the origin gave before (its peak, the most its readers took
        together, the cohort's average): the next snapshot plans on the rates from now
        on, and ALL needs S3 to fill every link at once again."""
        self.peak, self.together = 0.0, self.window_sum
        self.read_base = self.s3_read
        self.measured_since = now
        self.measured_afresh = True
