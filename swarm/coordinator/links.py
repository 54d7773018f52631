"""A node's link estimates, and the capacity snapshot the allocator plans from.

:class:`~swarm.coordinator.capacity.CapacityBook` keeps one :class:`Link` per fetching
node from its reports; :func:`snapshot` turns them into the allocator's input
(:class:`~swarm.coordinator.allocate.Snapshot`), deciding whether S3 counts as
unlimited (see the book's module docstring for why each estimate is what it is). Pure:
no clock, no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from swarm.coordinator.allocate import Snapshot

LINK_SHARE: Final = 0.8
"""A reader getting less than this share of the nodes' download capacity (the median of
their peaks) from S3 is limited by S3, whatever peers give."""

S3_AS_FAST: Final = 1.0
"""S3 counts as unlimited while a reader gets at least this multiple of what the swarm
gives a node (medians)."""

FLEET_LINK_SHARE: Final = 0.5
"""S3 fed every link only if it gave most nodes at least this share of the fleet's link
(:func:`fleet_link`) over an interval: origin-bound's readers get an eighth to a
sixteenth of it, s3-fast's 0.8-0.97."""

FILLED_SHARE: Final = 0.7
"""S3 fed every link (:func:`fed_every_link`) only if for most nodes the most it gave over
one interval is at least this share of the node's download peak. Below
:data:`LINK_SHARE`: the stripes are read while peers share the downlinks, and in one
s3-fast run at a quarter of its rates in five or so the nodes' S3 peaks came to 0.57-0.98
of their download peaks (median 0.76; 0.87 in a traced run that went ALL) while their S3 rates
summed to 78% of all their links at once; at 0.8 the fleet was planned on stripes and a
37% direct share for the whole run (origin 2.5 F where ALL reads 4.5-5.3, 20.7 s against
19.3-19.9), and the peaks never rose again (S3 shared the downlinks with peers from then
on). Where the origin is the bottleneck the sum of the readers' rates is what keeps
ALL out (:data:`TOGETHER_SHARE`), not this share."""

TOGETHER_SHARE: Final = 0.75
"""S3 fed every link (:func:`fed_every_link`) only if the nodes' S3 rates at once summed
to at least this share of all their links (the median download peak, times the
nodes): a node each at full speed one after another is not an origin that feeds them
all, nor is one that feeds most of them. s3-fast's stripes summed to 0.86-0.98 of its
six links; swarm-bound's origin at a quarter of its rates (250 Mbit for eight nodes of
50) gave its eight 0.61-0.63 before ALL, and at 0.5 it went ALL in three runs of eight
(every node reading the object from S3: 30.8-36.1 s against 24.9-25.2, the origin
sending 5.3-7.0 F). Not :data:`LINK_SHARE`: the rates are one interval's counters of whole
pieces, and stripes that start a little apart overlap in part."""


@dataclass
class Link:
    """One fetching node's link, as its reports have shown it (bytes/s)."""

    down: float
    """Download capacity: the peak of its total download rate."""
    up: float
    """Upload capacity (see :mod:`swarm.coordinator.capacity`'s docstring)."""
    peers: float
    """The node's current download rate from peers."""
    upload_bound: bool = False
    """Peers have held a backlog for the node (its upload peak is a capacity)."""
    s3: float = 0.0
    """The most S3 gave the node over one report interval."""
    received: float = -1.0
    """What the node received from every source over its last report interval (-1: not
    known yet)."""


def snapshot(
    size: int,
    links: Iterable[Link],
    seeders: Iterable[float],
    s3_per_reader: float | None,
    readers: int,
    origin_rate: float | None = None,
    swarm_shown: bool = True,
    origin_peak: float = 0.0,
    together: float = 0.0,
    measured_afresh: bool = False,
    fine_rates: bool = False,
) -> Snapshot | None:
    """The snapshot to allocate from, or None while the rates cannot tell yet.
    ``swarm_shown``: peers have exchanged for
    :data:`~swarm.coordinator.capacity.PEERS_WARMUP` (or
    :data:`~swarm.coordinator.capacity.PEERS_WARMUP_FAST`: the rates mean something);
    ``origin_peak``: the most S3 gave its readers together so far;
    ``together``: the most the nodes' S3 rates of one interval summed to;
    ``measured_afresh``: S3 slowed this cohort (under ALL, or a direct share: see
    :func:`~swarm.coordinator.capacity.s3_slowed`); ``fine_rates``: the fleet is on the
    fast warm-up (its rates count many pieces an interval: :func:`fed_every_link`)."""
    fetching = [link for link in links if link.down > 0]
    if not fetching or not swarm_shown:
        return None
    down = statistics.median(link.down for link in fetching)
    # What peers deliver was uploaded by someone: a floor for the fleet's uploads where
    # a node's counter is missing or lags (seeders' part aside). Taken too low, upload
    # capacity makes S3 look like the only source, and every node would read it all.
    up = max(
        statistics.fmean(link.up for link in fetching),
        statistics.fmean(link.peers for link in fetching),
    )
    link = fleet_link(fetching)
    if origin_rate is not None:
        origin = origin_rate
    elif fed_every_link(fetching, down, link, together, fine_rates):
        # S3 has filled the nodes' links, all at once (the stripes of a same-region
        # bucket): it feeds the fleet at link speed, whatever a reader gets now that
        # peers share its downlink
        origin = math.inf
    elif measured_afresh:
        # S3 slowed (under ALL, or a direct share): what the origin gave the fleet
        # since, measured afresh (the per-reader estimate remembers the fast S3 for tens
        # of seconds, and a reader's rate over its busy seconds overstates a slow S3:
        # the direct shares it planned had every node read the pieces nobody held
        # through the throttled origin at once)
        if origin_peak <= 0:
            return None
        origin = origin_peak
    elif not s3_per_reader or s3_per_reader <= 0:
        return None
    elif s3_per_reader < LINK_SHARE * down:
        # a reader gets well below what nodes have shown they can take: S3 is the limit
        origin = max(s3_per_reader * max(1, readers), origin_peak)
    elif s3_per_reader >= S3_AS_FAST * statistics.median(
        each.peers for each in fetching
    ) and s3_per_reader * readers >= LINK_SHARE * link * len(fetching):
        # S3 fills a reader's link as far as the nodes' peaks show (peers have had their
        # warm-up, so the peaks include what they gave) and gives at least what peers
        # give, nothing included (every node went WIDE on its own, or reads S3 alone
        # under ALL): S3 is the faster source, and ALL spares the nodes the swarm's CPU.
        # Only if it did so for as many readers as there are fetching nodes: two readers
        # at link speed say nothing of eight (the mixed fleet's origin, 400 Mbit for 8
        # nodes of 300, gave its last readers their link, and ALL then had all 8 read
        # everything: origin 6-7 F, 3 x T*). As many fleet links (:func:`fleet_link`),
        # not the nodes' median peak: while S3's share is all most nodes have received,
        # that peak is the share.
        origin = math.inf
    else:
        origin = max(s3_per_reader * max(1, readers), origin_peak)
    return Snapshot(size, len(fetching), down, up, origin, sum(seeders))


def fleet_link(links: list[Link]) -> float:
    """The fleet's link (bytes/s): the fastest any fetching node has moved either way over
    an interval. An autoscaled fleet's nodes are alike, and their links symmetric more
    often than not, while a node's own peaks say nothing of its link as long as S3's
    share is all it has received: at a quarter of the origin-bound fleet's rates six of
    eight nodes showed 0.2-0.5 MB/s (their part of a 25 Mbit origin) where two that had
    sent pieces to peers showed 6 (their 50 Mbit). A maximum, so one interval's overshoot
    counts (whole pieces: 7.9 MB/s on a 62.5 Mbit link): the tests against it leave room."""
    return max((max(each.down, each.up) for each in links), default=0.0)


def fed_every_link(
    links: list[Link], down: float, link: float, together: float, fine_rates: bool = False
) -> bool:
    """S3 has filled the fetching nodes' links, at once: for most nodes the most it gave
    over one interval is at least :data:`FILLED_SHARE` of the node's download peak (which
    peers have had their warm-up to raise) and at least :data:`FLEET_LINK_SHARE` of the
    fleet's ``link`` (:func:`fleet_link`: a node that has received only S3's share shows
    that share as its peak), and the nodes' rates at once summed to
    :data:`TOGETHER_SHARE` of their peaks' median, ``down``, times the nodes (not of the
    fleet's link: a maximum, its overshoot kept s3-fast at a quarter of its rates from
    ALL in one run of two). Where the origin is the bottleneck a reader gets a fraction
    of its link (100 Mbit for 8 nodes of 200: an eighth; 400 for 8 of 300: a sixth),
    except the one that read alone for a moment; the median leaves it out.

    With ``fine_rates`` (the fast warm-up: one interval of peer traffic, many pieces an
    interval) the sum is held to the fleet's link instead: one second of peers has not
    raised every node's peak to its link. swarm-bound at full rates (1000 Mbit for eight
    nodes of 200) went ALL in about one run in five, its eight readers summing to 124.5
    MB/s, 0.76 of eight times their median peak of 20.4 MB/s (25 MB/s links; the fleet's
    link 22.9): every node then read everything from the saturated origin until ALL was
    taken back (10.0 s against 8.0-8.4). Of eight times the fleet's link the same sum is
    0.68, while s3-fast at full rates summed to 0.89-0.97 of its six (rates of 16 pieces
    an interval or more overshoot a link by ~6% at most)."""
    if not links or down <= 0 or link <= 0:
        return False
    filled = statistics.median(each.s3 / each.down for each in links)
    links_at_once = (link if fine_rates else down) * len(links)
    return (
        filled >= FILLED_SHARE
        and statistics.median(each.s3 for each in links) >= FLEET_LINK_SHARE * link
        and together >= TOGETHER_SHARE * links_at_once
    )
