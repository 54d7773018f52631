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

Work per report is independent of the fleet's size (issue 12): per artifact the state
keeps each piece's availability count and their union, updated from the *change* in a
node's bitfield; the stripes, the readers and their S3 rates are indexed by node; a
reply names at most ``MAX_STRIPE_PIECES`` pieces. Planning is two-phase so that the
state can live in a shared store (Redis) behind several coordinators: :meth:`PlanState.load`
reads what the policy needs, the policy decides in Python, and :meth:`PlanState.commit`
applies the bitfield change and claims the stripe in one atomic step.

Bounds (issue 15): an artifact's geometry is fixed by its first report (an info-hash
names its piece size and count, so a report that disagrees is refused); the state is
capped at ``MAX_ARTIFACTS`` artifacts and ``STATE_BUDGET`` bytes of bitfields and
counts. Past the cap a report gets no plan: the node decides alone, as it does when the
coordinator is down.
"""

from __future__ import annotations

import itertools
import math
import statistics
from abc import ABC, abstractmethod
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from swarm.coordinator.allocate import Mode as AllocationMode
from swarm.coordinator.capacity import CapacityBook
from swarm.coordinator.rates import STARVED_SHARE, NodeRates, spare_upload, update_rates
from swarm.policy import MixState, Mode, decide, may_fill, s3_capacity

STRIPE_BYTES: Final = 8 << 20
"""Origin work outstanding per node before its rate is known: two 4 MiB GETs. Small, so
that the first nodes of a scale-out do not take the whole object between them (16 MiB
stripes gave a 64 MiB artifact to 4 of 8 nodes, each reading it with one GET);
``STRIPE_SECONDS`` grows it for fast readers."""

STRIPE_SECONDS: Final = 2.0
"""A fast reader's stripe holds at least this many seconds of its S3 rate, so it keeps
several ranges in flight instead of waiting on reports."""

STALL_SECONDS: Final = 6.0
"""A stripe with no finished piece for this long is handed to others (a stuck GET
retries for longer than this only when S3 is failing anyway)."""

STALL_INTERVALS: Final = 2.0
"""...or for this many report intervals, if longer: at a 5 s interval the coordinator
sees a stripe's progress only every 5 s, and a working reader must not lose it."""

DEFAULT_MAX_READERS: Final = 16
"""Nodes reading the origin at once. 16 x 2 ranges in flight stays far below S3's
per-prefix limit (5,500 GET/s) and leaves most of a fleet to the swarm."""

MAX_STRIPE_PIECES: Final = 1024
"""Most pieces one stripe (one reply) names: about 6 KB of JSON. 1,024 pieces of 1 MiB
is 4 s of a 2 Gbit/s S3 reader; a faster reader asks again when it is done."""

MAX_ARTIFACTS: Final = 1024
"""Artifacts planned at once; a report for another one gets no plan (the node decides
alone) until one expires."""

STATE_BUDGET: Final = 64 << 20
"""Bytes of piece state (bitfields and availability counts) the planner keeps; past it,
new (node, artifact) pairs get no plan. 5,000 nodes on a 2,048-piece artifact take
1.3 MB."""

ESTIMATE_SAMPLE: Final = 64
"""Readers whose S3 rates the per-reader estimate is the median of (any 64 of them)."""

_COUNT_BYTES: Final = 4
"""Bytes per piece of an artifact's availability counts (``array('I')``)."""


def bits(blob: bytes, count: int) -> int:
    """A BitTorrent-order bitfield (piece 0 = high bit of byte 0) as an int, bit i = piece i."""
    value = int.from_bytes(blob, "big") if blob else 0
    excess = len(blob) * 8 - count
    value = value >> excess if excess > 0 else value << -excess
    # reverse so that bit i is piece i: piece 0 is the highest of ``count`` bits
    return int(format(value, f"0{count}b")[::-1], 2) if count else 0


_BYTE_BITS: Final = tuple(tuple(i for i in range(8) if byte >> i & 1) for byte in range(256))


def set_bits(value: int) -> list[int]:
    """Indices of the set bits of ``value``, ascending. A few bits: peeled one at a time;
    more: a byte at a time through a table (a report that brings a hundred pieces
    costs microseconds, not a pass over every piece)."""
    if value.bit_count() <= 16:
        out = []
        while value:
            low = value & -value
            out.append(low.bit_length() - 1)
            value ^= low
        return out
    data = value.to_bytes((value.bit_length() + 7) // 8, "little")
    out = []
    for index, byte in enumerate(data):
        if byte:
            base = index * 8
            for bit in _BYTE_BITS[byte]:
                out.append(base + bit)
    return out


def lowest_bits(value: int, limit: int) -> list[int]:
    """Up to ``limit`` lowest set bits of ``value``, ascending."""
    out: list[int] = []
    while value and len(out) < limit:
        low = value & -value
        out.append(low.bit_length() - 1)
        value ^= low
    return out


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

    def to_json(self) -> dict[str, object]:
        return {
            "stripe": self.stripe,
            "mode": self.mode.value,
            "s3_estimate": self.s3_estimate,
            "fill": self.fill,
            "direct": self.direct,
        }


# -- the state seam ------------------------------------------------------------------------


class GeometryError(ValueError):
    """A report's piece size or count disagrees with what this artifact is known as."""


@dataclass(frozen=True)
class ArtifactView:
    """What planning one report needs, read before deciding (:meth:`PlanState.load`)."""

    union: int
    """Pieces held by any node (bit i = piece i)."""
    estimate: float | None
    estimated_at: float | None
    reader_s3: tuple[tuple[str, float], ...]
    """(node, S3 rate EMA) of up to ``ESTIMATE_SAMPLE`` nodes reading the origin now,
    this node first if it is one."""
    rates: NodeRates | None
    """This node's rates for the artifact, as of its previous report."""
    mode: MixState | None


@dataclass(frozen=True)
class Commit:
    """The decided part of one report, applied atomically (:meth:`PlanState.commit`)."""

    node: str
    info_hash: str
    held: int
    complete: bool
    wide: bool
    want: int
    """Pieces the node's stripe should hold (already capped by ``MAX_STRIPE_PIECES``)."""
    rates: NodeRates
    mode: MixState | None
    estimate: float | None
    now: float
    stall_seconds: float
    max_readers: int


@dataclass(frozen=True)
class Committed:
    stripe: list[int]
    spread: bool
    """Every piece is held somewhere or in someone's stripe: none is left to stripe."""


class PlanState(ABC):
    """Where the planner's per-artifact state lives: in this process, or in Redis."""

    @abstractmethod
    def check(self, info_hash: str, piece_size: int, count: int) -> None:
        """Raise :class:`GeometryError` if the artifact is known with another geometry."""

    @abstractmethod
    def load(self, node: str, info_hash: str, piece_size: int, count: int) -> ArtifactView | None:
        """The view for planning, or None when the artifact or this node's part of it
        cannot be taken on (past ``MAX_ARTIFACTS`` or ``STATE_BUDGET``)."""

    @abstractmethod
    def commit(self, change: Commit) -> Committed:
        """Atomically: replace the node's bitfield (updating availability and the union),
        drop newly held pieces from every stripe, note the node's stripe progress,
        release stalled stripes, then top up the node's stripe to ``want`` pieces with
        the lowest pieces nobody holds or reads (unless ``max_readers`` others read)."""

    @abstractmethod
    def forget(self, nodes: Iterable[str]) -> None:
        """Drop departed nodes: their bitfields leave the counts, their stripes the pool."""

    @abstractmethod
    def known_nodes(self) -> set[str]: ...

    @abstractmethod
    def availability(self, info_hash: str) -> list[int]: ...

    @abstractmethod
    def node_rates(self, node: str, info_hash: str) -> NodeRates | None: ...

    @abstractmethod
    def node_mode(self, node: str, info_hash: str) -> MixState | None: ...

    @abstractmethod
    def spare_upload(self, node: str) -> float: ...


# -- in memory -----------------------------------------------------------------------------


@dataclass
class _Artifact:
    piece_size: int
    count: int
    full: int
    avail: array  # type: ignore[type-arg]
    union: int = 0
    held: dict[str, int] = field(default_factory=dict)
    owner: dict[int, str] = field(default_factory=dict)
    stripes: dict[str, set[int]] = field(default_factory=dict)
    assigned: int = 0
    progress_at: dict[str, float] = field(default_factory=dict)
    stripe_len: dict[str, int] = field(default_factory=dict)
    wide: set[str] = field(default_factory=set)
    reader_s3: dict[str, float] = field(default_factory=dict)
    rates: dict[str, NodeRates] = field(default_factory=dict)
    modes: dict[str, MixState] = field(default_factory=dict)
    estimate: float | None = None
    """What S3 gives one reader (:func:`swarm.policy.s3_capacity`): kept, slowly decaying,
    when nobody reads the origin any more (every piece is held somewhere), which is
    exactly when a slow swarm should widen to S3."""
    estimated_at: float | None = None

    @property
    def cost(self) -> int:
        return self.count * _COUNT_BYTES

    @property
    def entry_cost(self) -> int:
        return (self.count + 7) // 8 + 64


class MemoryPlanState(PlanState):
    def __init__(self, max_artifacts: int = MAX_ARTIFACTS, budget: int = STATE_BUDGET) -> None:
        self.max_artifacts = max_artifacts
        self.budget = budget
        self.used = 0
        self._artifacts: dict[str, _Artifact] = {}
        self._by_node: dict[str, set[str]] = {}

    def check(self, info_hash: str, piece_size: int, count: int) -> None:
        art = self._artifacts.get(info_hash)
        if art is not None and (art.piece_size, art.count) != (piece_size, count):
            raise GeometryError(
                f"artifact {info_hash} has {art.count} pieces of {art.piece_size} bytes "
                f"here, not {count} of {piece_size}"
            )

    def load(self, node: str, info_hash: str, piece_size: int, count: int) -> ArtifactView | None:
        art = self._artifacts.get(info_hash)
        if art is None:
            cost = count * _COUNT_BYTES + (count + 7) // 8 + 64
            if len(self._artifacts) >= self.max_artifacts or self.used + cost > self.budget:
                return None
            art = _Artifact(piece_size, count, (1 << count) - 1, array("I", bytes(4 * count)))
            self._artifacts[info_hash] = art
            self.used += art.cost
        elif node not in art.held and self.used + art.entry_cost > self.budget:
            return None
        sample = tuple(itertools.islice(art.reader_s3.items(), ESTIMATE_SAMPLE))
        if node in art.reader_s3:
            sample = ((node, art.reader_s3[node]), *sample)
        return ArtifactView(
            art.union,
            art.estimate,
            art.estimated_at,
            sample,
            art.rates.get(node),
            art.modes.get(node),
        )

    def commit(self, change: Commit) -> Committed:
        art = self._artifacts[change.info_hash]
        node, now = change.node, change.now
        if node not in art.held:
            self.used += art.entry_cost
            self._by_node.setdefault(node, set()).add(change.info_hash)
        old = art.held.get(node, 0)
        new = change.held & art.full
        art.held[node] = new
        gained = new & ~old
        if new != old:
            self._count(art, gained, 1)
            self._count(art, old & ~new, -1)
        for piece in set_bits(gained & art.assigned):
            self._unassign(art, piece)
        if len(art.stripes.get(node, ())) < art.stripe_len.get(node, 0):
            art.progress_at[node] = now  # pieces of its stripe arrived (here or anywhere)
        self._release_stalled(art, now, change.stall_seconds)
        art.rates[node] = change.rates
        if change.estimate is not None or art.estimate is not None:
            art.estimate, art.estimated_at = change.estimate, now
        if change.complete:
            self._release(art, node)
            art.wide.discard(node)
            art.reader_s3.pop(node, None)
            art.modes.pop(node, None)
            art.stripe_len.pop(node, None)
            return Committed([], self._spread(art))
        if change.mode is not None:
            art.modes[node] = change.mode
        if change.wide:
            art.wide.add(node)
        else:
            art.wide.discard(node)
        mine = art.stripes.get(node) or set()
        readers = len(art.wide) + sum(1 for n in art.stripes if n not in art.wide)
        reading = bool(mine) or node in art.wide
        if reading or readers < change.max_readers:
            want = change.want - len(mine)
            if want > 0:
                free = art.full & ~art.union & ~art.assigned
                claimed = lowest_bits(free, want)
                if claimed:
                    if node not in art.progress_at or not mine:
                        art.progress_at[node] = now
                    mine = art.stripes.setdefault(node, mine)
                    for piece in claimed:
                        art.owner[piece] = node
                        mine.add(piece)
                        art.assigned |= 1 << piece
        art.stripe_len[node] = len(mine)
        if mine or node in art.wide:
            art.reader_s3[node] = change.rates.down.get("s3", 0.0)
        else:
            art.reader_s3.pop(node, None)
        return Committed(sorted(mine), self._spread(art))

    def forget(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            for info_hash in self._by_node.pop(node, ()):
                art = self._artifacts.get(info_hash)
                if art is None:
                    continue
                old = art.held.pop(node, 0)
                self.used -= art.entry_cost
                self._count(art, old, -1)
                self._release(art, node)
                for table in (art.progress_at, art.stripe_len, art.reader_s3):
                    table.pop(node, None)
                art.rates.pop(node, None)
                art.modes.pop(node, None)
                art.wide.discard(node)
                if not art.held:
                    del self._artifacts[info_hash]
                    self.used -= art.cost

    def known_nodes(self) -> set[str]:
        return set(self._by_node)

    def availability(self, info_hash: str) -> list[int]:
        art = self._artifacts.get(info_hash)
        return list(art.avail) if art else []

    def node_rates(self, node: str, info_hash: str) -> NodeRates | None:
        art = self._artifacts.get(info_hash)
        return art.rates.get(node) if art else None

    def node_mode(self, node: str, info_hash: str) -> MixState | None:
        art = self._artifacts.get(info_hash)
        return art.modes.get(node) if art else None

    def spare_upload(self, node: str) -> float:
        rates = (self.node_rates(node, ih) for ih in self._by_node.get(node, ()))
        return spare_upload(r for r in rates if r is not None)

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _count(art: _Artifact, pieces: int, delta: int) -> None:
        if not pieces:
            return
        flipped = 0
        avail = art.avail
        for piece in set_bits(pieces):
            value = avail[piece] + delta
            avail[piece] = value
            if value == (1 if delta > 0 else 0):
                flipped |= 1 << piece
        art.union = art.union | flipped if delta > 0 else art.union & ~flipped

    @staticmethod
    def _unassign(art: _Artifact, piece: int) -> None:
        owner = art.owner.pop(piece, None)
        art.assigned &= ~(1 << piece)
        if owner is not None:
            stripe = art.stripes.get(owner)
            if stripe is not None:
                stripe.discard(piece)
                if not stripe:
                    del art.stripes[owner]

    def _release(self, art: _Artifact, node: str) -> None:
        for piece in art.stripes.pop(node, ()):
            art.owner.pop(piece, None)
            art.assigned &= ~(1 << piece)
        art.progress_at.pop(node, None)

    def _release_stalled(self, art: _Artifact, now: float, stall: float) -> None:
        for node in [n for n in art.stripes if now - art.progress_at.get(n, now) > stall]:
            self._release(art, node)
            if node not in art.wide:
                art.reader_s3.pop(node, None)

    @staticmethod
    def _spread(art: _Artifact) -> bool:
        return (art.union | art.assigned) == art.full


# -- the planner ---------------------------------------------------------------------------


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
    ) -> OriginPlan:
        """Record ``node``'s report for one artifact; return its stripe and mode.
        ``interval``: the report interval the node was told (stalls scale with it);
        ``uploaded``: the node's upload counter, if it sends one; ``node_at``: the
        node's clock when it read its counters, if it sends one; ``s3_busy``: the
        seconds its S3 reader has spent reading, if it sends them."""
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
            peers=rates.down.get("peers", 0.0),
            complete=complete,
            backlog=backlog,
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
        estimate = s3_capacity(view.estimate, current, dt)
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
        work = backlog
        if node not in s3 and self.capacity.last(info_hash) is None:
            work = max(backlog, (count - held.bit_count()) * piece_size)
        state = decide(view.mode or MixState(), delivered, estimate, work, now)
        starved = stalled or 0.0 <= rates.received_now < STARVED_SHARE * rates.down_peak
        if state.mode is Mode.WIDE and not starved and self.capacity.last(info_hash) is not None:
            # Once the fleet has an allocation, its direct share is what S3 gives a node
            # besides its stripe: WIDE reads from every node at once take the shared
            # origin from the stripes and from each other (the mixed fleet widened one
            # node after another and its origin sent each piece seven times). A node
            # that receives next to nothing still widens: with its exchange stalled
            # (the mixed fleet once ran as a star for 30 s, every node but one with a
            # single peer: Daemon.take_members) a plan without WIDE took 5x T*.
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
            )
        )
        fill = may_fill(peers, estimate) and done.spread
        mode, direct = state.mode, 0.0
        if self.origin_rate == math.inf:
            # the operator says S3 feeds every node at link speed: nothing to measure
            mode = Mode.ALL
        elif done.spread:
            # Every piece has left the origin (or is on its way): from here what S3
            # still gives is the allocation's direct share. Before, stripes are right in
            # every shape (distinct pieces, read at full width), and the snapshot needs
            # them: a node's download capacity shows once peers add to its S3 reads.
            readers = len(view.reader_s3)
            allocation = self.capacity.allocation(info_hash, estimate, readers, now)
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
        return OriginPlan(done.stripe, mode, estimate, fill, rates, direct)

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
