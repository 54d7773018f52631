"""What a node's S3 reader takes next under a coordinator plan (swarm/batch.py)."""

from __future__ import annotations

from swarm.batch import (
    TAIL_FILL_PIECES,
    Batch,
    BatchKind,
    kept_from_peers,
    planned_batch,
    tail_from_s3,
)
from swarm.messages import OriginPlan

MISSING = list(range(10))
AVAILABILITY = [0, 0, 1, 1, 0, 0, 0, 0, 2, 0]


def test_all_takes_every_missing_piece() -> None:
    batch = planned_batch(OriginPlan(mode="all"), MISSING, set(), AVAILABILITY, set(), 0)
    assert batch.kind is BatchKind.ALL and batch.pieces == MISSING and batch.direct == 0


def test_stripe_then_the_direct_share() -> None:
    """The stripe first (minus what arrived), then the direct budget in WIDE order:
    pieces peers hold before pieces nobody holds, never a stripe piece twice."""
    plan = OriginPlan(stripe=(4, 5, 6), mode="stripe")
    batch = planned_batch(plan, MISSING, {6}, AVAILABILITY, set(), 0, direct_budget=3)
    assert batch.kind is BatchKind.STRIPE
    assert batch.pieces == [4, 5, 8, 3, 2] and batch.direct == 3
    # the budget spent: the stripe alone
    batch = planned_batch(plan, MISSING, {6}, AVAILABILITY, set(), 0, direct_budget=0)
    assert batch.pieces == [4, 5] and batch.direct == 0


def test_direct_share_is_read_from_the_plan_and_bounded() -> None:
    assert OriginPlan.from_json({"mode": "stripe", "direct": 0.25}).direct == 0.25  # type: ignore[union-attr]
    assert OriginPlan.from_json({"mode": "stripe", "direct": 7}).direct == 1.0  # type: ignore[union-attr]
    assert OriginPlan.from_json({"mode": "stripe", "direct": "x"}).direct == 0.0  # type: ignore[union-attr]
    assert OriginPlan.from_json({"mode": "all"}).mode == "all"  # type: ignore[union-attr]


def test_wide_takes_the_stripe_then_a_bounded_batch_counted_as_direct() -> None:
    """WIDE reads the stripe, then other missing pieces in WIDE order, at most
    ``wide_limit`` of them: the next plan can narrow the node again (a batch of
    everything missing ran to its end whatever the coordinator said meanwhile)."""
    plan = OriginPlan(stripe=(4, 5), mode="wide")
    batch = planned_batch(plan, MISSING, set(), AVAILABILITY, set(), 0, wide_limit=3)
    assert batch.kind is BatchKind.WIDE
    assert batch.pieces == [4, 5, 8, 3, 2] and batch.direct == 3
    everything = planned_batch(plan, MISSING, set(), AVAILABILITY, set(), 0)
    assert sorted(everything.pieces) == MISSING and everything.direct == 8


def test_which_planned_batches_are_kept_from_peers() -> None:
    """ALL, a fill and a direct share are kept from peers while S3 brings them; a WIDE
    batch is not (kept, it waited on a throttled S3: CI's S3-slows fleet timed out), nor
    a plain stripe, nor anything the node chose without a plan."""
    assert kept_from_peers(Batch(BatchKind.ALL, [1, 2]), planned=True)
    assert kept_from_peers(Batch(BatchKind.FILL, [3]), planned=True)
    assert kept_from_peers(Batch(BatchKind.STRIPE, [4, 5, 8], direct=1), planned=True)
    assert not kept_from_peers(Batch(BatchKind.STRIPE, [4, 5]), planned=True)
    assert not kept_from_peers(Batch(BatchKind.WIDE, [4, 5, 8], direct=1), planned=True)
    assert not kept_from_peers(Batch(BatchKind.ALL, [1, 2]), planned=False)


def test_a_link_bound_direct_share_leaves_pieces_asked_of_peers_to_them() -> None:
    """Where the downlinks are the fleet's bound, the direct share takes no piece
    libtorrent has asked peers for (S3 bringing it first makes the blocks they sent
    redundant); else it takes those last, as WIDE does (a slow peer must not hold the
    tail). The plan carries the flag."""
    plan = OriginPlan(stripe=(4, 5), mode="stripe")
    asked = {8, 3, 2}
    busy = planned_batch(
        plan, MISSING, set(), AVAILABILITY, asked, 0, direct_budget=3, leave_in_flight=True
    )
    assert busy.pieces == [4, 5, 9, 7, 6] and busy.direct == 3
    idle = planned_batch(plan, MISSING, set(), AVAILABILITY, asked, 0, direct_budget=9)
    assert idle.pieces[-3:] == [8, 3, 2] and idle.direct == 8
    # a fill too: the rarest piece peers hold that they have not been asked for, or,
    # where all of them have been, one of those (not under the flag)
    fill = OriginPlan(mode="stripe", fill=True)
    asked_all = {2, 3, 8}
    assert planned_batch(fill, MISSING, set(), AVAILABILITY, asked_all, 0).pieces == [2]
    kept = planned_batch(fill, MISSING, set(), AVAILABILITY, {2}, 0, leave_in_flight=True)
    assert kept.kind is BatchKind.FILL and kept.pieces == [3]
    none = planned_batch(fill, MISSING, set(), AVAILABILITY, asked_all, 0, leave_in_flight=True)
    assert none.pieces == []
    flagged = OriginPlan.from_json({"mode": "stripe", "link_bound": True})
    assert flagged is not None and flagged.link_bound
    for value in (None, 1, "yes"):
        unflagged = OriginPlan.from_json({"mode": "stripe", "link_bound": value})
        assert unflagged is not None and not unflagged.link_bound


def test_the_tail_fills_every_missing_piece_peers_hold_at_once() -> None:
    """A node lacking at most TAIL_FILL_PIECES pieces fills them all in one batch (the
    origin has room, and one piece at a time kept the fleet's last node waiting on slow
    peers); pieces asked of peers come last, as in any fill."""
    fill = OriginPlan(mode="stripe", fill=True)
    few = [2, 3, 8, 9]  # 9: nobody holds it, a stripe's
    batch = planned_batch(fill, few, set(), AVAILABILITY, {3}, 0)
    assert batch.kind is BatchKind.FILL and batch.pieces == [2, 8, 3]
    many = list(range(TAIL_FILL_PIECES + 1))
    assert len(planned_batch(fill, many, set(), [1] * len(many), set(), 0).pieces) == 1


def test_the_tail_is_left_to_s3_only_where_it_is_quick_and_peers_are_slower() -> None:
    mib = 1 << 20
    # 15 MiB missing, S3 at 40 MB/s for this node: 0.39 s; peers give it 3 MB/s
    assert tail_from_s3(15 * mib, 40e6, 3e6, within=0.5)
    assert not tail_from_s3(30 * mib, 40e6, 3e6, within=0.5)  # not the tail yet
    assert not tail_from_s3(15 * mib, 40e6, 45e6, within=0.5)  # peers are faster
    assert not tail_from_s3(mib, 0.0, 0.0, within=0.5)  # no S3 estimate: never
