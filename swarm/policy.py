"""Source-mix decisions from rate samples. Pure: no I/O, no clock, no RNG.

The coordinator runs these for every node on every report; a node whose coordinator is
unreachable runs the same functions on its own samples, so a fetch still completes and
still moves to S3 when its swarm is slow.

Modes of a node's origin (S3) reads:

- ``STRIPE``: read only the pieces striped to this node (pieces nobody holds yet), so
  each piece leaves S3 about once and the swarm spreads it. The default.
- ``WIDE``: read every missing piece from S3, because the swarm delivers to this node
  markedly slower than S3 would (slow peer uploads).

Between the two, once every piece has left the origin, a STRIPE node may *fill*: read
one rare piece at a time from S3 next to its peers (:func:`may_fill`), so that an idle
origin helps a swarm that does not fill the node's link.

A slow swarm rate alone does not widen: when the swarm holds little that this node lacks
(at the start, or when the origin is the bottleneck and pieces leave S3 no faster than
the swarm spreads them), reading more from S3 would only duplicate other nodes' stripes
and slow everyone's. So widening also needs a *backlog*: bytes that peers hold and this
node misses, at least what S3 would deliver in ``HOLD_SECONDS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

EMA_TAU = 3.0
"""Time constant of the rate averages, seconds. A sample taken ``dt`` after the previous
one weighs ``alpha = 1 - exp(-dt / EMA_TAU)`` (dt = 1 s -> 0.28): about three reports
to follow a real change, while one slow second (a GC pause, a busy disk) moves the
average by under a third."""

WIDEN_RATIO = 0.5
"""Widen when the swarm delivers less than this fraction of what S3 would."""

NARROW_RATIO = 1.0
"""Narrow back once the swarm delivers more than S3 would (the gap between the two
ratios is the hysteresis band: a node between them keeps its mode)."""

HOLD_SECONDS = 1.0
"""A condition must hold this long before the mode changes (hysteresis in time): over
two consecutive reports (1 s apart), so one odd sample never switches, while a fetch of
a few seconds still benefits. The EMA (``EMA_TAU``) already smooths each input."""

FILL_RATIO = 2.0
"""Once every piece has left the origin, a node may add one S3 GET at a time to its peer
downloads (*fill*, see :func:`may_fill`) while its swarm rate is below this multiple of
what one S3 reader gets. Where S3 is far slower (the origin is the bottleneck: 8 readers
share 100 Mbit while peers give 200), one more flow only takes origin bandwidth from the
last stripes."""

MIN_S3_ESTIMATE = 64 * 1024
"""Below this many bytes/s, an S3 estimate is noise (a node that has read one range);
no widening is decided on it."""


def ema(previous: float | None, sample: float, dt: float, tau: float = EMA_TAU) -> float:
    """Exponential moving average of a rate with irregular sampling.

    Edge cases: the first sample (``previous`` None) is taken as is; ``dt <= 0`` (two
    samples at once, a clock step back) leaves ``previous`` unchanged.
    """
    if previous is None:
        return sample
    if dt <= 0:
        return previous
    alpha = 1.0 - math.exp(-dt / tau)
    return previous + alpha * (sample - previous)


def rate(previous_bytes: int, current_bytes: int, dt: float) -> float:
    """Bytes per second between two cumulative counters; 0 for dt <= 0 or a counter reset."""
    if dt <= 0 or current_bytes < previous_bytes:
        return 0.0
    return (current_bytes - previous_bytes) / dt


S3_ESTIMATE_HALF_LIFE = 10.0
"""Seconds in which a remembered per-reader S3 rate loses half its weight against a lower
current one (:func:`s3_capacity`)."""


def s3_capacity(previous: float | None, current: float | None, dt: float) -> float | None:
    """What S3 can give one reader: the current per-reader rate, or the earlier estimate
    decayed (half every ``S3_ESTIMATE_HALF_LIFE`` s) if that is higher. Readers slow down
    near the end of a fetch for lack of pieces, not of S3 capacity; taking their rate as
    is narrowed WIDE nodes at 90% and left the last tenth to slow peers."""
    if previous is None:
        return current
    decayed = previous * 0.5 ** (max(dt, 0.0) / S3_ESTIMATE_HALF_LIFE)
    return decayed if current is None else max(current, decayed)


def may_fill(peers_rate: float, s3_estimate: float | None) -> bool:
    """Whether a node whose stripes are done should also read rare pieces from S3, one
    GET at a time: S3 delivers a useful share next to its peers (``FILL_RATIO``)."""
    if s3_estimate is None or s3_estimate < MIN_S3_ESTIMATE:
        return False
    return peers_rate < FILL_RATIO * s3_estimate


class Mode(StrEnum):
    STRIPE = "stripe"
    WIDE = "wide"
    ALL = "all"
    """Every missing piece from S3 at full width: set by the coordinator's allocation
    (:mod:`swarm.coordinator.allocate`) when S3 feeds every node at link speed, never
    by :func:`decide`."""


@dataclass(frozen=True)
class MixState:
    """A node's mode for one artifact and, if a switch is pending, since when."""

    mode: Mode = Mode.STRIPE
    pending_since: float | None = None


def decide(
    state: MixState,
    peers_rate: float,
    s3_estimate: float | None,
    backlog: int,
    now: float,
    hold: float = HOLD_SECONDS,
) -> MixState:
    """Next mode from the node's swarm rate and what S3 would give it (both bytes/s).

    ``s3_estimate`` is the fleet's current per-reader S3 throughput (or the node's own,
    without a coordinator); None or below ``MIN_S3_ESTIMATE`` means unknown: keep the
    mode. ``backlog``: bytes that peers hold and this node misses. Widen when
    ``peers_rate < WIDEN_RATIO * s3_estimate`` and ``backlog >= s3_estimate *
    HOLD_SECONDS``; narrow when ``peers_rate > NARROW_RATIO * s3_estimate`` or the backlog
    is gone. A switch happens only after its condition held for ``hold`` seconds
    (:data:`HOLD_SECONDS`; 0: at once).

    Known limit: in WIDE mode S3 takes pieces the swarm would have sent, so the swarm
    rate falls and WIDE tends to stay; that errs on the side of finishing sooner.
    """
    if s3_estimate is None or s3_estimate < MIN_S3_ESTIMATE:
        return MixState(state.mode)
    swarm_holds_work = backlog >= s3_estimate * HOLD_SECONDS
    if state.mode is Mode.STRIPE:
        slow = peers_rate < WIDEN_RATIO * s3_estimate
        wanted = Mode.WIDE if slow and swarm_holds_work else Mode.STRIPE
    else:
        fast = peers_rate > NARROW_RATIO * s3_estimate
        wanted = Mode.STRIPE if fast or backlog == 0 else Mode.WIDE
    if wanted is state.mode:
        return MixState(state.mode)
    if hold <= 0:
        return MixState(wanted)
    if state.pending_since is None:
        return MixState(state.mode, now)
    if now - state.pending_since >= hold:
        return MixState(wanted)
    return state
