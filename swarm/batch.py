"""Which pieces a node's S3 reader takes next, under a coordinator plan (pure).

The reader (:mod:`swarm.agent.origin`) asks this after every batch, so pieces that
arrive from peers meanwhile are not read twice. Without a fresh plan the node's own
:class:`~swarm.agent.hybrid.LocalOriginPolicy` decides instead.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

from swarm.agent.hybrid import fill_pieces, wide_pieces
from swarm.messages import OriginPlan
from swarm.policy import Mode

FILL_PIECES = 1
"""Pieces per *fill* read (see :func:`swarm.agent.hybrid.fill_pieces`): one more TCP
flow on a node's downlink, which takes the slack when the swarm is slower."""

TAIL_FILL_PIECES = 8
"""A node that lacks at most this many pieces fills them all in one batch, a GET per
piece, all at once: the fetch's tail. A fill means the origin has room (the coordinator
says so), and one piece at a time left it idle while the fleet's last nodes waited on
peers: slow uploads at full rates, the origin sent 36-66 MB/s of its 125 from 9.1 s
while a node read its last 9 pieces one by one until 10.8 s (6.4 pieces/s on a 50 MB/s
downlink), its peers' uplinks at 2.5 MB/s."""


class BatchKind(StrEnum):
    ALL = "all"
    """S3 is the only source: every missing piece, in wide ranges."""
    STRIPE = "stripe"
    """The node's share of the origin: pieces nobody holds or reads yet."""
    WIDE = "wide"
    """The swarm is too slow: the stripe, then everything else missing."""
    FILL = "fill"
    """Every piece has left the origin: one rare piece, to fill an idle link."""


@dataclass(frozen=True)
class Batch:
    kind: BatchKind
    pieces: list[int]
    direct: int = 0
    """How many of ``pieces`` (the last ones) are the plan's direct share."""


def kept_from_peers(batch: Batch, planned: bool) -> bool:
    """Whether libtorrent should not fetch ``batch``'s pieces from peers while S3 brings
    them (priority 0; blocks already requested still come): a peer's copy would arrive
    too, half of it, redundant bytes on the downlink.

    So for a plan's ALL (S3 feeds every node at link speed), a direct share (the
    allocation found room on the origin) and a fill's one piece (CI's late node beside
    two seeders had all 24 pieces from them and 9 of those from S3 too). Not for a WIDE
    batch: held back, it waits on S3 whatever S3 gives. Kept from peers, CI's S3-slows
    fleet (ALL taken back as the origin fell to 3 Mbit) timed out at 240 s and failed
    again when the rule was restored to check; CI's origin-bound fleet once read a whole
    WIDE batch from S3 (1.51 F). Unkept, a peer that brings a piece first cuts the GET
    short. Nor for a stripe (pieces nobody else holds) or the node's own choice. A batch
    not kept from peers as a whole is kept from them one GET at a time, each GET's
    pieces while it runs, except a planned WIDE one (``read_origin`` says why)."""
    if not planned:
        return False
    if batch.kind is BatchKind.STRIPE:
        return batch.direct > 0
    return batch.kind in (BatchKind.ALL, BatchKind.FILL)


def all_missing(missing: Sequence[int]) -> Batch:
    return Batch(BatchKind.ALL, list(missing))


def planned_batch(
    plan: OriginPlan,
    missing: Sequence[int],
    held: Collection[int],
    availability: Sequence[int],
    in_flight: set[int],
    offset: int,
    direct_budget: int = 0,
    wide_limit: int | None = None,
    leave_in_flight: bool = False,
) -> Batch:
    """The batch a coordinator's plan asks for.

    ALL: every missing piece (S3 feeds every node at link speed). STRIPE: the plan's
    stripe minus what is held, then up to ``direct_budget`` more pieces for this node
    alone (the allocation's direct share, in :func:`wide_pieces` order; at most
    ``wide_limit`` of them per batch, as for WIDE); when neither is
    left and the plan says ``fill``, one rare piece (:data:`FILL_PIECES`), or every
    missing piece that peers hold in the fetch's tail (:data:`TAIL_FILL_PIECES`). WIDE: the
    stripe first, then up to ``wide_limit`` other missing pieces (all of them if None)
    in :func:`wide_pieces` order. A bounded batch lets the next plan narrow the node
    again: a batch of everything missing (or of a whole direct share, planned from the
    first seconds' rates) ran to its end whatever the coordinator said meanwhile.
    WIDE's extra pieces count as direct (read for this node alone).

    ``leave_in_flight``: the direct share and a fill take no piece libtorrent has asked
    peers for (``in_flight``), where they otherwise take them last. S3 bringing such a
    piece first makes the blocks peers have already sent of it redundant (whatever is
    queued at the peer's end and on the way when libtorrent cancels the rest):
    swarm-bound at full rates counted 9-28 MB a node of them (libtorrent's
    ``waste_piece_unknown``), its direct batches late in the fetch being pieces
    libtorrent had asked peers for. The plan asks for it where the nodes' downlinks are
    the fleet's bound (``OriginPlan.link_bound``); where uploads are (the mixed fleet:
    100 Mbit up, 300 down) the spare downlink pays for those bytes and S3 ends pieces
    slow peers hold: leaving them to peers there cost mixed at a quarter of its rates
    1.4-2.1 s (two alternating pairs).
    """
    if plan.mode == Mode.ALL:
        return all_missing(missing)
    stripe = [p for p in plan.stripe if p not in held]
    if plan.mode != Mode.WIDE:
        if direct_budget > 0:
            taken = set(stripe)
            order = wide_pieces(missing, availability, in_flight, direct_budget + len(taken))
            per_batch = direct_budget if wide_limit is None else min(direct_budget, wide_limit)
            if leave_in_flight:
                taken |= in_flight
            extra = [p for p in order if p not in taken][:per_batch]
            if extra:
                return Batch(BatchKind.STRIPE, stripe + extra, direct=len(extra))
        if not stripe and plan.fill:
            if leave_in_flight:
                missing = [p for p in missing if p not in in_flight]
            limit = len(missing) if len(missing) <= TAIL_FILL_PIECES else FILL_PIECES
            return Batch(
                BatchKind.FILL, fill_pieces(missing, availability, in_flight, offset, limit)
            )
        return Batch(BatchKind.STRIPE, stripe)
    taken = set(stripe)
    slow = wide_pieces(missing, availability, in_flight, len(missing))
    extra = [p for p in slow if p not in taken][:wide_limit]
    return Batch(BatchKind.WIDE, stripe + extra, direct=len(extra))


def tail_from_s3(missing_bytes: int, s3_rate: float, peers_rate: float, within: float) -> bool:
    """At the switch to ALL: the fetch's tail, which S3 alone brings sooner. S3 would read
    all that is missing (``missing_bytes``) within ``within`` seconds at its estimated
    rate for this node (``s3_rate``, bytes/s), and peers bring the node less than that
    (``peers_rate``). Then nothing is left to peers: waiting on their blocks, then on the
    pieces they had partly sent, serialized the tail into small batches with S3 idle in
    between (slow uploads at a quarter, its uplinks 5 Mbit: 35.5-35.8 s against
    36.9-37.5, two pairs; at full rates 0.98 of the time, four). Not where peers are
    faster: swarm-bound's last node then read from a slow origin what peers would have
    finished (8.4-10.0 s against 7.6-8.7)."""
    return missing_bytes <= within * s3_rate and peers_rate < s3_rate
