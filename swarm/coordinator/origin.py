"""Origin coordination: per-node rates, and which node reads which pieces from S3.

Decisions here are pure (no clock, no I/O: ``now`` is passed in), kept apart from
:mod:`swarm.coordinator.fleet` (the tracker's peer store) because they are the
coordinator's *decisions*, while the peer store is its *memory*.

Rates (:mod:`swarm.coordinator.rates`): each node's per-source download and upload
rates, from the cumulative byte counters in its reports (computed there, not trusted
from nodes).

``StripePlanner``: each piece should leave S3 about once while the swarm spreads it.
A node reading the origin is handed a *stripe*: up to ``stripe_bytes`` (or
``STRIPE_SECONDS`` of its S3 rate, if more) of pieces that no node holds and no other
node is reading, lowest index first (every such piece has availability zero, so "rarest
first" is a tie broken by position, which keeps a stripe contiguous and its ranged GETs
large). Pieces held by anyone leave the stripes; a node whose stripe made no progress
for ``stall_seconds`` (or two report intervals, if longer), or that stopped reporting,
loses it, and the pieces go to the next node that asks. At most ``max_readers`` nodes
read the origin at once (the S3 request budget).

The per-artifact state the planner works on (piece counts, stripes, readers) and its
bounds are :mod:`swarm.coordinator.planstate`'s: in this process, or in Redis behind
several coordinators (:mod:`swarm.coordinator.redisplan`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from swarm.coordinator.allocate import Allocation
from swarm.coordinator.allocate import Mode as AllocationMode
from swarm.coordinator.capacity import CapacityBook
from swarm.coordinator.planstate import Commit, MemoryPlanState, PlanState
from swarm.coordinator.rates import STARVED_SHARE, NodeRates, update_rates
from swarm.policy import (
    HOLD_SECONDS,
    MixState,
    Mode,
    decide,
    may_fill,
    s3_capacity,
)

STRIPE_BYTES: Final = 8 << 20
"""Origin work outstanding per node before its rate is known: two 4 MiB GETs. Small, so
that the first nodes of a scale-out do not take the whole object between them (16 MiB
stripes gave a 64 MiB artifact to 4 of 8 nodes, each reading it with one GET);
``STRIPE_SECONDS`` grows it for fast readers."""

STRIPE_SECONDS: Final = 2.0
"""A fast reader's stripe holds at least this many seconds of its S3 rate, so it keeps
several ranges in flight instead of waiting on reports."""

STALL_SECONDS: Final = 6.0
"""A stripe with no finished piece and no S3 byte for this long is handed to others (a
stuck GET retries for longer than this only when S3 is failing anyway). Bytes count: an
origin that is the bottleneck gives each reader a share of it, and a reader's first
piece of 1 MiB came after 6 s at a quarter of the origin-bound fleet's rates (eight
readers, each two GETs, of a 25 Mbit origin); on pieces alone seven of its eight stripes
were released at 6 s and read again by other nodes while their first readers went on
(27 releases in one run, the origin sending 1.15-1.18 F)."""

STALL_INTERVALS: Final = 2.0
"""...or for this many report intervals, if longer: at a 5 s interval the coordinator
sees a stripe's progress only every 5 s, and a working reader must not lose it."""

EAGER_WIDE_SECONDS: Final = 3.0
"""A node with no stripe before the fleet's first allocation widens at once (no
:data:`~swarm.policy.HOLD_SECONDS`) when it lacks at least this many seconds of S3's
per-reader rate: waiting a hold to see what peers give it then costs the idle origin
more than the pieces it may read twice (slow-uploads: 7 s of it lacking; s3-fast:
3.5). A small object is left to the hold: CI's origin-bound fleet (16 MiB, a reader
lacking 8 MiB at its stripe's end, 2 s of its S3 peak of 4.2 MB/s) widened at 2 s and
its origin sent 1.39 F; peers relay those pieces at link speed."""

EAGER_UPLOAD_SHARE: Final = 0.5
"""...and only while S3 gives a reader at least this share of what the node has shown
it can upload: where uploads are the larger part of the fleet's capacity, peers like it
soon give it more than S3 would, and reading S3 meanwhile takes the origin from the
stripes. The mixed fleet at a quarter of its rates (S3 1.3-1.5 MB/s a reader, nodes
uploading 3-5): the node or two that widened at their stripes' end, 4-6 s in, read
38 pieces at the origin's slow rate, held 19-24 MB at 12 s against 39-63 for the
others, and finished 2-5 s after them. Alternating pairs (`bench/fleet.py --scenario
mixed --rate-scale 0.25 --systems swarm`): 34.50-37.41 s against 35.96-39.29 (four
against three), the nodes' mean 32.8-33.4 against 33.4-35.6; slow uploads, whose
readers get 2-3 times what their 5 Mbit uplinks send, 38.22-38.79 against 38.48-38.69.
Comparing with the upload itself (a share of 1) took that from slow uploads too: a
node's upload peak there, over one interval, reached S3's rate a reader (40.63-41.96 s
against 39.06-39.19)."""

PEERS_CHANCE_SECONDS: Final = 3.0
"""Before an allocation, a node that has read nothing from the origin, beside seeders or
while other nodes read their stripes, widens only after its peers were slow this long
(not :data:`~swarm.policy.HOLD_SECONDS`): what it lacks is held by peers or on its way
from a busy origin, and its peers' first second or two is connecting. CI's late node
beside two seeders on loopback got one piece in its first two reports, widened, and read
12 of 24 pieces from S3 that the seeders sent too (2 runs in 15); in CI's origin-bound
fleet a node that started last had nothing from peers 1.3 s in, widened, and the origin
sent 1.74 F. A node whose peers never answer still widens, three seconds later."""

DEFAULT_MAX_READERS: Final = 16
"""Nodes reading the origin at once. 16 x 2 ranges in flight stays far below S3's
per-prefix limit (5,500 GET/s) and leaves most of a fleet to the swarm."""

MAX_STRIPE_PIECES: Final = 1024
"""Most pieces one stripe (one reply) names: about 6 KB of JSON. 1,024 pieces of 1 MiB
is 4 s of a 2 Gbit/s S3 reader; a faster reader asks again when it is done."""


@dataclass(frozen=True)
class OriginPlan:
    """What a node is told about one artifact in its report reply."""

    stripe: list[int]
    mode: Mode
    s3_estimate: float | None
    fill: bool = False
    """Every piece has left the origin (it is held, or on its way in someone's stripe)
    and S3 would add a useful share to this node's peer downloads
    (:func:`swarm.policy.may_fill`): it may read rare pieces one GET at a time."""
    rates: NodeRates | None = field(default=None, compare=False)
    """The node's rates after this report (not sent: for the tracker's ranking)."""
    direct: float = 0.0
    """Share of the artifact the node should read from S3 for itself besides its stripe
    (the allocation's direct part, :mod:`swarm.coordinator.allocate`)."""
    fleet_down: float = 0.0
    """The median of the fetching nodes' download peaks, bytes/s
    (:meth:`CapacityBook.fleet_down`)."""
    link_bound: bool = False
    """The allocation's bound is the nodes' downlinks (:attr:`Allocation.link_bound`)."""

    def to_json(self) -> dict[str, object]:
        return {
            "stripe": self.stripe,
            "mode": self.mode.value,
            "s3_estimate": self.s3_estimate,
            "fill": self.fill,
            "direct": self.direct,
            "fleet_down": round(self.fleet_down),
            "link_bound": self.link_bound,
        }


class StripePlanner:
    """Stripes of origin pieces per node and artifact, plus each node's source mode."""

    def __init__(
        self,
        stripe_bytes: int = STRIPE_BYTES,
        stall_seconds: float = STALL_SECONDS,
        max_readers: int = DEFAULT_MAX_READERS,
        state: PlanState | None = None,
        origin_rate: float | None = None,
    ) -> None:
        if stripe_bytes <= 0 or stall_seconds <= 0 or max_readers <= 0:
            raise ValueError(
                f"stripe_bytes, stall_seconds and max_readers must be positive, got "
                f"{stripe_bytes}, {stall_seconds}, {max_readers}"
            )
        self.stripe_bytes = stripe_bytes
        self.stall_seconds = stall_seconds
        self.max_readers = max_readers
        self.state = state if state is not None else MemoryPlanState()
        self.origin_rate = origin_rate
        """S3's aggregate rate as the operator gave it (``math.inf``: unlimited), or None
        to measure it."""
        self.capacity = CapacityBook(origin_rate)

    def check(self, info_hash: str, piece_size: int, count: int) -> None:
        """Raise :class:`GeometryError` if ``info_hash`` is known with another geometry."""
        self.state.check(info_hash, piece_size, count)

    def plan(
        self,
        node: str,
        info_hash: str,
        *,
        piece_size: int,
        count: int,
        held: int,
        complete: bool,
        counters: dict[str, int],
        up_rate: float,
        now: float,
        interval: float = 1.0,
        uploaded: int | None = None,
        node_at: float | None = None,
        s3_busy: float | None = None,
        s3_early: int = 0,
    ) -> OriginPlan:
        """Record ``node``'s report for one artifact; return its stripe and mode.
        ``interval``: the report interval the node was told (stalls scale with it);
        ``uploaded``: the node's upload counter, if it sends one; ``node_at``: the
        node's clock when it read its counters, if it sends one; ``s3_busy``: the
        seconds its S3 reader has spent reading, if it sends them; ``s3_early``: the bytes
        of its S3 counter that ``swarm fetch`` read while its daemon started."""
        view = self.state.load(node, info_hash, piece_size, count)
        if view is None:  # past the state's bounds: the node decides alone
            return OriginPlan([], Mode.STRIPE, None)
        rates = update_rates(view.rates, counters, up_rate, now, uploaded, node_at, s3_busy)
        backlog = ((view.union | held) & ~held).bit_count() * piece_size
        self.capacity.update(
            node,
            info_hash,
            piece_size * count,
            down_peak=rates.down_peak,
            up_peak=rates.up_peak,
            s3_peak=rates.s3_peak,
            received=rates.received_now,
            peers=rates.down.get("peers", 0.0),
            complete=complete,
            backlog=backlog,
            piece_size=piece_size,
        )
        # the readers' S3 rates, this node's as of this report
        s3 = {n: r for n, r in view.reader_s3}
        if node in s3:
            s3[node] = rates.down.get("s3", 0.0)
        self.capacity.note_origin(info_hash, sum(s3.values()))
        started = now - node_at if node_at is not None and node_at >= 0 else None
        self.capacity.note_s3(info_hash, node, rates.s3_now, now, counters.get("s3", 0), started)
        positive = [r for r in s3.values() if r > 0]
        current = statistics.median(positive) if positive else None
        dt = now - view.estimated_at if view.estimated_at is not None else 0.0
        # Once S3 slowed (under ALL or a direct share), what readers get now: the
        # remembered rate (a 10 s half-life, for readers that slow down near the end for
        # lack of pieces) sent nodes WIDE on the throttled origin (28 MiB read where
        # nobody held 4)
        remembered = None if self.capacity.measured_afresh(info_hash) else view.estimate
        estimate = s3_capacity(remembered, current, dt)
        stall = max(self.stall_seconds, STALL_INTERVALS * interval)
        if complete:
            self.state.commit(
                Commit(
                    node,
                    info_hash,
                    held,
                    True,
                    False,
                    0,
                    rates,
                    None,
                    estimate,
                    now,
                    stall,
                    self.max_readers,
                )
            )
            return OriginPlan([], Mode.STRIPE, None, rates=rates)
        peers = rates.down.get("peers", 0.0)
        # What peers deliver. A node that received nothing at all in the last interval
        # (its stripe done, its uploaders gone WIDE or CPU-starved: the s3-fast fleet sat
        # 3 s so) gets nothing from them, whatever the EMA still remembers; a node that
        # reads its stripe meanwhile is judged on the EMA (peers ramp up at the start,
        # and widening then only loads the origin: the mixed fleet's origin sent 6 F).
        stalled = rates.received_now == 0.0
        delivered = 0.0 if stalled else peers
        # The work S3 could take off the swarm: what peers hold for the node; or, for a
        # node with no stripe left before the fleet has an allocation, all it lacks.
        # Every piece is then on its way from the origin (stripes are assigned until
        # none is left), and the stripes were read fast: a same-region S3 gave six
        # 250 Mbit nodes their stripes in a second, and they sat idle for the next
        # one or two while peers connected and nobody had a backlog for them. Where
        # the origin is the bottleneck the stripes last until the allocation is there
        # and governs (below).
        before_allocation = self.capacity.last(info_hash) is None
        lacking = max(backlog, (count - held.bit_count()) * piece_size)
        work = lacking if node not in s3 and before_allocation else backlog
        # Much of the object left before an allocation, while the origin has nothing
        # only it has: the hold (one to two reports) left slow-uploads' origin idle
        # 1.5-2.7 s between its stripes and its first allocation, every node waiting on
        # peers that gave it 2.5 MB/s against S3's 17-30. "Much" is against the most S3
        # gave this node in an interval, if more than the estimate: the estimate is an
        # average of a second or two of reads, and on it CI's origin-bound readers (8 of
        # 16 MiB lacking, read at 6-7 MB/s, an estimate of 2.3) widened at their
        # stripes' end.
        # Not among seeders: they hold every piece, and a late node on a LAN widened at
        # once read 5-10 of 24 pieces from S3 that they sent it too (CI's late-node test
        # failed one run in two).
        # Nor for a node that has read nothing from the origin while others read their
        # stripes (its peers get PEERS_CHANCE_SECONDS, as beside seeders): CI's
        # origin-bound fleet, two of four nodes holding the 16 MiB between their
        # stripes, the other two widened at once and the origin sent 1.6-1.7 F. What
        # `swarm fetch` read while the daemon started is no stripe: counted as one,
        # the nodes without a stripe widened at once again and the origin sent
        # 1.2-2.0 F (CI failed on it).
        among_seeders = self.capacity.has_seeders(info_hash)
        waits_on_peers = (
            before_allocation
            and counters.get("s3", 0) <= s3_early
            and (among_seeders or any(n != node for n in s3))
        )
        eager = (
            before_allocation
            and estimate is not None
            and lacking >= max(estimate, rates.s3_peak) * EAGER_WIDE_SECONDS
            and estimate >= EAGER_UPLOAD_SHARE * rates.up_peak
            and not among_seeders
            and not waits_on_peers
        )
        if eager and node not in s3:
            hold = 0.0
        elif waits_on_peers:
            hold = PEERS_CHANCE_SECONDS
        else:
            hold = HOLD_SECONDS
        state = decide(view.mode or MixState(), delivered, estimate, work, now, hold)
        starved = stalled or 0.0 <= rates.received_now < STARVED_SHARE * rates.down_peak
        if state.mode is Mode.WIDE and not starved and not before_allocation:
            # Once the fleet has an allocation, its direct share is what S3 gives a node
            # besides its stripe: WIDE reads from every node at once take the shared
            # origin from the stripes and from each other (the mixed fleet widened one
            # node after another and its origin sent each piece seven times). A node
            # that receives next to nothing still widens: with its exchange stalled
            # (the mixed fleet once ran as a star for 30 s, every node but one with a
            # single peer: Membership.take) a plan without WIDE took 5x T*.
            state = MixState(Mode.STRIPE)
        elif state.mode is Mode.WIDE and among_seeders and before_allocation and not stalled:
            # Beside seeders, before the first allocation, a node that receives anything
            # keeps to its stripe and fills: the seeders hold every piece and its peers
            # are ramping up. Existing seeders at a quarter of the rates: a node that had
            # read one fill piece widened 2.5 s in on its peers' early rate, for 2.3 s,
            # and the batch it started read 22 MB from the 12.5 Mbit origin that its
            # peers sent too (that run 27.99 s; one without a WIDE node 26.28). Three
            # alternating pairs (session 46): 26.90, 26.67, 27.02 s against 28.11,
            # 28.19, 27.86. A node that receives nothing still widens.
            state = MixState(Mode.STRIPE)
        size = max(self.stripe_bytes, rates.down.get("s3", 0.0) * STRIPE_SECONDS)
        want = min(MAX_STRIPE_PIECES, count, max(1, int(size // piece_size)))
        done = self.state.commit(
            Commit(
                node,
                info_hash,
                held,
                False,
                state.mode is Mode.WIDE,
                want,
                rates,
                state,
                estimate,
                now,
                stall,
                self.max_readers,
                streaming=view.rates is not None
                and counters.get("s3", 0) > view.rates.counters.get("s3", 0),
            )
        )
        fill = may_fill(peers, estimate) and done.spread
        mode, direct, link_bound = state.mode, 0.0, False
        if eager and node in s3 and not done.stripe and mode is Mode.STRIPE:
            # its stripe ended with this report (it read the origin until now): it widens
            # now, as it would at its next report, a second later
            mode = decide(state, delivered, estimate, lacking, now, 0.0).mode
        readers = len(view.reader_s3)
        if self.origin_rate == math.inf:
            # the operator says S3 feeds every node at link speed: nothing to measure
            mode = Mode.ALL
        elif not done.spread:
            # Pieces are still leaving the origin: stripes (distinct pieces, read at full
            # width) are right in every shape but one, and the snapshot needs them (a
            # node's download capacity shows once peers add to its S3 reads). Once it
            # does, an origin that fed every link at once is ALL at the next snapshot,
            # with pieces left to stripe or not: s3-fast at a quarter (stripes of 8 MiB
            # at 2-3 MB/s, S3 and peers sharing each downlink) spread the object only
            # 10 s in and went ALL then; ALL 4.5 s in, 19.78-20.15 s against
            # 19.79-20.63 (five pairs, faster in four). Other plans wait for the spread.
            early = self.capacity.allocation(info_hash, estimate, readers, now, only_all=True)
            if early is not None and early.mode is AllocationMode.ALL:
                mode = Mode.ALL
        else:
            # Every piece has left the origin (or is on its way): from here what S3
            # still gives is the allocation's direct share.
            allocation = self.capacity.allocation(info_hash, estimate, readers, now)
            link_bound = allocation is not None and allocation.link_bound
            if allocation is not None and allocation.mode is AllocationMode.ALL:
                mode = Mode.ALL
            elif allocation is not None and mode is Mode.STRIPE:
                direct = self.capacity.direct_share(info_hash, now)
            if allocation is None or allocation.mode is AllocationMode.STRIPE:
                # Fill reads only where the allocation found S3 capacity beyond the
                # stripes: where the origin is the bottleneck, or before the rates can
                # tell, a fill takes the stripes' bandwidth for a piece peers already
                # hold (CI's origin-bound fleet: 0.3 F of the origin's bytes went so)
                fill = False
            if not done.stripe and self._origin_idles(
                info_hash, node, allocation, s3, delivered, estimate
            ):
                fill = True
        fleet_down = self.capacity.fleet_down(info_hash, now)
        return OriginPlan(done.stripe, mode, estimate, fill, rates, direct, fleet_down, link_bound)

    def _origin_idles(
        self,
        info_hash: str,
        node: str,
        allocation: Allocation | None,
        readers: Iterable[str],
        delivered: float,
        estimate: float | None,
    ) -> bool:
        """Whether the origin idles for want of readers, so that a node with no stripe
        left fills from it (one rare piece a GET):

        - before an allocation, seeders hold the artifact and no other node reads a
          stripe or WIDE (``readers``): the origin has nothing to give that only it has.
          Existing seeders: 9.0-10.7 s against 9.6-12.1 in five alternating pairs. Not
          without seeders: there the stripes of a small object can end before the
          allocation, on an origin that is the bottleneck, and fills would send pieces
          twice. Nor once S3's rate is known and :func:`may_fill` says no (peers deliver
          ``FILL_RATIO`` times what S3 gives a reader):
          CI's late node beside two seeders on loopback read 9 of 24 pieces from S3 one
          GET at a time while the seeders sent all 24;
        - under MIX, the nodes' S3 rates of the moment use under half the origin the
          allocation planned on (:meth:`CapacityBook.origin_spare`): a direct share is
          bytes, read at full width and done, and the mixed fleet's origin then sent
          0 MB/s for 0.8 s and under 35 of 50 for 2 s more while the uploads were the
          bottleneck."""
        if allocation is None:
            # the peers' rate against S3's as for any fill, once S3's rate is known
            peers_slow = estimate is None or may_fill(delivered, estimate)
            return (
                self.capacity.has_seeders(info_hash)
                and all(n == node for n in readers)
                and peers_slow
            )
        return allocation.mode is AllocationMode.MIX and self.capacity.origin_spare(info_hash)

    def prune(self, alive: set[str]) -> None:
        """Forget nodes that stopped reporting: their stripes go back to the pool."""
        gone = self.state.known_nodes() - alive
        self.state.forget(gone)
        self.capacity.forget(gone)

    def forget(self, nodes: Iterable[str]) -> None:
        """Forget these nodes (expired from the fleet)."""
        nodes = list(nodes)
        self.state.forget(nodes)
        self.capacity.forget(nodes)

    def forget_unlisted(self, node: str, listed: Iterable[str]) -> None:
        """Forget ``node``'s part of the artifacts its report no longer lists (dropped or
        deleted under it): the union stops counting its pieces, so they are striped from
        S3 again rather than only reached when a node goes WIDE."""
        listed = set(listed)
        self.state.forget_unlisted(node, listed)
        self.capacity.forget_unlisted(node, listed)

    def mode(self, node: str, info_hash: str) -> str | None:
        """The node's current origin mode for the artifact (None if it is not fetching)."""
        state = self.state.node_mode(node, info_hash)
        return state.mode.value if state else None

    def rates(self, node: str, info_hash: str) -> NodeRates | None:
        return self.state.node_rates(node, info_hash)

    def spare_upload(self, node: str) -> float:
        return self.state.spare_upload(node)

    def availability(self, info_hash: str) -> list[int]:
        """How many reporting nodes hold each piece (for the fleet view)."""
        return self.state.availability(info_hash)
