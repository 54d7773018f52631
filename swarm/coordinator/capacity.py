"""The capacity snapshot the allocator works from, kept from the nodes' reports.

Per artifact, each reporting node's link estimates: its download capacity is the peak
of its total download rate (all sources); its upload capacity the peak of its upload
rate over a report interval once uploads have shown to be the limit, else its download
capacity (cloud links are symmetric far more often than not).

Uploads show their limit when peers hold a backlog for the node (pieces it lacks, at
least ``BACKLOG_SECONDS`` of its download capacity) and do not send them faster: the
mixed fleet (100 Mbit up, 300 down) then gets the direct share its uploads cannot relay.
Taking the download capacity there planned stripes alone; every node went WIDE on its
own and the origin sent each piece seven times. Without a backlog uploads are limited by
what there is to send, not by the link: where the origin is the bottleneck a node
relays fresh pieces as fast as they come, and its upload peak (at times under what the
plan needs to stripe) would have the plan read pieces from S3 again (origin B/F 1.2-1.4).

S3's aggregate rate is unlimited once S3 has filled the fetching nodes' links at once
(:func:`fed_every_link`: one report interval's S3 bytes against each node's peak); else
the per-reader estimate times the readers, or the most S3 gave its readers together
this cohort if that is more; or unlimited while S3 gives a reader about all the node
can take and at least what the swarm gives a node. A
reader cannot tell from its own rate whether S3 or its link limits it (both look the
same at the start of a scale-out, when peers have nothing to give yet), but once pieces
spread, the nodes' peaks show what a node can take besides S3: where the origin is the
bottleneck (100 Mbit for 8 nodes) a reader gets a fraction of its node's peak; where S3
is in the same region it fills the link, as much as peers or more. Under ALL the peaks
stand (a node takes nothing from peers then), so ALL is undone by S3's rates of the
moment instead: when they fall well below the peaks
(:meth:`~swarm.coordinator.originmeter.OriginMeter.slowed_under_all`), the origin's
rates are measured afresh.

A report costs O(1) (one node's entry replaced); the allocation is recomputed from the
entries at most every ``SNAPSHOT_PERIOD`` seconds per artifact, O(fleet) then (and once
more per period for ALL alone while pieces are still leaving the origin). The book
lives in this process: with several coordinators behind one name, each allocates from
the nodes that report to it, a sample of the fleet whose per-node averages are the
fleet's; S3's aggregate then counts this coordinator's readers, which errs towards
striping (S3 looks smaller than it is).
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from swarm.coordinator.allocate import Allocation, Mode, Snapshot, allocate, bound
from swarm.coordinator.links import Link, snapshot
from swarm.coordinator.originmeter import MIX_SLOWED_PROOF, OriginMeter
from swarm.coordinator.planstate import drop_artifacts

log = logging.getLogger(__name__)

SNAPSHOT_PERIOD: Final = 1.0
"""Seconds an artifact's allocation is reused before it is recomputed from the book."""

PEERS_WARMUP: Final = 2.0
"""Seconds of peer traffic before the book allocates. In the first seconds of a
scale-out the rates are still ramping up (EMAs of one or two reports), a reader's
download peak is its S3 rate (the only thing it has received), and peers have little to
give: an origin at 100 Mbit for 4 nodes looked "as fast as the link and the swarm" (ALL:
every node read the whole object) or, a second later, as having spare capacity (MIX:
half of every node's bytes read again). Being wrong that way costs up to N reads of the
object; waiting costs two seconds of stripes, which read distinct pieces at full width.
Fast fleets wait less (:data:`PEERS_WARMUP_FAST`)."""

PEERS_WARMUP_FAST: Final = 1.0
"""The warm-up where the median fetching node's download peak is at least
:data:`WARMUP_PIECES` pieces over it. Chosen when a node's S3 counter moved a whole
piece at a time (the peers' counter is libtorrent's payload bytes; S3's is the bytes as
they stream in since ``s3_streamed``), so a rate's error was about a piece per interval,
and one interval of peer traffic should tell a fast node's rates as well as two tell a
slow one's (the reason the quarter-rate runs below are consistent with, not one they
isolate). With the streamed counter, one second for every fleet gained nothing where it
should have (s3-fast at a quarter 19.80-21.06 s against 19.28-20.95, mixed at a quarter
35.95-36.47 against 34.76-37.46, two pairs each), so the rule stands. One second for
every fleet, in alternating pairs against two (``bench/fleet.py --systems swarm``):
s3-fast 5.72-5.88 s against 6.10-6.60 (four pairs: ALL a second sooner; before it, the
nodes' WIDE reads and their exchange went through libtorrent, twice the CPU per GiB of
ALL's direct writes), mixed 10.21-10.50 against 10.66-10.90, swarm-bound 8.04-9.07
against 8.16-9.65 (three each), origin-bound, slow uploads and existing seeders
unchanged; but at a quarter of the rates (a node's link 6-12 pieces a second) it cost
mixed 1.4-2.6 s, slow uploads up to 3.7 and swarm-bound up to 2.8 (two pairs each), and
origin-bound read 1.28 F once. Those keep :data:`PEERS_WARMUP`. With this rule, s3-fast
5.69-6.58 s (mean 5.94) against 5.97-6.44 (6.13) in six pairs; far-region 7.81-8.02
against 7.76-7.98 (three)."""

WARMUP_PIECES: Final = 16
"""Pieces a node's download peak must reach in :data:`PEERS_WARMUP_FAST` seconds (the
rates then within ~6%) for the fast warm-up."""


BACKLOG_SECONDS: Final = 1.0
"""Peers hold at least this many seconds of a node's download capacity that it lacks:
what they send it is limited by their uploads (see the module docstring)."""


ALL_PROOF: Final = 2.0
"""Seconds an ALL allocation stands before a snapshot may take it back. Every node then
reads at full width, and their S3 rates together show what the origin gives them all
at once. Before that, the inputs that said ALL are still moving (stripes read at
slightly different moments, the nodes' peaks rising as peers ramp up): s3-fast went
ALL, MIX 52%, ALL within three seconds, and since a node that went ALL writes its S3
pieces past libtorrent, the MIX in between had it take the same pieces from peers."""


SPARE_SHARE: Final = 0.5
"""Under a MIX allocation, nodes with nothing else to read from S3 fill from it while
its readers of the moment take less than this share of it (:meth:`CapacityBook.origin_spare`)."""


DIRECT_HOLD: Final = SNAPSHOT_PERIOD
"""Seconds a direct share must last (two snapshots) before nodes read it: a node reads
its share at once and for good, and a share that one snapshot's noise brought
(origin-bound at the edge of MIX: 5% for one second) cost the origin 0.2-0.4 F."""


@dataclass
class _Artifact:
    size: int
    piece_size: int
    links: dict[str, Link] = field(default_factory=dict)
    complete: dict[str, float] = field(default_factory=dict)
    """Upload capacity of nodes that hold the whole artifact (seeders)."""
    allocation: Allocation | None = None
    snapshot: Snapshot | None = None
    """What the allocation was computed from (shown in the fleet view)."""
    at: float = -math.inf
    all_only_at: float = -math.inf
    """When a snapshot was last taken for ALL alone (``allocation(only_all=True)``)."""
    peers_since: float | None = None
    """When a fetching node was first seen receiving from peers."""
    mix_since: float | None = None
    """Since when the allocation has had a direct share (see :data:`DIRECT_HOLD`)."""
    all_since: float | None = None
    """Since when the allocation has been ALL (see :data:`ALL_PROOF`)."""
    origin: OriginMeter = field(default_factory=OriginMeter)
    """What S3 gives this cohort."""
    mix_slow_since: float | None = None
    """Since when the readers have got too little of the origin under a direct share
    (see :data:`MIX_SLOWED_PROOF`)."""
    fleet_down: tuple[float, float] = (0.0, -math.inf)
    """(the median of the fetching nodes' download peaks, when it was taken): taken at
    most every :data:`SNAPSHOT_PERIOD`, not at each of the fleet's reports."""


class CapacityBook:
    def __init__(self, origin_rate: float | None = None) -> None:
        self.origin_rate = origin_rate
        """S3's aggregate rate if the operator gave it (else measured per snapshot)."""
        self._artifacts: dict[str, _Artifact] = {}
        self._by_node: dict[str, set[str]] = {}

    def update(
        self,
        node: str,
        info_hash: str,
        size: int,
        *,
        down_peak: float,
        up_peak: float,
        peers: float,
        complete: bool,
        piece_size: int,
        backlog: int = 0,
        s3_peak: float = 0.0,
        received: float = -1.0,
    ) -> None:
        """Record one node's report. ``backlog``: bytes that peers hold and it lacks;
        ``piece_size``: the artifact's (the fast warm-up's threshold is in pieces);
        ``received``: bytes/s from every source over its last interval (-1: unknown)."""
        art = self._artifacts.get(info_hash)
        if art is None:
            art = self._artifacts[info_hash] = _Artifact(size, piece_size)
        self._by_node.setdefault(node, set()).add(info_hash)
        if complete:
            art.links.pop(node, None)
            art.complete[node] = up_peak
        else:
            if not art.links:
                # A new cohort (the first fetching node since the last one finished):
                # what the previous one showed (its allocation, its peers' warm-up) says
                # nothing of this one's links. The far-region fleet's two seeders had
                # fetched alone and left ALL behind; the far nodes then read everything
                # over the WAN and nothing from each other.
                art.allocation, art.peers_since, art.at = None, None, -math.inf
                art.all_only_at = -math.inf
                art.mix_since, art.all_since = None, None
                art.origin = OriginMeter()
            previous = art.links.get(node)
            shown = (previous is not None and previous.upload_bound) or (
                backlog > 0 and backlog >= BACKLOG_SECONDS * down_peak
            )
            up = up_peak if shown else max(up_peak, down_peak)
            art.links[node] = Link(down_peak, up, peers, shown, s3_peak, received)

    def note_origin(self, info_hash: str, aggregate: float) -> None:
        """What S3 gives its readers together now (bytes/s), for the origin's peak."""
        art = self._artifacts.get(info_hash)
        if art is not None:
            art.origin.note_aggregate(aggregate)

    def note_s3(
        self,
        info_hash: str,
        node: str,
        rate: float,
        now: float,
        total: int = 0,
        started: float | None = None,
    ) -> None:
        """A node's S3 rate over its last report interval (bytes/s, from its counter),
        its S3 byte counter ``total`` and when its fetch started (``started``, the
        coordinator's clock; None if the node sends no clock): the artifact's
        :class:`OriginMeter`. O(1) amortized; the sums over the nodes are taken per
        snapshot (:meth:`allocation`)."""
        art = self._artifacts.get(info_hash)
        if art is not None:
            art.origin.note_s3(node, rate, now, total, started)

    def allocation(
        self,
        info_hash: str,
        s3_per_reader: float | None,
        readers: int,
        now: float,
        *,
        only_all: bool = False,
    ) -> Allocation | None:
        """The artifact's allocation, recomputed at most every ``SNAPSHOT_PERIOD``; None
        until S3's rate and the swarm's are both known. A snapshot that cannot tell
        (no peer traffic) keeps the last allocation. ``only_all``: keep the new plan
        only if the snapshot found S3 unlimited, i.e. ALL (else return the last
        allocation): pieces are still leaving the origin, and only that ALL is sure by
        then (see :class:`StripePlanner`)."""
        art = self._artifacts.get(info_hash)
        if art is None:
            return None
        # (its own clock for ALL alone: the first allocation proper is not held back
        # a period by the ALL-only snapshot before it)
        if now - (art.all_only_at if only_all else art.at) < SNAPSHOT_PERIOD:
            return art.allocation
        if only_all:
            art.all_only_at = now
        else:
            art.at = now
        art.origin.at_snapshot(now)
        if (
            art.allocation is not None
            and art.allocation.mode is Mode.ALL
            and art.all_since is not None
            and now - art.all_since >= ALL_PROOF
            and art.origin.slowed_under_all(art.links, now)
        ):
            log.info("S3 slowed under ALL for %s: measuring the origin afresh", info_hash[:8])
            self._measure_afresh(art, now)
        elif art.allocation is not None and art.allocation.mode is Mode.MIX:
            if not art.origin.fell_under_mix((k.down for k in art.links.values()), now):
                art.mix_slow_since = None
            elif art.mix_slow_since is None:
                art.mix_slow_since = now
            elif now - art.mix_slow_since >= MIX_SLOWED_PROOF:
                log.info("S3 slowed under a direct share for %s: measuring the origin afresh",
                         info_hash[:8])  # fmt: skip
                self._measure_afresh(art, now)
        if art.peers_since is None and any(link.peers > 0 for link in art.links.values()):
            art.peers_since = now
        fast = _fast_warmup(art)
        warmup = PEERS_WARMUP_FAST if fast else PEERS_WARMUP
        snap = snapshot(
            art.size,
            art.links.values(),
            art.complete.values(),
            s3_per_reader,
            readers,
            self.origin_rate,
            swarm_shown=art.peers_since is not None and now - art.peers_since >= warmup,
            origin_peak=art.origin.peak,
            together=art.origin.together,
            measured_afresh=art.origin.measured_afresh,
            fine_rates=fast,
        )
        if log.isEnabledFor(logging.DEBUG):
            shown = [
                (round(k.down), round(k.up), round(k.peers), round(k.s3))
                for k in art.links.values()
            ]
            log.debug(
                "snapshot %s: S3 %s/s per reader x %d readers, origin peak %.0f/s, together "
                "%.0f/s; links (down, up, peers, S3 peak) %s -> %s",
                info_hash[:8], s3_per_reader, readers, art.origin.peak, art.origin.together,
                shown, snap,
            )  # fmt: skip
        if snap is not None:  # else the last allocation stands (see :func:`snapshot`)
            if only_all and not math.isinf(snap.origin):
                # Before the spread only an origin shown to feed every link is ALL (an
                # infinite origin is always ALL): an allocation's ALL on a finite origin
                # rests on the nodes' download peaks, which show S3's share while it is
                # all a node has received (at a quarter of the origin-bound fleet's
                # rates, 0.2-0.5 MB/s of 6)
                return art.allocation
            plan = allocate(snap)
            if (
                plan.mode is not Mode.ALL
                and art.all_since is not None
                and now - art.all_since < ALL_PROOF
            ):
                return art.allocation  # ALL has not had its chance to show the origin
            art.allocation, art.snapshot = plan, snap
            if plan.mode is not Mode.ALL:
                art.all_since = None
            elif art.all_since is None:
                art.all_since = now
            if art.allocation.mode is not Mode.MIX:
                art.mix_since = None
            elif art.mix_since is None:
                art.mix_since = now
        return art.allocation

    def direct_share(self, info_hash: str, now: float) -> float:
        """The allocation's direct share once it has held for :data:`DIRECT_HOLD`
        seconds, else 0."""
        art = self._artifacts.get(info_hash)
        if art is None or art.allocation is None or art.mix_since is None:
            return 0.0
        return art.allocation.direct if now - art.mix_since >= DIRECT_HOLD else 0.0

    def origin_spare(self, info_hash: str) -> bool:
        """The nodes' S3 rates over the last report interval (the meter's window) sum to
        less than :data:`SPARE_SHARE` of the origin the last snapshot planned on (a finite
        one)."""
        art = self._artifacts.get(info_hash)
        if art is None or art.snapshot is None or math.isinf(art.snapshot.origin):
            return False
        return art.origin.window_sum < SPARE_SHARE * art.snapshot.origin

    def has_seeders(self, info_hash: str) -> bool:
        """Some reporting node holds the whole artifact."""
        art = self._artifacts.get(info_hash)
        return art is not None and bool(art.complete)

    def measured_afresh(self, info_hash: str) -> bool:
        """S3 slowed this cohort, under ALL (:meth:`OriginMeter.slowed_under_all`) or a
        direct share (:meth:`OriginMeter.fell_under_mix`), and the origin was measured
        afresh."""
        art = self._artifacts.get(info_hash)
        return art is not None and art.origin.measured_afresh

    def fleet_down(self, info_hash: str, now: float) -> float:
        """The median of the fetching nodes' download peaks (bytes/s; 0 before any), as of
        at most :data:`SNAPSHOT_PERIOD` ago: what a node of this fleet can receive, told to
        each node for its uplink pacer (:func:`swarm.agent.uplink.narrow_uplink`)."""
        art = self._artifacts.get(info_hash)
        if art is None:
            return 0.0
        value, at = art.fleet_down
        if now - at >= SNAPSHOT_PERIOD or now < at:
            downs = [link.down for link in art.links.values() if link.down > 0]
            value = statistics.median(downs) if downs else 0.0
            art.fleet_down = (value, now)
        return value

    def last(self, info_hash: str) -> Allocation | None:
        """The artifact's allocation as last computed (None before the first)."""
        art = self._artifacts.get(info_hash)
        return art.allocation if art is not None else None

    def describe(self, info_hash: str) -> dict[str, object] | None:
        """The last allocation and the bound it was computed against (fleet view)."""
        art = self._artifacts.get(info_hash)
        if art is None or art.allocation is None:
            return None
        plan, snap = art.allocation, art.snapshot
        described: dict[str, object] = {
            "mode": plan.mode.value,
            "direct": round(plan.direct, 3),
            "predicted_seconds": round(plan.finish, 2),
            "bound_seconds": round(bound(snap), 2) if snap is not None else None,
        }
        if snap is not None:  # the capacities it was planned on (bytes/s; None: unlimited)
            described["capacity"] = {
                "nodes": snap.nodes,
                "origin": None if math.isinf(snap.origin) else round(snap.origin),
                "down": round(snap.down),
                "up": round(snap.up),
                "seeders": round(snap.seeders),
            }
        return described

    def forget(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            drop_artifacts(self._by_node, node, (), self._forget_artifact)

    def forget_unlisted(self, node: str, listed: Iterable[str]) -> None:
        """Drop ``node``'s links for the artifacts it no longer lists, as :meth:`forget`
        does for a departed node: a seeder whose data went away uploads none of it."""
        drop_artifacts(self._by_node, node, listed, self._forget_artifact)

    @staticmethod
    def _measure_afresh(art: _Artifact, now: float) -> None:
        """The origin's rates from now on (:meth:`OriginMeter.measure_afresh`), and no
        allocation until the next snapshot plans on them."""
        art.allocation, art.all_since, art.mix_since = None, None, None
        art.mix_slow_since = None
        art.origin.measure_afresh(now)

    def _forget_artifact(self, node: str, info_hash: str) -> None:
        art = self._artifacts.get(info_hash)
        if art is None:
            return
        art.links.pop(node, None)
        art.complete.pop(node, None)
        art.origin.forget(node)
        if not art.links and not art.complete:
            del self._artifacts[info_hash]


def _fast_warmup(art: _Artifact) -> bool:
    """The artifact's rates need only :data:`PEERS_WARMUP_FAST` of peer traffic: the
    median fetching node's download peak is :data:`WARMUP_PIECES` pieces or more per
    that, so its rates count many pieces an interval."""
    downs = [link.down for link in art.links.values()]
    fast = WARMUP_PIECES * art.piece_size / PEERS_WARMUP_FAST
    return bool(downs) and statistics.median(downs) >= fast
