"""One node's rates for one artifact, from the byte counters in its reports.

Computed by the coordinator, not trusted from nodes: EMAs of each source's download
rate and of the upload rate (what the stripe planner and the tracker's ranking follow),
and one interval's counters (the peaks the allocator takes as link capacities, and a
reader's S3 rate of the moment). Pure: ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Final

from swarm.policy import ema, rate


@dataclass
class NodeRates:
    """One node's rate averages (bytes/s) for one artifact."""

    at: float
    counters: dict[str, int]
    down: dict[str, float] = field(default_factory=dict)
    up: float = 0.0
    up_peak: float = 0.0
    """Peak upload rate over one report interval: the node's upload capacity as far as
    it has shown it (from its ``uploaded`` counter; from libtorrent's rate for a node
    that does not send one)."""
    down_peak: float = 0.0
    """Peak of the total download rate (every source): the node's download capacity as
    far as it has shown it."""
    received_now: float = -1.0
    """Bytes/s the node received from every source over the last report interval alone
    (not averaged; -1: no interval yet). A node that S3 and peers both left idle shows
    here at once, while the peers' EMA takes seconds to decay."""
    uploaded: int = -1
    """The node's upload counter as of this report (-1: it sends none)."""
    node_at: float = -1.0
    """The node's own clock when it read its counters (the fetch's ``elapsed``; -1: it
    sends none). Intervals are timed on it where both reports carry it: a report
    delayed on a busy node or in transit no longer makes the next interval look fast."""
    s3_now: float = 0.0
    """Bytes/s from S3 over the last interval of at least :data:`MIN_PEAK_INTERVAL`
    (not averaged): what S3 gives this reader now, a one-second stripe included."""
    s3_peak: float = 0.0
    """The most of :attr:`s3_now` so far: whether S3 ever filled this node's link."""
    s3_busy: float = -1.0
    """The node's S3 reading seconds as of this report (-1: it sends none)."""
    peak_counters: dict[str, int] | None = None
    """The counters the next peak sample starts from (None: :attr:`counters`), with
    :attr:`peak_at`, :attr:`node_at`, :attr:`uploaded` and :attr:`s3_busy`: those of the
    last report that closed an interval of at least :data:`MIN_PEAK_INTERVAL`. A shorter
    one (a report the reader woke after its batch) is no sample, and its bytes count in
    the next: taken as the base, they fell out of every peak, and each s3-fast node read
    its stripes in 0.3 s bursts, each followed by such a report (S3 peaks of 0: MIX)."""
    peak_at: float = -1.0
    """The coordinator's clock at that report (-1: :attr:`at`)."""

    def to_json(self) -> dict[str, object]:
        return {
            "at": self.at,
            "counters": self.counters,
            "down": self.down,
            "up": self.up,
            "up_peak": self.up_peak,
            "down_peak": self.down_peak,
            "received_now": self.received_now,
            "uploaded": self.uploaded,
            "node_at": self.node_at,
            "s3_now": self.s3_now,
            "s3_peak": self.s3_peak,
            "s3_busy": self.s3_busy,
            "peak_counters": self.peak_counters,
            "peak_at": self.peak_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> NodeRates:
        return cls(
            float(data["at"]),  # type: ignore[arg-type]
            {str(k): int(v) for k, v in data["counters"].items()},  # type: ignore[attr-defined]
            {str(k): float(v) for k, v in data["down"].items()},  # type: ignore[attr-defined]
            float(data["up"]),  # type: ignore[arg-type]
            float(data["up_peak"]),  # type: ignore[arg-type]
            float(data.get("down_peak", 0.0)),  # type: ignore[arg-type]
            float(data.get("received_now", -1.0)),  # type: ignore[arg-type]
            int(data.get("uploaded", -1)),  # type: ignore[call-overload]
            float(data.get("node_at", -1.0)),  # type: ignore[arg-type]
            float(data.get("s3_now", 0.0)),  # type: ignore[arg-type]
            float(data.get("s3_peak", 0.0)),  # type: ignore[arg-type]
            float(data.get("s3_busy", -1.0)),  # type: ignore[arg-type]
            (
                {str(k): int(v) for k, v in data["peak_counters"].items()}  # type: ignore[attr-defined]
                if data.get("peak_counters") is not None
                else None
            ),
            float(data.get("peak_at", -1.0)),  # type: ignore[arg-type]
        )


STARVED_SHARE: Final = 0.1
"""A node that received less than this share of its download capacity (its peak) over
the last report interval is starved: it may widen even under an allocation."""

FIRST_SAMPLE_SECONDS: Final = 0.1
"""S3 reading seconds a node's first report must carry for its S3 bytes over them to
count as a sample (:func:`update_rates`): what ``swarm fetch`` read while the daemon
started (0.2-0.6 s in the fleet benches), counted as it streamed (256 KiB at a time),
where later samples count whole pieces and need :data:`MIN_PEAK_INTERVAL`."""

MIN_PEAK_INTERVAL: Final = 0.5
"""Seconds a report interval must span for its rates to count as a peak: bytes move in
whole pieces, and a short interval (a report the reader woke after its batch) shows one
piece more or less as a large rate. A shorter one is merged into the next (its report
moves the averages only: see :attr:`NodeRates.peak_counters`). Intervals timed on
arrival (a node that sends no clock) are noisier still: two reports close together, one
delayed in transit, show bytes of a second as sent in a fraction of one."""

BUSY_FLOOR: Final = 0.5
"""S3's rate of the moment is its bytes over the reader's busy seconds, but over at
least this share of the interval: a single fill piece read in 30 ms is no sign that S3
fills the link."""


def update_rates(
    previous: NodeRates | None,
    counters: dict[str, int],
    up_rate: float,
    now: float,
    uploaded: int | None = None,
    node_at: float | None = None,
    s3_busy: float | None = None,
) -> NodeRates:
    """The node's rates after a report with cumulative ``counters`` (and ``uploaded``)
    at ``now``; ``node_at``: the node's own clock for them, if it sent one; ``s3_busy``:
    the seconds its S3 reader has spent reading, if it sent them.

    The averages (``down``, ``up``) follow the coordinator's clock. The peaks are one
    interval's counters (node-timed where possible): an average of one-second stripe
    bursts reads as a fraction of the link, and the s3-fast fleet (S3 fills every node's
    link) never showed that S3 had filled its links (MIX, never ALL, 2.3x T*). The S3
    rate of the moment is the interval's S3 bytes over the reader's busy seconds in it,
    where the node sends them: a stripe read in 0.7 s of a second still came at S3's
    full rate (it is a lower bound of the node's download capacity too)."""
    sent = -1 if uploaded is None else uploaded
    clock = -1.0 if node_at is None else node_at
    busy = -1.0 if s3_busy is None else s3_busy
    if previous is None:
        peak = up_rate if uploaded is None else 0.0
        # S3 bytes over reading seconds in a first report: read before the daemon
        # reported (``swarm fetch``'s GET while its daemon started), a sample already
        sampled = busy >= FIRST_SAMPLE_SECONDS
        s3_now = rate(0, counters.get("s3", 0), busy) if sampled else 0.0
        return NodeRates(
            now,
            dict(counters),
            {s: 0.0 for s in counters},
            up_rate,
            peak,
            down_peak=s3_now,
            uploaded=sent,
            node_at=clock,
            s3_now=s3_now,
            s3_peak=s3_now,
            s3_busy=busy,
        )
    dt = now - previous.at
    down = dict(previous.down)
    for source, total in counters.items():
        before = previous.counters.get(source, 0)
        down[source] = ema(down.get(source), rate(before, total, dt), dt)
    up = ema(previous.up, up_rate, dt)
    # The peaks' interval, from their own base: the node's clock if both reports carry it.
    base = previous.peak_counters if previous.peak_counters is not None else previous.counters
    base_at = previous.peak_at if previous.peak_at >= 0 else previous.at
    span = clock - previous.node_at if clock >= 0 and previous.node_at >= 0 else now - base_at
    if span < MIN_PEAK_INTERVAL:  # no sample: the base stays for the next report
        return replace(previous, at=max(previous.at, now), counters=dict(counters), down=down,
                       up=up, peak_counters=dict(base), peak_at=base_at)  # fmt: skip
    samples = {source: rate(base.get(source, 0), total, span) for source, total in counters.items()}
    if uploaded is None or previous.uploaded < 0:
        up_sample = up_rate  # libtorrent's own average: slow to rise, never too high
    else:
        up_sample = rate(previous.uploaded, uploaded, span)
    received = sum(samples.values())
    s3_now = samples.get("s3", 0.0)
    if busy >= 0 and previous.s3_busy >= 0:
        reading = max(busy - previous.s3_busy, BUSY_FLOOR * span)
        s3_now = rate(base.get("s3", 0), counters.get("s3", 0), reading)
    return NodeRates(
        max(previous.at, now),
        dict(counters),
        down,
        up,
        max(previous.up_peak, up_sample),
        max(previous.down_peak, sum(down.values()), received, s3_now),
        received,
        sent,
        clock,
        s3_now,
        max(previous.s3_peak, s3_now),
        busy,
    )


def link_capacity(rates: Iterable[NodeRates]) -> float:
    """A node's link as its reports show it (bytes/s; 0 before any interval): the most it
    moved one way over an interval, down or up, for any artifact. Cloud links are
    symmetric far more often than not, and a node that fetched from S3 in its region
    showed its link's rate then: a seeder's UDP server takes this as its send budget
    (:mod:`swarm.udp.server`), where it would otherwise send into a 1 Gbit/s budget."""
    return max((max(r.up_peak, r.down_peak) for r in rates), default=0.0)


def spare_upload(rates: Iterable[NodeRates]) -> float:
    """Upload headroom of a node: its peak upload EMA minus its current one, over its
    artifacts (0 for a node with no rates)."""
    entries = list(rates)
    if not entries:
        return 0.0
    return max(0.0, max(r.up_peak for r in entries) - sum(r.up for r in entries))
