"""Origin coordination: per-node rates, and which node reads which pieces from S3.

Pure state machines fed by node reports with ``now`` passed in (no clock, no I/O), kept
apart from :mod:`swarm.coordinator.fleet` (the tracker's peer store) because they are
the coordinator's *decisions*, while the peer store is its *memory*.

``RateBook``: EMAs of each node's per-source download rate and upload rate, from the
cumulative byte counters in its reports (rates computed here, not trusted from nodes).

``StripePlanner``: each piece should leave S3 about once while the swarm spreads it.
A node reading the origin is handed a *stripe*: up to ``stripe_bytes`` (or
``STRIPE_SECONDS`` of its S3 rate, if more) of pieces that
no node holds and no other node is reading, lowest index first (every such piece has
availability zero, so "rarest first" is a tie broken by position, which keeps a stripe
contiguous and its ranged GETs large). Pieces held by anyone leave the stripes; a node
whose stripe made no progress for ``stall_seconds``, or that stopped reporting, loses
it, and the pieces go to the next node that asks. At most ``max_readers`` nodes read
the origin at once (the S3 request budget).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Final

from swarm.policy import MixState, Mode, decide, ema, may_fill, rate, s3_capacity

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

DEFAULT_MAX_READERS: Final = 16
"""Nodes reading the origin at once. 16 x 2 ranges in flight stays far below S3's
per-prefix limit (5,500 GET/s) and leaves most of a fleet to the swarm."""


def bits(blob: bytes, count: int) -> int:
    """A BitTorrent-order bitfield (piece 0 = high bit of byte 0) as an int, bit i = piece i."""
    value = int.from_bytes(blob, "big") if blob else 0
    excess = len(blob) * 8 - count
    value = value >> excess if excess > 0 else value << -excess
    # reverse so that bit i is piece i: piece 0 is the highest of ``count`` bits
    return int(format(value, f"0{count}b")[::-1], 2) if count else 0


@dataclass
class NodeRates:
    """One node's rate averages (bytes/s) for one artifact."""

    at: float
    counters: dict[str, int]
    down: dict[str, float] = field(default_factory=dict)
    up: float = 0.0
    up_peak: float = 0.0


class RateBook:
    """EMAs per (node, artifact) and source, from cumulative counters."""

    def __init__(self) -> None:
        self._rates: dict[tuple[str, str], NodeRates] = {}

    def update(
        self, node: str, info_hash: str, counters: dict[str, int], up_rate: float, now: float
    ) -> NodeRates:
        key = (node, info_hash)
        previous = self._rates.get(key)
        if previous is None:
            entry = NodeRates(now, dict(counters), {s: 0.0 for s in counters}, up_rate, up_rate)
            self._rates[key] = entry
            return entry
        dt = now - previous.at
        for source, total in counters.items():
            sample = rate(previous.counters.get(source, 0), total, dt)
            previous.down[source] = ema(previous.down.get(source), sample, dt)
        previous.up = ema(previous.up, up_rate, dt)
        previous.up_peak = max(previous.up_peak, previous.up)
        previous.counters = dict(counters)
        previous.at = max(previous.at, now)
        return previous

    def get(self, node: str, info_hash: str) -> NodeRates | None:
        return self._rates.get((node, info_hash))

    def s3_per_reader(self, info_hash: str, readers: set[str]) -> float | None:
        """Median S3 rate of the nodes reading this artifact's origin now (None if none)."""
        values = [
            r.down.get("s3", 0.0)
            for (node, ih), r in self._rates.items()
            if ih == info_hash and node in readers and r.down.get("s3", 0.0) > 0
        ]
        return statistics.median(values) if values else None

    def spare_upload(self, node: str) -> float:
        """Upload headroom seen for ``node``: its peak upload EMA minus its current one."""
        entries = [r for (n, _), r in self._rates.items() if n == node]
        if not entries:
            return 0.0
        return max(0.0, max(r.up_peak for r in entries) - sum(r.up for r in entries))

    def forget(self, alive: set[str]) -> None:
        for key in [k for k in self._rates if k[0] not in alive]:
            del self._rates[key]


@dataclass
class _Artifact:
    count: int
    held: dict[str, int] = field(default_factory=dict)
    assigned: dict[int, str] = field(default_factory=dict)
    progress_at: dict[str, float] = field(default_factory=dict)
    modes: dict[str, MixState] = field(default_factory=dict)
    wide_readers: set[str] = field(default_factory=set)
    s3_estimate: float | None = None
    """What S3 gives one reader (:func:`swarm.policy.s3_capacity`): kept, slowly decaying,
    when nobody reads the origin any more (every piece is held somewhere), which is
    exactly when a slow swarm should widen to S3."""
    estimated_at: float | None = None

    def held_any(self) -> int:
        union = 0
        for value in self.held.values():
            union |= value
        return union

    def readers(self) -> set[str]:
        return set(self.assigned.values()) | self.wide_readers


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

    def to_json(self) -> dict[str, object]:
        return {
            "stripe": self.stripe,
            "mode": self.mode.value,
            "s3_estimate": self.s3_estimate,
            "fill": self.fill,
        }


class StripePlanner:
    """Stripes of origin pieces per node and artifact, plus each node's source mode."""

    def __init__(
        self,
        stripe_bytes: int = STRIPE_BYTES,
        stall_seconds: float = STALL_SECONDS,
        max_readers: int = DEFAULT_MAX_READERS,
    ) -> None:
        if stripe_bytes <= 0 or stall_seconds <= 0 or max_readers <= 0:
            raise ValueError(
                f"stripe_bytes, stall_seconds and max_readers must be positive, got "
                f"{stripe_bytes}, {stall_seconds}, {max_readers}"
            )
        self.stripe_bytes = stripe_bytes
        self.stall_seconds = stall_seconds
        self.max_readers = max_readers
        self.rates = RateBook()
        self._artifacts: dict[str, _Artifact] = {}

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
    ) -> OriginPlan:
        """Record ``node``'s report for one artifact; return its stripe and mode."""
        art = self._artifacts.get(info_hash)
        if art is None or art.count != count:
            art = self._artifacts[info_hash] = _Artifact(count)
        art.held[node] = held
        rates = self.rates.update(node, info_hash, counters, up_rate, now)
        union = art.held_any()
        readers_before = art.readers()  # includes a node whose last stripe just finished
        before = sum(1 for n in art.assigned.values() if n == node)
        for piece in [p for p in art.assigned if union >> p & 1]:
            del art.assigned[piece]
        if sum(1 for n in art.assigned.values() if n == node) < before:
            art.progress_at[node] = now
        self._release_stalled(art, now)
        if complete:
            self._release(art, node)
            art.wide_readers.discard(node)
            art.modes.pop(node, None)
            return OriginPlan([], Mode.STRIPE, None)

        current = self.rates.s3_per_reader(info_hash, readers_before | art.readers())
        dt = now - art.estimated_at if art.estimated_at is not None else 0.0
        art.s3_estimate = s3_capacity(art.s3_estimate, current, dt)
        art.estimated_at = now
        estimate = art.s3_estimate
        backlog = (union & ~held).bit_count() * piece_size
        state = decide(
            art.modes.get(node, MixState()), rates.down.get("peers", 0.0), estimate, backlog, now
        )
        art.modes[node] = state
        if state.mode is Mode.WIDE:
            art.wide_readers.add(node)
        else:
            art.wide_readers.discard(node)

        fill = may_fill(rates.down.get("peers", 0.0), estimate)
        mine = [p for p, n in art.assigned.items() if n == node]
        if not mine and node not in art.readers() and len(art.readers()) >= self.max_readers:
            return OriginPlan([], state.mode, estimate, fill and self._spread(art, union))
        size = max(self.stripe_bytes, rates.down.get("s3", 0.0) * STRIPE_SECONDS)
        want = max(1, int(size // piece_size)) - len(mine)
        if want > 0:
            for piece in range(count):
                if want == 0:
                    break
                if not union >> piece & 1 and piece not in art.assigned:
                    art.assigned[piece] = node
                    mine.append(piece)
                    want -= 1
            if node not in art.progress_at or not before:
                art.progress_at[node] = now
        return OriginPlan(sorted(mine), state.mode, estimate, fill and self._spread(art, union))

    def prune(self, alive: set[str]) -> None:
        """Forget nodes that stopped reporting: their stripes go back to the pool."""
        for art in self._artifacts.values():
            for node in [n for n in art.held if n not in alive]:
                del art.held[node]
                self._release(art, node)
                art.modes.pop(node, None)
                art.wide_readers.discard(node)
        self.rates.forget(alive)

    @staticmethod
    def _spread(art: _Artifact, union: int) -> bool:
        """No piece is left to stripe: each is held somewhere or being read by a node."""
        return all(union >> p & 1 or p in art.assigned for p in range(art.count))

    def _release(self, art: _Artifact, node: str) -> None:
        for piece in [p for p, n in art.assigned.items() if n == node]:
            del art.assigned[piece]
        art.progress_at.pop(node, None)

    def _release_stalled(self, art: _Artifact, now: float) -> None:
        for node in {n for n in art.assigned.values()}:
            if now - art.progress_at.get(node, now) > self.stall_seconds:
                self._release(art, node)

    def mode(self, node: str, info_hash: str) -> str | None:
        """The node's current origin mode for the artifact (None if it is not fetching)."""
        art = self._artifacts.get(info_hash)
        state = art.modes.get(node) if art else None
        return state.mode.value if state else None

    def availability(self, info_hash: str) -> list[int]:
        """How many reporting nodes hold each piece (for the fleet view)."""
        art = self._artifacts.get(info_hash)
        if art is None:
            return []
        return [sum(v >> p & 1 for v in art.held.values()) for p in range(art.count)]
