"""The source-mix policy and the origin stripe planner: pure, clock passed in."""

from __future__ import annotations

import math

import pytest

from swarm.agent.hybrid import (
    LocalOriginPolicy,
    bitfield,
    fill_pieces,
    origin_pieces,
    wide_pieces,
)
from swarm.coordinator.capacity import PEERS_WARMUP
from swarm.coordinator.origin import PEERS_CHANCE_SECONDS, StripePlanner
from swarm.coordinator.planstate import bits
from swarm.coordinator.rates import MIN_PEAK_INTERVAL, update_rates
from swarm.messages import OriginPlan
from swarm.policy import (
    HOLD_SECONDS,
    MixState,
    Mode,
    decide,
    ema,
    may_fill,
    rate,
    s3_capacity,
)

MiB = 1 << 20


def test_ema_edge_cases():
    assert ema(None, 5.0, 1.0) == 5.0  # first sample taken as is
    assert ema(4.0, 100.0, 0.0) == 4.0  # no time passed: unchanged
    assert ema(4.0, 100.0, -1.0) == 4.0  # clock went back: unchanged
    one = ema(0.0, 100.0, 1.0)
    assert one == pytest.approx(100 * (1 - math.exp(-1 / 3)))
    assert ema(0.0, 100.0, 60.0) == pytest.approx(100.0, rel=1e-6)


def test_rate_ignores_counter_reset():
    assert rate(100, 300, 2.0) == 100.0
    assert rate(300, 100, 1.0) == 0.0  # daemon restarted: counters began again
    assert rate(0, 100, 0.0) == 0.0


def test_widen_needs_slow_swarm_backlog_and_time():
    s3 = 50 * MiB
    state = MixState()
    # slow swarm but nothing to take from it: stays STRIPE however long
    for t in range(10):
        state = decide(state, 1 * MiB, s3, backlog=0, now=float(t))
    assert state.mode is Mode.STRIPE
    # slow swarm with a backlog: switches only after HOLD_SECONDS
    backlog = int(s3 * HOLD_SECONDS) + 1
    state = decide(state, 1 * MiB, s3, backlog, now=100.0)
    assert state.mode is Mode.STRIPE and state.pending_since == 100.0
    state = decide(state, 1 * MiB, s3, backlog, now=100.0 + HOLD_SECONDS / 2)
    assert state.mode is Mode.STRIPE
    state = decide(state, 1 * MiB, s3, backlog, now=100.0 + HOLD_SECONDS)
    assert state.mode is Mode.WIDE


def test_hysteresis_band_keeps_mode_and_a_blip_does_not_flip():
    s3 = 10 * MiB
    wide = MixState(Mode.WIDE)
    # between WIDEN_RATIO and NARROW_RATIO: no change either way
    assert decide(wide, 0.7 * s3, s3, 10**9, 0.0) == MixState(Mode.WIDE)
    assert decide(MixState(), 0.7 * s3, s3, 10**9, 0.0) == MixState(Mode.STRIPE)
    # a fast second, then slow again: the pending switch is dropped
    pending = decide(wide, 2 * s3, s3, 10**9, 0.0)
    assert pending.pending_since == 0.0
    assert decide(pending, 0.1 * s3, s3, 10**9, 1.0) == MixState(Mode.WIDE)


def test_unknown_or_tiny_s3_estimate_keeps_mode():
    assert decide(MixState(Mode.WIDE), 0.0, None, 10**9, 5.0).mode is Mode.WIDE
    assert decide(MixState(), 0.0, 10.0, 10**9, 5.0).mode is Mode.STRIPE


def test_bitfield_round_trip_through_coordinator_bits():
    pieces = [True, False, False, True, True, False, False, False, True, False, True]
    import base64

    value = bits(base64.b64decode(bitfield(pieces)), len(pieces))
    assert [bool(value >> i & 1) for i in range(len(pieces))] == pieces


def _plan(planner, node, held=0, now=0.0, complete=False, count=64, s3=0, peers=0, **more):
    return planner.plan(
        node,
        "ab" * 20,
        piece_size=MiB,
        count=count,
        held=held,
        complete=complete,
        counters={"s3": s3, "peers": peers},
        up_rate=0.0,
        now=now,
        **more,
    )


def test_stripes_are_disjoint_and_cover_each_piece_once():
    planner = StripePlanner(stripe_bytes=8 * MiB)
    a = _plan(planner, "a")
    b = _plan(planner, "b")
    assert a.stripe == list(range(8)) and b.stripe == list(range(8, 16))
    # a finished its stripe: it is topped up with fresh pieces, none of b's
    held_a = sum(1 << p for p in a.stripe)
    a2 = _plan(planner, "a", held=held_a, now=1.0)
    assert set(a2.stripe).isdisjoint(a.stripe) and set(a2.stripe).isdisjoint(b.stripe)
    # a piece b was reading that arrived at c (from a peer) is dropped from b's stripe
    c = _plan(planner, "c", held=1 << 8, now=1.0)
    b2 = _plan(planner, "b", now=1.5)
    assert 8 not in b2.stripe and 8 not in c.stripe


def test_stalled_or_departed_reader_loses_its_stripe():
    planner = StripePlanner(stripe_bytes=8 * MiB, stall_seconds=5.0)
    a = _plan(planner, "a", now=0.0)
    _plan(planner, "a", now=1.0)  # no progress
    b = _plan(planner, "b", now=6.5)  # a stalled for 6.5 s > 5 s
    assert b.stripe == a.stripe
    planner.prune({"b"})  # a stopped reporting
    c = _plan(planner, "c", now=7.0)
    assert set(c.stripe).isdisjoint(b.stripe)


def test_reader_cap_and_complete_nodes():
    planner = StripePlanner(stripe_bytes=4 * MiB, max_readers=2)
    assert _plan(planner, "a").stripe and _plan(planner, "b").stripe
    assert _plan(planner, "c").stripe == []  # origin budget used up
    planner.prune({"b", "c"})  # a left the fleet
    assert _plan(planner, "c", now=1.0).stripe  # so c may read the origin now
    assert _plan(planner, "b", complete=True, held=(1 << 64) - 1).stripe == []


def test_fast_reader_gets_a_longer_stripe():
    planner = StripePlanner(stripe_bytes=4 * MiB)
    _plan(planner, "a", now=0.0, count=512)
    plan = _plan(planner, "a", now=1.0, count=512, s3=100 * MiB)
    assert len(plan.stripe) > 4


def test_local_policy_choices():
    missing = list(range(10))
    availability = [0, 0, 1, 1, 0, 0, 0, 0, 2, 0]
    assert origin_pieces(missing, availability, {0}, offset=5, limit=3) == [5, 6, 7]
    # held by peers first, then nobody's yet, and 3 (on its way from a peer) last, yet
    # taken: a slow peer must not be the tail
    assert wide_pieces(missing, availability, {3}, limit=10) == [8, 2, 9, 7, 6, 5, 4, 1, 0, 3]
    assert wide_pieces(missing, availability, {3}, limit=2) == [8, 2]
    local = LocalOriginPolicy(offset=0)
    got = local.choose(
        missing, availability, set(), 4, piece_size=MiB, peers_rate=0.0, s3_bytes=0, now=0.0
    )
    assert got == [0, 1, 4, 5] and local.state.mode is Mode.STRIPE


def test_s3_at_link_speed_means_all_once_the_stripes_are_spread():
    """Once every piece has left the origin (or is on its way) and peers have had
    PEERS_WARMUP seconds to show their rate, nodes that S3 serves at the best rate they
    have shown (their links, as far as anyone knows), more than peers give them, read
    the rest from S3 too (ALL): S3 feeds them as fast as anything could."""
    planner = StripePlanner(stripe_bytes=32 * MiB)
    _plan(planner, "a", now=0.0)
    _plan(planner, "b", now=0.0)
    # a and b read their 32 MiB stripes at 8 MiB/s (the whole object is striped);
    # peers give each 1 MiB/s: S3 is far the faster source
    for t in range(1, 4):
        got = (1 << (8 * t)) - 1  # the first 8 t pieces of each stripe
        a = _plan(planner, "a", held=got, now=t, s3=8 * MiB * t, peers=MiB * t)
        b = _plan(planner, "b", held=got << 32, now=t, s3=8 * MiB * t, peers=MiB * t)
        if t < 1 + PEERS_WARMUP:  # peers have just started: their rate says nothing yet
            assert a.mode is not Mode.ALL and b.mode is not Mode.ALL, t
    assert a.mode is Mode.ALL and b.mode is Mode.ALL and b.s3_estimate


def test_s3_that_fed_every_link_at_once_means_all_before_the_stripes_are_spread():
    """s3-fast at a quarter of its rates: the six stripes left S3 at the nodes' link
    speed in the first second, then S3 and peers shared each downlink, and stripes
    of 8 MiB at 2-3 MB/s spread the 128 MiB only 10 s in; the plan waited for that to
    say ALL. Once peers have had their warm-up, an origin that filled every link at
    once is ALL whether or not every piece has left it. Where the origin is the
    bottleneck, the same seconds stay on stripes."""

    def modes(s3_first: float, s3_then: float, peers: float) -> set[Mode]:
        planner = StripePlanner(stripe_bytes=8 * MiB)
        nodes = [f"n{i}" for i in range(6)]
        for node in nodes:
            _plan(planner, node, count=1024, now=0.0)
        seen: set[Mode] = set()
        for t in range(1, 6):
            s3 = s3_first + s3_then * (t - 1)
            got = peers * (t - 1)
            for i, node in enumerate(nodes):
                plan = _plan(planner, node, count=1024, now=t + i / 100, s3=int(s3), peers=int(got))
                seen.add(plan.mode)
        return seen

    # links of 7 MiB/s: S3 gave each 7 MiB in the first second, then shared the link
    assert Mode.ALL in modes(7 * MiB, 3.5 * MiB, 3.5 * MiB)
    # an origin of 6 MiB/s for six nodes of 7: a reader gets 1, peers relay the rest
    assert Mode.ALL not in modes(1 * MiB, 1 * MiB, 6 * MiB)


def test_origin_bound_start_neither_reads_all_nor_fills():
    """CI saw the origin send 1.8 x F to 4 nodes behind a 100 Mbit origin: the first two
    nodes took the 16 MiB object as their stripes and read it at 6 MiB/s each, a rate
    that was all they had received, so S3 looked as fast as their links (ALL), and the
    two late nodes, with nothing from peers yet, filled from S3."""
    planner = StripePlanner(stripe_bytes=8 * MiB)
    for node in "abcd":
        _plan(planner, node, count=16, now=0.0)
    a = _plan(planner, "a", count=16, held=0xFF, now=1.3, s3=8 * MiB, peers=MiB)
    b = _plan(planner, "b", count=16, held=0xFF00, now=1.3, s3=8 * MiB, peers=MiB)
    c = _plan(planner, "c", count=16, now=1.3)
    d = _plan(planner, "d", count=16, now=1.3)
    assert Mode.ALL not in {a.mode, b.mode, c.mode, d.mode}
    # peers then relay at a node's link, 3x what S3 gives a reader: the origin is the
    # limit, and nobody fills from it
    for t in (2.3, 3.3, 4.3):
        i = t - 1.3
        for node, held in (("a", 0xFF), ("b", 0xFF00), ("c", 0xF), ("d", 0xF0)):
            plan = _plan(
                planner, node, count=16, held=held, now=t, s3=int(8 * MiB + i * 6 * MiB),
                peers=int(i * 20 * MiB),
            )  # fmt: skip
            assert plan.mode is not Mode.ALL and not plan.fill, (t, node)


def test_a_node_done_with_its_stripe_before_an_allocation_reads_on():
    """s3-fast: the stripes left S3 in a second; a node whose stripe is done, before
    peers have had their warm-up (no allocation yet), has nobody holding anything for it
    and sat idle. All it lacks is work S3 can take: it widens after HOLD_SECONDS. A node
    whose stripe can still be topped up with pieces nobody reads reads those instead."""
    planner = StripePlanner(stripe_bytes=16 * MiB)
    _plan(planner, "a", count=32, now=0.0)
    assert _plan(planner, "b", count=32, now=0.0).stripe  # two stripes cover the object
    for step, t in enumerate((0.5, 1.0, 1.5, 2.0), 1):
        # a has its stripe (16 MiB in half a second); b reads its own, 3 pieces a step
        a = _plan(planner, "a", count=32, held=(1 << 16) - 1, now=t, s3=16 * MiB)
        b_held = ((1 << 3 * step) - 1) << 16
        _plan(planner, "b", count=32, held=b_held, now=t, s3=3 * MiB * step)
    assert planner.capacity.last("ab" * 20) is None
    assert a.mode is Mode.WIDE
    # alone on a larger object: its stripe is topped up with fresh pieces, no WIDE
    alone = StripePlanner(stripe_bytes=16 * MiB)
    _plan(alone, "a", count=64, now=0.0)
    held = 0
    for step, t in enumerate((0.5, 1.0, 1.5, 2.0), 1):
        held |= (1 << 8 * step) - 1
        a = _plan(alone, "a", count=64, held=held, now=t, s3=8 * MiB * step)
        assert a.stripe and a.mode is Mode.STRIPE, t


def test_a_node_lacking_much_widens_at_its_stripes_end_before_an_allocation():
    """slow-uploads (8 nodes, 20 Mbit uplinks): the stripes spread a 128 MiB object in a
    second, and the nodes sat 1.5-2.7 s on an idle origin, peers giving each 2.5 MB/s
    against S3's 17, until a hold had passed. A node that lacks many seconds of S3's
    rate widens at its first report without a stripe; one on a small object still
    waits the hold (the test above)."""
    planner = StripePlanner(stripe_bytes=16 * MiB)
    nodes = "abcdefgh"
    for node in nodes:
        assert _plan(planner, node, count=128, now=0.0).stripe  # 8 stripes cover it
    for i, node in enumerate(nodes):  # each read its 16 MiB at 16 MiB/s; peers trickle
        held = ((1 << 16) - 1) << 16 * i
        plan = _plan(planner, node, count=128, held=held, now=1.0, s3=16 * MiB, peers=MiB)
        # the report that ends its stripe widens it (not the next one, a second later)
        assert not plan.stripe and plan.mode is Mode.WIDE, node
    assert planner.capacity.last("ab" * 20) is None
    # at its next report (no longer a reader), before a hold has passed, it stays WIDE
    a = _plan(planner, "a", count=128, held=(1 << 17) - 1, now=1.2, s3=16 * MiB, peers=2 * MiB)
    assert a.mode is Mode.WIDE


def test_a_node_whose_uploads_outrun_s3_does_not_widen_at_its_stripes_end():
    """The mixed fleet at a quarter: S3 gave a reader 1.3-1.5 MB/s and the nodes uploaded
    3-5; those that widened at their stripes' end read slowly from the busy origin and
    finished last. A node uploading over twice what S3 gives a reader waits the hold
    (peers like it soon give it more)."""
    planner = StripePlanner(stripe_bytes=16 * MiB)
    nodes = "abcdefgh"

    def report(node: str, now: float, held: int = 0, s3: int = 0, uploaded: int = 0):
        return planner.plan(
            node, "ab" * 20, piece_size=MiB, count=128, held=held, complete=False,
            counters={"s3": s3, "peers": MiB if now else 0}, up_rate=0.0, now=now,
            uploaded=uploaded,
        )  # fmt: skip

    for node in nodes:
        assert report(node, 0.0).stripe
    for i, node in enumerate(nodes):  # 16 MiB/s from S3, 48 MiB/s of uploads
        plan = report(node, 1.0, ((1 << 16) - 1) << 16 * i, 16 * MiB, 48 * MiB)
        assert not plan.stripe and plan.mode is Mode.STRIPE, node


def test_among_seeders_a_late_node_does_not_widen_at_once():
    """CI's late-node test (a LAN, two seeders): widened at its first reports, before an
    allocation, a late node read 5-10 of 24 pieces from S3 that the seeders sent too."""
    planner = StripePlanner(stripe_bytes=16 * MiB)
    _plan(planner, "s", count=24, now=0.0)  # the seeder's own fetch: S3 at 16 MiB/s
    _plan(planner, "s", count=24, held=(1 << 16) - 1, now=1.0, s3=16 * MiB)
    _plan(planner, "s", count=24, held=(1 << 24) - 1, complete=True, now=1.5, s3=24 * MiB)
    for now, peers in ((2.0, 0), (2.5, MiB)):  # within the hold (peers may be slow later)
        late = _plan(planner, "l", count=24, now=now, peers=peers)
        assert late.mode is not Mode.WIDE and not late.stripe, now


def test_among_seeders_a_late_node_gives_its_peers_seconds_before_it_widens():
    """CI's late node on loopback got one piece from two seeders in its first two
    reports and widened after the usual hold: 12 of 24 pieces read from S3 that the
    seeders sent too. Among seeders the hold is PEERS_CHANCE_SECONDS; a node whose
    seeders never answer still widens once it has passed."""
    planner = StripePlanner(stripe_bytes=16 * MiB)
    _plan(planner, "s", count=24, now=0.0)
    _plan(planner, "s", count=24, held=(1 << 16) - 1, now=1.0, s3=16 * MiB)
    _plan(planner, "s", count=24, held=(1 << 24) - 1, complete=True, now=1.5, s3=24 * MiB)
    late = None
    for now in (2.0, 3.0, 4.0, 4.9):  # one piece, then nothing: slow for 2.9 s
        late = _plan(planner, "l", count=24, held=1, now=now, peers=MiB)
        assert late.mode is not Mode.WIDE, now
    assert PEERS_CHANCE_SECONDS > 2 * HOLD_SECONDS
    for now in (5.5, 6.0):
        late = _plan(planner, "l", count=24, held=1, now=now, peers=MiB)
    assert late is not None and late.mode is Mode.WIDE


def test_among_seeders_a_node_that_receives_does_not_widen_before_an_allocation():
    """Existing seeders at a quarter of the rates: a node that had read a fill piece from
    S3 (so the peers' chance no longer held it) widened on its peers' early rate, and
    read 22 MB from a 12.5 Mbit origin that its peers sent too. Receiving anything, it
    keeps to its stripe until an allocation (receiving nothing, it still widens: the
    late node's test above)."""
    planner = StripePlanner(stripe_bytes=16 * MiB)
    _plan(planner, "s", count=24, now=0.0)  # the seeder's own fetch: S3's rate
    _plan(planner, "s", count=24, held=(1 << 16) - 1, now=1.0, s3=16 * MiB)
    _plan(planner, "s", count=24, held=(1 << 24) - 1, complete=True, now=1.5, s3=24 * MiB)
    _plan(planner, "a", count=24, now=2.0)
    _plan(planner, "a", count=24, held=1, now=2.5, s3=MiB)  # a fill piece
    received = 0
    for now in (3.0, 3.5, 4.0, 4.5):  # peers give it 0.5 MiB/s against S3's ~6
        received += MiB // 4
        a = _plan(planner, "a", count=24, held=1, now=now, s3=MiB, peers=received)
        assert a.mode is not Mode.WIDE, now
    assert planner.capacity.last("ab" * 20) is None  # (no allocation all along)


def test_a_node_without_a_stripe_does_not_widen_at_once_while_others_read_theirs():
    """CI's origin-bound fleet (4 nodes, 16 MiB, origin 100 Mbit): two stripes of 8 MiB
    cover the object; the other two nodes, with nothing from peers yet and the first
    reports' low S3 estimate, lacked 'two seconds of S3' and widened at once: the origin
    sent 1.6-1.7 F; one that started last had nothing from peers 1.3 s in and widened
    after the hold (1.74 F). What they lack is on its way from the busy origin."""
    planner = StripePlanner(stripe_bytes=8 * MiB)
    assert _plan(planner, "a", count=16, now=0.0).stripe
    assert _plan(planner, "b", count=16, now=0.0).stripe
    assert not _plan(planner, "c", count=16, now=0.0).stripe
    assert not _plan(planner, "d", count=16, now=0.0).stripe
    # a and b read 3 MiB in their first second (an EMA of under 1 MB/s)
    _plan(planner, "a", count=16, held=0b111, now=1.0, s3=3 * MiB)
    _plan(planner, "b", count=16, held=0b111 << 8, now=1.0, s3=3 * MiB)
    for now in (1.05, 1.6, 2.2):  # nor after the usual hold: their peers are connecting
        for node in "cd":
            plan = _plan(planner, node, count=16, now=now)
            assert plan.mode is Mode.STRIPE, (node, now)


def test_a_node_whose_s3_bytes_are_its_early_read_waits_on_peers_like_one_without():
    """The same fleet with ``swarm fetch`` reading two pieces while each daemon started
    (:mod:`swarm.agent.earlyread`): c and d hold them and report S3 bytes and busy
    seconds (a first S3 sample) but no stripe. Taken for readers, they widened at once
    and the origin sent 1.2-2.0 F (CI failed on it); reported as ``s3_early``, they wait
    on their peers as before."""
    planner = StripePlanner(stripe_bytes=8 * MiB)
    assert _plan(planner, "a", count=16, now=0.0).stripe
    assert _plan(planner, "b", count=16, now=0.0).stripe
    early = {"s3": 2 * MiB, "held": 0b11 << 12, "s3_busy": 0.6}
    for node in "cd":
        plan = _plan(planner, node, count=16, now=0.6, s3_early=2 * MiB, **early)
        assert not plan.stripe and plan.mode is Mode.STRIPE, node
    _plan(planner, "a", count=16, held=0b111, now=1.0, s3=3 * MiB)
    _plan(planner, "b", count=16, held=0b111 << 8, now=1.0, s3=3 * MiB)
    for now in (1.05, 1.6, 2.2):
        for node in "cd":
            plan = _plan(planner, node, count=16, now=now, s3_early=2 * MiB, **early)
            assert plan.mode is Mode.STRIPE, (node, now)
    # without it, the same reports widen them at once: what the test above guards against
    planner = StripePlanner(stripe_bytes=8 * MiB)
    _plan(planner, "a", count=16, now=0.0)
    _plan(planner, "b", count=16, now=0.0)
    _plan(planner, "a", count=16, held=0b111, now=1.0, s3=3 * MiB)
    _plan(planner, "b", count=16, held=0b111 << 8, now=1.0, s3=3 * MiB)
    assert _plan(planner, "c", count=16, now=1.05, **early).mode is Mode.WIDE


def test_a_reader_lacking_little_of_its_own_s3_rate_does_not_widen_at_its_stripes_end():
    """CI's origin-bound fleet: a reader whose 8 MiB stripe ended read S3 at 4.2 MB/s,
    while the estimate (an EMA of its first seconds) said about 2: the 8 MiB it lacked
    looked like several seconds of S3 and it widened eagerly (1.39 F). Eagerness is
    judged on the larger of the estimate and the node's own S3 peak."""
    planner = StripePlanner(stripe_bytes=8 * MiB)
    assert _plan(planner, "a", count=16, now=0.0).stripe == list(range(8))
    assert _plan(planner, "b", count=16, now=0.0).stripe == list(range(8, 16))
    _plan(planner, "a", count=16, held=0xF, now=1.0, s3=4 * MiB)
    _plan(planner, "b", count=16, held=0x3 << 8, now=1.0, s3=2 * MiB)
    a = _plan(planner, "a", count=16, held=0xFF, now=2.0, s3=8 * MiB)  # its stripe is done
    assert not a.stripe and a.mode is Mode.STRIPE


def test_a_swarm_that_stops_sending_widens_the_node_at_once():
    """The s3-fast fleet: a node got 21 MiB from peers in its first half second, then
    nothing for three seconds while its stripe was done and peers held what it lacked.
    The peers' EMA kept it in STRIPE (idle) until the burst had decayed; the last
    interval's rate shows the stall, so it widens after HOLD_SECONDS."""
    planner = StripePlanner(stripe_bytes=8 * MiB)
    _plan(planner, "a", count=40, now=0.0)
    _plan(planner, "b", count=40, now=0.0)
    b_held = (1 << 40) - 1 - 0xFF  # b holds what a lacks: a backlog for a (16 MiB,
    # a second of what S3 gave a)
    _plan(planner, "b", count=40, held=b_held, now=0.5, s3=8 * MiB, peers=16 * MiB)
    a = _plan(planner, "a", count=40, held=0xFF, now=0.5, s3=8 * MiB)
    burst = 0xFF | 0xFF00 | 0xFF0000  # 16 MiB from peers in the next half second
    a = _plan(planner, "a", count=40, held=burst, now=1.0, s3=8 * MiB, peers=16 * MiB)
    assert a.mode is Mode.STRIPE
    for t in (2.0, 3.0):  # nothing more from peers; S3 has nothing left in the stripe
        a = _plan(planner, "a", count=40, held=burst, now=t, s3=8 * MiB, peers=16 * MiB)
    assert a.mode is Mode.WIDE


def test_default_stripes_share_the_object_among_a_scale_out():
    """The first stripes are small: 8 nodes starting together on a 64-piece artifact
    all get origin work (16 MiB stripes gave it all to the first 4)."""
    planner = StripePlanner()
    plans = [_plan(planner, f"n{i}", now=0.0) for i in range(8)]
    assert all(p.stripe for p in plans)
    assert sum(len(p.stripe) for p in plans) <= 64


def test_fill_once_every_piece_has_left_the_origin_and_s3_has_room():
    """A node with no stripe left may fill from S3 (one rare piece at a time) once the
    allocation found S3 capacity beyond the stripes (MIX): the origin gives more than a
    node's link can take, the swarm less than twice what S3 gives a reader."""
    planner = StripePlanner(stripe_bytes=32 * MiB)
    _plan(planner, "a", now=0.0)
    _plan(planner, "b", now=0.0)
    c = _plan(planner, "c", now=0.0)
    assert not c.fill and not c.stripe  # a and b read the whole object
    for t in range(1, 5):
        # a and b read their stripes at 8 MiB/s and swap pieces at 4; c gets 12 from peers
        got = (1 << (6 * t)) - 1
        _plan(planner, "a", held=got, now=t, s3=8 * MiB * t, peers=4 * MiB * t)
        _plan(planner, "b", held=got << 32, now=t, s3=8 * MiB * t, peers=4 * MiB * t)
        c = _plan(planner, "c", held=got | got << 32, now=t, peers=12 * MiB * t)
        if t < 1 + PEERS_WARMUP:
            assert not c.fill, t  # the rates cannot tell yet: stripes only
    assert c.fill and c.direct > 0
    # the same node when its peers give it far more than S3 gives a reader: no fill
    planner2 = StripePlanner(stripe_bytes=32 * MiB)
    _plan(planner2, "a", now=0.0)
    _plan(planner2, "b", now=0.0)
    _plan(planner2, "a", held=(1 << 32) - 1, now=1.0, s3=MiB)
    assert not _plan(planner2, "a", held=(1 << 32) - 1, now=2.0, s3=MiB, peers=200 * MiB).fill


def test_among_seeders_a_node_fills_while_the_origin_idles_before_an_allocation():
    """Seeders hold the whole artifact: nothing is striped, and the origin idles until
    the rates can tell (no allocation yet). A new node fills from it meanwhile, one rare
    piece at a time; without a seeder (the origin-bound start above) it does not."""
    planner = StripePlanner(stripe_bytes=8 * MiB)
    full = (1 << 64) - 1
    _plan(planner, "seed", held=full, complete=True, now=0.0)
    a = _plan(planner, "a", now=0.0)
    assert not a.stripe and a.fill
    assert planner.capacity.last("ab" * 20) is None
    # a node of a cohort without seeders whose stripes are done does not
    alone = StripePlanner(stripe_bytes=8 * MiB)
    _plan(alone, "a", count=16, now=0.0)
    _plan(alone, "b", count=16, now=0.0)
    _plan(alone, "a", count=16, held=0xFF, now=1.0, s3=8 * MiB)
    b = _plan(alone, "b", count=16, held=0xFF00, now=1.0, s3=8 * MiB)
    assert not b.stripe and not b.fill


def test_among_seeders_a_node_whose_peers_are_fast_stops_filling():
    """CI's late node beside two seeders on loopback: it filled from S3 (one GET at a
    time, 9 of 24 pieces) while the seeders sent it all 24. Once its peers deliver more
    than FILL_RATIO times what S3 gives a reader, it stops; with slow peers it goes on."""
    for peers_rate, fills in ((64 * MiB, False), (4 * MiB, True)):
        planner = StripePlanner(stripe_bytes=16 * MiB)
        _plan(planner, "s", count=24, now=0.0)  # the seeder's own fetch: S3 at 8 MiB/s
        _plan(planner, "s", count=24, held=0xFF, now=1.0, s3=8 * MiB)
        _plan(planner, "s", count=24, held=(1 << 24) - 1, complete=True, now=2.0, s3=24 * MiB)
        late = _plan(planner, "l", count=24, now=2.0)
        assert late.fill and not late.stripe  # the peers' rate is not known yet
        late = _plan(planner, "l", count=24, held=0b111, now=2.5, s3=MiB, peers=2 * MiB)
        late = _plan(
            planner, "l", count=24, held=0b111, now=3.5, s3=MiB, peers=int(2 * MiB + peers_rate)
        )
        assert late.fill is fills, peers_rate


def test_may_fill():
    assert may_fill(1.0 * MiB, 1.0 * MiB) and not may_fill(3.0 * MiB, 1.0 * MiB)
    assert not may_fill(0.0, None) and not may_fill(0.0, 1.0)  # unknown or noise


def test_fill_pieces_are_rare_held_by_peers_and_not_in_flight():
    missing = list(range(8))
    availability = [0, 3, 1, 2, 1, 1, 0, 2]
    # piece 0 and 6: nobody holds them (a stripe's job); 4 is in flight from a peer: last
    assert fill_pieces(missing, availability, {4}, offset=0, limit=8) == [2, 5, 3, 7, 1, 4]
    # ties between equally rare pieces start at the node's offset
    assert fill_pieces(missing, availability, set(), offset=5, limit=2) == [5, 2]
    assert fill_pieces([0, 6], availability, set(), offset=0) == []


def test_s3_capacity_holds_a_higher_rate_and_lets_it_decay():
    assert s3_capacity(None, 5.0, 1.0) == 5.0 and s3_capacity(None, None, 1.0) is None
    assert s3_capacity(10.0, 20.0, 1.0) == 20.0  # a higher current rate wins at once
    # readers slowing at the end of a fetch: the estimate halves every 10 s, no faster
    assert s3_capacity(16.0, 1.0, 10.0) == pytest.approx(8.0)
    assert s3_capacity(16.0, None, 20.0) == pytest.approx(4.0)


def test_an_allocation_replaces_widening_unless_the_node_stalls():
    """Once the fleet has an allocation, a slow swarm no longer widens a node that still
    receives: its direct share is what S3 gives it besides the stripe (the mixed fleet
    widened node after node, and its origin sent each piece seven times). A node that
    receives next to nothing (a stalled exchange) still widens."""
    planner = StripePlanner(stripe_bytes=32 * MiB)
    _plan(planner, "a", now=0.0)
    _plan(planner, "b", now=0.0)
    _plan(planner, "c", now=0.0)
    for t in range(1, 5):  # as in the fill test: an allocation with a direct share
        got = (1 << (6 * t)) - 1
        _plan(planner, "a", held=got, now=t, s3=8 * MiB * t, peers=4 * MiB * t)
        _plan(planner, "b", held=got << 32, now=t, s3=8 * MiB * t, peers=4 * MiB * t)
        c = _plan(planner, "c", held=got | got << 32, now=t, peers=12 * MiB * t)
    assert c.direct > 0 and planner.capacity.last("ab" * 20) is not None
    # a and b finish their halves; c's peers slow to a crawl while they hold much
    # that it lacks: without the allocation, decide() would widen it after HOLD_SECONDS
    _plan(planner, "a", held=(1 << 32) - 1, now=5, s3=40 * MiB, peers=20 * MiB)
    _plan(planner, "b", held=((1 << 32) - 1) << 32, now=5, s3=40 * MiB, peers=20 * MiB)
    held = (1 << 24) - 1 | ((1 << 24) - 1) << 32
    peers = 48 * MiB
    for t in range(5, 20):  # the peers' EMA falls under WIDEN_RATIO of S3 by t = 10
        peers += 2 * MiB  # yet above STARVED_SHARE of c's download peak (12 MiB/s)
        c = _plan(planner, "c", held=held, now=t, peers=peers)
        assert c.mode is not Mode.WIDE, t
    # then a trickle (under STARVED_SHARE of its peak) for two intervals: it widens
    for t in range(20, 27):
        peers += MiB // 4
        c = _plan(planner, "c", held=held, now=t, peers=peers)
    assert c.mode is Mode.WIDE


def test_upload_peak_comes_from_the_upload_counter():
    """A node's upload capacity is its fastest report interval by its ``uploaded``
    counter (libtorrent's own rate is a 5-second average: 12.5 MB/s shows as 4.5 after
    two seconds); an interval under MIN_PEAK_INTERVAL (timed on arrival) is no sample."""
    first = update_rates(None, {"peers": 0}, 0.0, 0.0, uploaded=0)
    assert first.up_peak == 0.0
    one = update_rates(first, {"peers": 0}, 1e6, 1.0, uploaded=12 * MiB)
    assert one.up_peak == pytest.approx(12 * MiB)
    short = update_rates(one, {"peers": 0}, 1e6, 1.0 + MIN_PEAK_INTERVAL / 2, uploaded=24 * MiB)
    assert short.up_peak == pytest.approx(12 * MiB)  # 48 MiB/s over a quarter second: no
    later = update_rates(short, {"peers": 0}, 1e6, 2.5, uploaded=30 * MiB)
    assert later.up_peak == pytest.approx(12 * MiB)  # slower: the peak stands
    # without a counter (an older node), libtorrent's rate
    old = update_rates(update_rates(None, {}, 3e6, 0.0), {}, 5e6, 1.0)
    assert old.up_peak == 5e6 and old.uploaded == -1


def test_a_short_report_interval_folds_into_the_next():
    """s3-fast: a node read each stripe in a 0.3 s burst and woke a report right after
    it. Those short intervals were no sample, and their bytes fell out of the next one:
    the coordinator saw S3 give every node nothing (s3 peaks of 0) and planned MIX where
    S3 filled every link. Now the next whole interval counts them."""
    link = 31e6
    piece = 8 * MiB
    rates = update_rates(None, {"s3": 0}, 0.0, 0.0, node_at=0.0, s3_busy=0.0)
    total, busy = 0, 0.0
    for burst in range(3):  # 8 MiB in 0.27 s, a woken report at once, then the next burst
        total, busy = total + piece, busy + piece / link
        at = (burst + 1) * piece / link
        rates = update_rates(rates, {"s3": total}, 0.0, at, node_at=at, s3_busy=busy)
    assert rates.s3_peak == pytest.approx(link, rel=0.01)
    assert rates.down_peak >= 0.99 * link


def test_s3_rate_of_the_moment_is_over_the_readers_busy_seconds():
    """A stripe read in 0.7 s of a 1 s interval came at S3's full rate (s3-fast: 31 MB/s a
    node); the interval's average said 22 and the allocator never saw S3 fill a link. A
    single fill piece read in a few ms counts over half the interval at least, and a
    node that sends no busy seconds keeps the interval's average."""
    link = 31e6
    first = update_rates(None, {"s3": 0}, 0.0, 0.0, node_at=0.0, s3_busy=0.0)
    stripe = update_rates(first, {"s3": int(0.7 * link)}, 0.0, 1.0, node_at=1.0, s3_busy=0.7)
    assert stripe.s3_now == pytest.approx(link)
    assert stripe.s3_peak == pytest.approx(link)
    assert stripe.down_peak == pytest.approx(link)  # what S3 gave is a download capacity
    fill = update_rates(stripe, {"s3": int(0.7 * link) + MiB}, 0.0, 2.0, node_at=2.0, s3_busy=0.73)
    assert fill.s3_now == pytest.approx(2 * MiB)  # 1 MiB over half the second
    assert fill.s3_peak == pytest.approx(link)
    older = update_rates(
        update_rates(None, {"s3": 0}, 0.0, 0.0, node_at=0.0), {"s3": int(0.7 * link)}, 0.0, 1.0,
        node_at=1.0,
    )  # fmt: skip
    assert older.s3_now == pytest.approx(0.7 * link)


def test_a_plan_tells_the_node_what_the_fleet_s_fetching_nodes_receive():
    """``fleet_down``, for the node's uplink pacer: the median of the fetching nodes'
    download peaks (one held below its link by its own uploads is judged by it), taken
    at most once a snapshot period, not at each of the fleet's reports."""
    planner = StripePlanner(stripe_bytes=8 * MiB)
    for node in "abc":
        assert _plan(planner, node, now=0.0).fleet_down == 0.0  # nothing measured yet
    _plan(planner, "a", now=1.0, s3=2 * MiB)
    _plan(planner, "b", now=1.1, s3=8 * MiB)
    c = _plan(planner, "c", now=1.2, s3=9 * MiB)
    assert c.fleet_down == pytest.approx(2 * MiB, rel=0.1)  # as of a's report, at 1.0
    c = _plan(planner, "c", now=2.0, s3=9 * MiB)
    assert c.fleet_down == pytest.approx(8 * MiB, rel=0.1)
    assert c.to_json()["fleet_down"] == round(c.fleet_down)
    from_json = OriginPlan.from_json(c.to_json())
    assert from_json is not None and from_json.fleet_down == pytest.approx(c.fleet_down, abs=1)
    # a node that finished is no longer among them
    _plan(planner, "c", now=2.5, complete=True, held=(1 << 64) - 1, s3=64 * MiB)
    a = _plan(planner, "a", now=3.0, s3=4 * MiB)
    assert a.fleet_down == pytest.approx(5 * MiB, rel=0.2)
