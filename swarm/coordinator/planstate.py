"""The stripe planner's per-artifact state, behind one seam (:class:`PlanState`).

Work per report is independent of the fleet's size (issue 12): per artifact the state
keeps each piece's availability count and their union, updated from the *change* in a
node's bitfield; the stripes, the readers and their S3 rates are indexed by node; a
reply names at most ``MAX_STRIPE_PIECES`` pieces. Planning is two-phase so that the
state can live in a shared store (Redis, :mod:`swarm.coordinator.redisplan`) behind
several coordinators: :meth:`PlanState.load` reads what the policy needs, the policy
(:class:`swarm.coordinator.origin.StripePlanner`) decides in Python, and
:meth:`PlanState.commit` applies the bitfield change and claims the stripe in one
atomic step. :class:`MemoryPlanState` keeps it in this process.

Bounds (issue 15): an artifact's geometry is fixed by its first report (an info-hash
names its piece size and count, so a report that disagrees is refused); the state is
capped at ``MAX_ARTIFACTS`` artifacts and ``STATE_BUDGET`` bytes of bitfields and
counts. Past the cap a report gets no plan: the node decides alone, as it does when the
coordinator is down.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from swarm.coordinator.rates import NodeRates, spare_upload
from swarm.policy import MixState

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


def drop_artifacts(
    by_node: dict[str, set[str]],
    node: str,
    keep: Iterable[str],
    drop: Callable[[str, str], None],
) -> None:
    """Drop ``node``'s artifacts but those in ``keep`` (all of them for a node that left)
    through ``drop(node, info_hash)``; the node leaves ``by_node`` once it has none. The
    in-memory stores' one way to forget (this plan state, the capacity book)."""
    mine = by_node.get(node)
    if mine is None:
        return
    for info_hash in mine.difference(keep):
        mine.discard(info_hash)
        drop(node, info_hash)
    if not mine:
        del by_node[node]


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
    streaming: bool = False
    """The node's S3 bytes grew since its last report: a stripe it holds is being read,
    whether or not a piece of it finished (see :data:`~swarm.coordinator.origin.
    STALL_SECONDS`)."""


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
    def forget_unlisted(self, node: str, listed: Iterable[str]) -> None:
        """Drop ``node``'s part of every artifact it no longer lists (its data went away
        under it), as :meth:`forget` drops a departed node's: else the union keeps its
        pieces and nobody is striped to read them from S3 until the node expires."""

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
        if node in art.reader_s3:  # first, and once (the planner counts the readers)
            sample = ((node, art.reader_s3[node]), *(r for r in sample if r[0] != node))
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
        stripe = art.stripes.get(node, ())
        if len(stripe) < art.stripe_len.get(node, 0) or (stripe and change.streaming):
            art.progress_at[node] = now  # pieces of its stripe arrived, or S3's bytes flow
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
            drop_artifacts(self._by_node, node, (), self._forget_artifact)

    def forget_unlisted(self, node: str, listed: Iterable[str]) -> None:
        drop_artifacts(self._by_node, node, listed, self._forget_artifact)

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

    def _forget_artifact(self, node: str, info_hash: str) -> None:
        """Drop ``node``'s bitfield, stripe and records for one artifact (the caller has
        taken ``info_hash`` out of ``_by_node[node]``)."""
        art = self._artifacts.get(info_hash)
        if art is None:
            return
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
