"""Rate control: the sender's rate rule and its pacer. Pure: time is passed in.

Rate rule (:func:`adapt_rate`): the receiver reports, every ``REPORT_INTERVAL``, how many
datagrams the sender's ``seq`` says were sent in the interval and how many arrived; above
2% loss (of at least :data:`MIN_LOST` datagrams) the sender cuts its rate to the
delivered rate, below 0.5% it speeds up by 4% per interval (doubling once per feedback
loop until the first cut), in between it holds; never above min(client's ask, server's
cap). Random loss below 2% (a lossy WAN path) therefore never
slows the sender: only a queue overflowing does, which is what a rate-based blast wants.

The feedback loop (:class:`RateFeedback`) feeds the rule: it pools reports into samples and
lets one cut and one slow-start doubling happen per round trip.

The pacer (:class:`Pacer`) is a token bucket in bytes: it says how many bytes may go now,
and when the next batch of datagrams may go.
"""

from __future__ import annotations

from typing import Final

LOSS_HIGH: Final = 0.02
LOSS_LOW: Final = 0.005
RATE_INCREASE: Final = 1.04
MAX_DECREASE: Final = 0.25
MIN_RATE_BPS: Final = 1_000_000
MIN_LOSS_SAMPLE: Final = 8
MIN_LOST: Final = 3
"""Datagrams a sample must have lost for its loss to count. At a few Mbit/s a report
holds a few dozen datagrams, and one lost at random on a lossy path (0.5%) read as 3%:
the rate was cut and slow start ended. far-region's second sessions, asking 60-74
Mbit/s of seeders whose uplinks were by then nearly idle, sent at 8-26 Mbit/s and
brought the region's last pieces at 1-2 MB/s. A queue that overflows loses datagrams
in bursts, not one or two."""
START_FRACTION: Final = 0.125
"""The first rate is this fraction of the target, then doubles per clean report until the
first cut. Tsunami starts at the target; starting lower keeps a blast far above the
bottleneck from filling its queue (and every other flow's) before the first report."""
START_WINDOW_BYTES: Final = 400_000
"""Nor above this many bytes per round trip of the path (32 Mbit/s at 100 ms), like TCP's
initial window: a session that asks for a 1 Gbit/s NIC (the first from a holder: nothing
measured yet) would start at 125 Mbit/s. Four such sessions into a seeder's 50 Mbit/s
uplink 100 ms away (far-region at a quarter of its rates) lost 60-90% of their
datagrams, cut and cut again while the others' overshoot still filled the queue, and
ended at 2-7 Mbit/s, below TCP's rate. A window, not a rate: on a short path the
feedback comes soon, and a 32 Mbit/s start cost loopback a fifth of its goodput (0.45x
TCP against 0.62-0.91x) in slow start."""
BURST_SECONDS: Final = 0.02
"""Token-bucket depth of the pacer in seconds at the current rate (at least 2 datagrams).
An event loop wakes every ~1 ms at best; on a busy host a wake can be 10 ms late, and the
tokens a too-shallow bucket drops are rate never sent: on the shared 2-core lab machine
(bench/udp.py, 0 ms, 500 Mbit) the emulated link idled 21% of the transfer with a 4 ms
bucket, 7% with 20 ms. A burst is at most 20 ms of the rate, which a WAN bottleneck's
buffer (tens of ms) absorbs."""


CAPPED_START_FRACTION: Final = 0.5
"""The first rate's fraction of a target that is the server's share of its own budget
(its measured uplink divided among its sending sessions) rather than what the client
asked: that share fits the uplink, so starting at an eighth of it only costs round
trips. far-region's seeders split 184 Mbit/s among four far sessions: from an eighth,
doubling once per round trip, a session needs three (0.1-0.2 s each) to reach its 46;
from half, the far downlinks were full 0.6 s after the first datagram (0.9 before, port
counters every 0.1 s, one run each), and eight alternating pairs ran
8.12 s mean (median 8.09) against 8.22 (8.24). Still at most :data:`START_WINDOW_BYTES`
per round trip: a server that has measured no link yet shares its default budget (1
Gbit/s) the same way, and on a far path (UDP serves only those) the window is the bound
that holds then (32 Mbit/s at 100 ms, 160 at 20)."""


def start_rate(target: float, path_rtt: float | None = None, capped: bool = False) -> float:
    """A session's first rate (bit/s): :data:`START_FRACTION` of its target
    (:data:`CAPPED_START_FRACTION` if the target is the server's budget share,
    ``capped``), at most :data:`START_WINDOW_BYTES` per ``path_rtt`` (seconds; None:
    unknown, no such bound), at least :data:`MIN_RATE_BPS`."""
    rate = target * (CAPPED_START_FRACTION if capped else START_FRACTION)
    if path_rtt is not None and path_rtt > 0:
        rate = min(rate, START_WINDOW_BYTES * 8 / path_rtt)
    return max(float(MIN_RATE_BPS), rate)


def adapt_rate(
    rate: float,
    target: float,
    expected: int,
    received: int,
    intervals: int = 1,
    slow_start: bool = False,
) -> tuple[float, bool]:
    """One control step of the sender's rate from one receiver REPORT.

    ``loss = (expected - received) / expected`` over the report's interval (``expected``
    counts the sender's datagrams by ``seq``, so retransmissions count and reordering
    across an interval boundary only adds noise, clamped to 0..1).

    - fewer than :data:`MIN_LOSS_SAMPLE` datagrams expected: no change (one datagram more
      or less would swing the estimate by more than the thresholds);
    - fewer than :data:`MIN_LOST` datagrams lost: no loss (random loss, not a queue);
    - ``loss > LOSS_HIGH`` (2%): ``rate *= max(MAX_DECREASE, 1 - loss)``: the new rate is
      the rate that was *delivered*, the bottleneck's share, like Tsunami's back-off on a
      high error rate but in one step instead of many small ones; never below a quarter,
      since a burst of loss (a queue overflowing once) overstates the steady loss;
    - ``loss <= LOSS_LOW`` (0.5%): ``rate *= RATE_INCREASE ** intervals`` (4% per 50 ms
      report interval the sample spans), up to ``target``: probing for spare capacity
      multiplicatively, as Tsunami speeds up; during ``slow_start`` (until the first
      cut, from :data:`START_FRACTION` of the target) the rate doubles per interval instead,
      like TCP's slow start (RFC 5681);
    - in between: hold. The sender then runs a few percent above the bottleneck, which costs
      a few percent of its packets but keeps the link full (a dropped datagram never used
      the link, so goodput stays at the link rate).

    The caller applies at most one decrease per feedback loop: after a cut it ignores
    reports until they describe datagrams sent after it; likewise at most one slow-start
    doubling (a report every 50 ms on a 100+ ms path would double the rate several times
    before any loss came back). The result is clamped to
    ``MIN_RATE_BPS..target``.

    Returns:
        ``(new rate, decreased)``.
    """
    if expected < MIN_LOSS_SAMPLE:
        return min(rate, target), False
    lost = max(0, expected - received)
    loss = min(1.0, lost / expected) if lost >= MIN_LOST else 0.0
    if loss > LOSS_HIGH:
        new = max(MIN_RATE_BPS, rate * max(MAX_DECREASE, 1.0 - loss))
        return min(new, target), True
    if loss <= LOSS_LOW:
        factor = (2.0 if slow_start else RATE_INCREASE) ** max(1, intervals)
        return max(MIN_RATE_BPS, min(target, rate * factor)), False
    return min(rate, target), False


class RateFeedback:
    """The sender's side of the feedback loop: REPORTs pooled into samples for
    :func:`adapt_rate`, at most one cut and one slow-start doubling per loop."""

    def __init__(self) -> None:
        self.slow_start = True
        self.cut_seq = 0
        self.grow_seq = 0
        """First datagram after slow start's last doubling (the next one waits for a
        report about it)."""
        self.expected = 0
        self.received = 0
        self.pooled = 0

    def on_report(
        self,
        rate: float,
        target: float,
        seq_high: int,
        expected: int,
        received: int,
        next_seq: int,
    ) -> float | None:
        """The rate after a REPORT of ``expected`` and ``received`` datagrams up to
        ``seq_high``, the sender's next datagram being ``next_seq``; None when the report
        is about datagrams sent before the last cut (ignored)."""
        # seq_high - expected: the first datagram the report's interval describes.
        if seq_high - expected < self.cut_seq:
            return None
        # Reports are pooled until they hold MIN_LOSS_SAMPLE datagrams: at a low rate one
        # interval holds too few, and the rate would never move again.
        self.expected += expected
        self.received += min(received, expected)
        self.pooled += 1
        new, decreased = adapt_rate(
            rate,
            target,
            self.expected,
            self.received,
            self.pooled,
            self.slow_start,
        )
        if self.expected >= MIN_LOSS_SAMPLE:
            self.expected = self.received = self.pooled = 0
        if self.slow_start and not decreased and new > rate:
            # Slow start doubles once per feedback loop, as TCP's does per RTT: the
            # reports of the next round trip describe the old rate, and doubling on
            # each (every 50 ms) took a far session from an eighth of its 1 Gbit
            # target to all of it before the first loss came back from behind a
            # 200 Mbit link (0.4-0.9 MB/s goodput, RTT bloated to 0.5 s).
            if seq_high - expected < self.grow_seq:
                new = rate
            else:
                self.grow_seq = next_seq
        if decreased:
            self.slow_start = False
            # One cut per feedback loop (NewReno's `recover`, RFC 6582): reports about
            # datagrams sent before this cut describe the old rate; ignore them.
            self.cut_seq = next_seq
            self.expected = self.received = self.pooled = 0
        return new


class Pacer:
    """A token bucket in bytes at ``rate`` bit/s, ``BURST_SECONDS`` deep (at least
    ``min_burst`` bytes: two datagrams, or one batch)."""

    __slots__ = ("last", "min_burst", "rate", "tokens")

    def __init__(self, rate: float, min_burst: int) -> None:
        self.rate = rate
        self.min_burst = min_burst
        self.tokens = 0.0
        self.last: float | None = None

    @property
    def burst(self) -> float:
        return max(float(self.min_burst), self.rate / 8 * BURST_SECONDS)

    def refill(self, now: float) -> float:
        """Tokens (bytes) available at ``now``."""
        if self.last is not None and now > self.last:
            self.tokens += (now - self.last) * self.rate / 8
        if self.last is None or now > self.last:
            self.last = now
        self.tokens = min(self.tokens, self.burst)
        return self.tokens

    def take(self, size: int) -> None:
        self.tokens -= size

    def when(self, now: float, size: float) -> float:
        """When ``size`` bytes of tokens will be there (``now`` if they are), at least a
        microsecond ahead otherwise: float rounding must not make a timer that is due
        "now" yet finds a token short (a busy loop)."""
        size = min(size, self.burst)
        if self.tokens >= size - 1:
            return now
        return now + max(1e-6, (size - self.tokens) * 8 / self.rate)
