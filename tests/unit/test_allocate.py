"""The fleet allocator (swarm/coordinator/allocate.py) on the fleet bench's shapes."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from swarm.coordinator.allocate import Allocation, Mode, Snapshot, allocate, bound
from swarm.coordinator.capacity import (
    ALL_PROOF,
    DIRECT_HOLD,
    PEERS_WARMUP,
    PEERS_WARMUP_FAST,
    SNAPSHOT_PERIOD,
    SPARE_SHARE,
    WARMUP_PIECES,
    CapacityBook,
)
from swarm.coordinator.links import Link, snapshot
from swarm.coordinator.originmeter import MIX_SLOWED_PROOF, ORIGIN_WINDOW
from swarm.lab.scenarios import SCENARIOS, scenario

MBIT = 1e6 / 8
F = 128 << 20
SHAPES = sorted(SCENARIOS)


def fields(shape: str) -> tuple[float, float, float, int, float, int]:
    """(origin up, node up, node down, nodes, all seeders' upload) in Mbit/s, and F, as
    the fleet bench runs the shape."""
    c = scenario(shape)
    seeders = c["seeders"] * (c["seeder_up"] or c["node_up"])
    return c["origin_up"], c["node_up"], c["node_down"], c["nodes"], seeders, c["size"]


def snap(shape: str) -> Snapshot:
    origin, up, down, nodes, seeders, size = fields(shape)
    return Snapshot(size, nodes, down * MBIT, up * MBIT, origin * MBIT, seeders * MBIT)


def kumar_ross(shape: str) -> float:
    """T* written out again (not imported from the allocator or the bench)."""
    origin, up, down, nodes, seeders, size = fields(shape)
    servers = (origin + seeders) * MBIT
    return max(size / servers, size / (down * MBIT), nodes * size / (servers + nodes * up * MBIT))


@pytest.mark.parametrize("shape", SHAPES)
def test_predicted_finish_is_within_10_percent_of_the_bound(shape: str) -> None:
    plan = allocate(snap(shape))
    assert plan.finish == pytest.approx(kumar_ross(shape), rel=0.10)
    assert bound(snap(shape)) == pytest.approx(kumar_ross(shape), rel=1e-9)
    # and at a quarter of the rates (the bench's --rate-scale 0.25): four times longer
    c = scenario(shape, rate_scale=0.25)
    quarter = Snapshot(
        c["size"],
        c["nodes"],
        c["node_down"] * MBIT,
        c["node_up"] * MBIT,
        c["origin_up"] * MBIT,
        c["seeders"] * (c["seeder_up"] or c["node_up"]) * MBIT,
    )
    assert allocate(quarter).finish == pytest.approx(4 * kumar_ross(shape), rel=0.10)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_plan_is_feasible(shape: str) -> None:
    """Every node receives the plan's rate; S3 sends no more than it can: every byte once
    for the stripes (the seeders' share of them first), each direct byte once per node;
    the swarm's uploads (the nodes' and the seeders') carry the rest."""
    s = snap(shape)
    plan = allocate(s)
    rate = plan.rate
    assert rate <= s.down * (1 + 1e-9)
    assert plan.relay + plan.direct == pytest.approx(1.0)
    stripes_from_s3 = 0.0 if plan.mode is Mode.ALL else max(0.0, rate - s.seeders)
    direct = plan.direct * rate
    assert stripes_from_s3 + s.nodes * direct <= s.origin * (1 + 1e-6)
    through_swarm = s.nodes * plan.relay * rate - stripes_from_s3
    assert through_swarm <= (s.nodes * s.up + s.seeders) * (1 + 1e-6)


def test_modes_per_shape() -> None:
    """S3 fast enough for every node: all of it from S3. The origin the bottleneck: each
    piece leaves it once. In between: a direct share, larger where uploads are slow."""
    assert allocate(snap("s3-fast")).mode is Mode.ALL
    for shape in ("origin-bound", "existing-seeders"):
        plan = allocate(snap(shape))
        assert plan.mode is Mode.STRIPE and plan.direct == 0.0
    mixed, slow = allocate(snap("mixed")), allocate(snap("slow-uploads"))
    assert mixed.mode is Mode.MIX and 0.15 < mixed.direct < 0.35
    assert slow.mode is Mode.MIX and slow.direct > mixed.direct


def test_which_shapes_are_bound_by_their_downlinks() -> None:
    """swarm-bound's nodes take what their downlinks carry (T* = F/d): a byte received
    twice costs the fleet's end, and its plans say so; mixed's and slow-uploads' are
    bound by uploads (their downlinks have room), origin-bound's by the origin."""
    assert allocate(snap("swarm-bound")).link_bound
    assert allocate(snap("s3-fast")).link_bound
    for shape in ("mixed", "slow-uploads", "origin-bound"):
        assert not allocate(snap(shape)).link_bound, shape


def test_unlimited_s3_reads_everything_from_s3() -> None:
    s = Snapshot(F, 100, 250 * MBIT, 250 * MBIT, math.inf)
    plan = allocate(s)
    assert plan.mode is Mode.ALL and plan.finish == pytest.approx(F / (250 * MBIT))


def _report(
    book: CapacityBook,
    names: list[str],
    *,
    down: float,
    up: float,
    peers: float,
    complete: bool = False,
    backlog: int = 0,
    s3: float = 0.0,
    received: float | None = None,
) -> None:
    """Each of ``names`` reports its link peaks, peer rate and most S3 over one interval
    (Mbit/s) for one artifact, the bytes peers hold that it lacks, and what it received
    over its last interval (None: not known)."""
    now = -1.0 if received is None else received * MBIT
    for name in names:
        book.update(
            name, "ih", F, down_peak=down * MBIT, up_peak=up * MBIT, peers=peers * MBIT,
            complete=complete, piece_size=1 << 20, backlog=backlog, s3_peak=s3 * MBIT,
            received=now,
        )  # fmt: skip


def test_capacity_book_takes_s3_as_unlimited_while_it_beats_the_swarm() -> None:
    book = CapacityBook()
    six = [f"n{i}" for i in range(6)]
    _report(book, six, down=250, up=80, peers=80)
    # S3 gives each reader more than peers give a node: S3 is not the limit, once the
    # swarm had PEERS_WARMUP seconds to show its rate (before, a reader's peak is its
    # S3 rate and peers have little to give, in every shape)
    assert book.allocation("ih", 200 * MBIT, readers=6, now=0.0) is None
    plan_all = book.allocation("ih", 200 * MBIT, readers=6, now=PEERS_WARMUP)
    assert plan_all is not None and plan_all.mode is Mode.ALL
    # peers give a node 10x what S3 gives a reader: the origin is the bottleneck, so
    # each piece leaves it once
    book2 = CapacityBook()
    _report(book2, [f"n{i}" for i in range(8)], down=200, up=200, peers=180)
    assert book2.allocation("ih", 12 * MBIT, readers=8, now=0.0) is None  # warming up
    plan = book2.allocation("ih", 12 * MBIT, readers=8, now=PEERS_WARMUP)
    assert plan is not None and plan.mode is Mode.STRIPE
    assert book2.describe("ih") == {
        "mode": "stripe",
        "direct": 0.0,
        "predicted_seconds": round(F / (96 * MBIT), 2),
        "bound_seconds": round(F / (96 * MBIT), 2),
        "capacity": {
            "nodes": 8,
            "origin": round(96 * MBIT),
            "down": round(200 * MBIT),
            "up": round(200 * MBIT),
            "seeders": 0,
        },
    }
    # no peer traffic ever (seeders hold everything, nothing came yet): no allocation;
    # once peers have had their warm-up, S3 filling the nodes' links while peers give
    # nothing (every node WIDE or ALL) is ALL
    book3 = CapacityBook()
    book3.update(
        "n", "ih", F, down_peak=MBIT, up_peak=0.0, peers=0.0, complete=False, piece_size=1 << 20
    )
    assert book3.allocation("ih", MBIT, readers=1, now=5 * PEERS_WARMUP) is None
    _report(book, six, down=250, up=80, peers=0)  # up: the peak they have shown
    assert book.allocation("ih", 240 * MBIT, readers=6, now=PEERS_WARMUP + 1.5) == plan_all
    # ...but when every node reading S3 saturates it (a reader gets a fifth of its link),
    # the origin is the limit after all: no more ALL
    plan = book.allocation("ih", 50 * MBIT, readers=6, now=PEERS_WARMUP + 3.0)
    assert plan is not None and plan.mode is not Mode.ALL
    # recomputed at most once a second; departed nodes leave the book
    book2.forget([f"n{i}" for i in range(8)])
    assert book2.allocation("ih", 12 * MBIT, readers=8, now=PEERS_WARMUP + 5.0) is None


@pytest.mark.parametrize("rate_scale", [1.0, 0.25])
def test_a_fleet_whose_rates_stand_on_many_pieces_warms_up_in_one_interval(
    rate_scale: float,
) -> None:
    """The rates are counters of whole pieces over report intervals: where the median
    node's download peak is WARMUP_PIECES pieces per PEERS_WARMUP_FAST (s3-fast: 250
    Mbit links, 1 MiB pieces), one interval of peer traffic is enough; at a quarter of
    those rates (62.5 Mbit, 7-8 pieces a second) the book waits PEERS_WARMUP."""
    down = 250 * rate_scale
    fast = down * MBIT * PEERS_WARMUP_FAST >= WARMUP_PIECES * (1 << 20)
    assert fast == (rate_scale == 1.0)
    book = CapacityBook()
    six = [f"n{i}" for i in range(6)]
    _report(book, six, down=down, up=down, peers=down / 4)
    assert book.allocation("ih", down * MBIT, readers=6, now=0.0) is None  # peers seen
    early = book.allocation("ih", down * MBIT, readers=6, now=PEERS_WARMUP_FAST)
    assert (early is not None) == fast
    assert book.allocation("ih", down * MBIT, readers=6, now=PEERS_WARMUP) is not None


def test_a_few_fast_readers_do_not_make_all() -> None:
    """S3 counts as unlimited only once it fed as many readers as nodes fetch: the last
    two readers of an origin shared by eight get their link, which says nothing of
    what eight readers would get."""
    book = CapacityBook()
    eight = [f"n{i}" for i in range(8)]
    _report(book, eight, down=300, up=100, peers=40)
    assert book.allocation("ih", 280 * MBIT, readers=2, now=1.0) is None  # warming up
    plan = book.allocation("ih", 280 * MBIT, readers=2, now=1.0 + PEERS_WARMUP)
    assert plan is not None and plan.mode is not Mode.ALL
    # the same rate for all eight readers: S3 feeds every node at link speed
    plan = book.allocation("ih", 280 * MBIT, readers=8, now=2.0 + PEERS_WARMUP)
    assert plan is not None and plan.mode is Mode.ALL


def test_a_new_cohort_warms_up_again():
    """Seeders that fetched alone earlier leave no allocation (nor warm-up) behind for
    the nodes that fetch after them."""
    book = CapacityBook()
    seeders = ["s0", "s1"]
    _report(book, seeders, down=250, up=250, peers=100)
    earlier = book.allocation("ih", 240 * MBIT, readers=2, now=0.0)
    assert earlier is None  # warming up
    assert book.allocation("ih", 240 * MBIT, readers=2, now=PEERS_WARMUP + 1).mode is Mode.ALL
    _report(book, seeders, down=250, up=250, peers=0, complete=True)
    # far nodes: S3 over a WAN, nothing from peers yet
    _report(book, [f"n{i}" for i in range(4)], down=2, up=0, peers=0)
    assert book.allocation("ih", 2 * MBIT, readers=4, now=100.0) is None
    assert book.describe("ih") is None


def test_slow_uploads_shown_get_their_direct_share() -> None:
    """The mixed fleet: nodes take 300 Mbit but send 100. With their upload peaks the
    book plans the direct share the uploads cannot relay (as the allocator does from the
    scenario's capacities); counting uploads as fast as downloads planned stripes alone,
    and every node then widened on its own."""
    book = CapacityBook()
    eight = [f"n{i}" for i in range(8)]
    # peers hold 64 MiB each node lacks (over a second of its 300 Mbit) and send 90
    _report(book, eight, down=300, up=100, peers=90, backlog=64 << 20)
    assert book.allocation("ih", 50 * MBIT, readers=8, now=0.0) is None  # warming up
    plan = book.allocation("ih", 50 * MBIT, readers=8, now=PEERS_WARMUP)
    expected = allocate(snap("mixed"))
    assert plan is not None and plan.mode is Mode.MIX
    assert plan.direct == pytest.approx(expected.direct, abs=0.05)
    # a node whose counter says nothing yet: what peers receive came from uploads
    book2 = CapacityBook()
    _report(book2, eight, down=300, up=0, peers=90, backlog=64 << 20)
    book2.allocation("ih", 50 * MBIT, readers=8, now=0.0)
    plan = book2.allocation("ih", 50 * MBIT, readers=8, now=PEERS_WARMUP)
    assert plan is not None and plan.mode is not Mode.ALL and plan.direct < 0.5
    # no backlog: the uploads sent all there was to send (the origin-bound fleet relays
    # each fresh piece at once), so their peak says nothing of the link: stripes
    book3 = CapacityBook()
    _report(book3, eight, down=200, up=70, peers=80, backlog=4 << 20)
    book3.allocation("ih", 12 * MBIT, readers=8, now=0.0)
    plan = book3.allocation("ih", 12 * MBIT, readers=8, now=PEERS_WARMUP)
    assert plan is not None and plan.mode is Mode.STRIPE
    # a backlog once shown is remembered while the node fetches
    _report(book, eight, down=300, up=100, peers=90, backlog=0)
    plan = book.allocation("ih", 50 * MBIT, readers=8, now=PEERS_WARMUP + 1)
    assert plan is not None and plan.mode is Mode.MIX


def delivered(book: CapacityBook, names: list[str], mbit: float) -> None:
    """``names`` report S3 rates of ``mbit`` Mbit/s together, within one window."""
    step = ORIGIN_WINDOW / 2 / len(names)
    for i, node in enumerate(names):
        book.note_s3("ih", node, mbit * MBIT / len(names), now=i * step)


def test_the_origin_keeps_the_most_it_gave_its_readers_together() -> None:
    """slow-uploads: 8 readers took 1000 Mbit together while striping; once the plan
    put the nodes on peers, one reader at a time is left, and the per-reader rate times
    one reader made the origin look like 100 Mbit: stripes alone (4.5x T*)."""
    eight = [f"n{i}" for i in range(8)]

    def plan(book: CapacityBook):
        _report(book, eight, down=400, up=20, peers=20, backlog=64 << 20)
        book.allocation("ih", 100 * MBIT, readers=1, now=0.0)
        return book.allocation("ih", 100 * MBIT, readers=1, now=PEERS_WARMUP)

    forgetful = plan(CapacityBook())
    assert forgetful is not None and forgetful.direct < 0.5
    book = CapacityBook()
    _report(book, eight, down=400, up=20, peers=0)
    book.note_origin("ih", 1000 * MBIT)
    remembered = plan(book)
    expected = allocate(snap("slow-uploads"))
    assert remembered is not None and remembered.mode is Mode.MIX
    assert remembered.direct == pytest.approx(expected.direct, abs=0.05)


def test_an_origin_that_fed_every_link_at_once_is_all() -> None:
    """s3-fast: the six stripes left S3 in about a second, each node's at about its
    link's speed; afterwards a reader gets a fraction of its link because peers share
    the downlink, and the per-reader rate alone planned a small direct share (2.3x T*).
    Where the origin is the bottleneck a reader got a fraction of its link."""

    def plan(nodes: int, down: float, s3: list[float], together: float):
        book = CapacityBook()
        names = [f"n{i}" for i in range(nodes)]
        for name, most in zip(names, s3, strict=True):
            _report(book, [name], down=down, up=down, peers=80, s3=most)
        delivered(book, names, together)
        book.allocation("ih", 100 * MBIT, readers=2, now=0.0)
        return book.allocation("ih", 100 * MBIT, readers=2, now=PEERS_WARMUP)

    # nodes start a little apart: their stripes overlap in part
    fast = plan(6, 250, [220] * 6, together=1300)
    assert fast is not None and fast.mode is Mode.ALL
    # origin-bound: 100 Mbit for 8 nodes of 200; the first reader had it alone
    bound = plan(8, 200, [100] + [12.5] * 7, together=100)
    assert bound is not None and bound.mode is Mode.STRIPE
    # each node filled its link, but one after another: one link at a time
    apart = plan(6, 250, [250] * 6, together=250)
    assert apart is not None and apart.mode is not Mode.ALL
    # swarm-bound at a quarter: 250 Mbit for eight nodes of 50, each reader near its
    # link in the first second; the origin feeds five of the eight links, not all
    most = plan(8, 50, [44] * 8, together=250)
    assert most is not None and most.mode is not Mode.ALL
    # s3-fast at a quarter, the stripes read while peers shared the downlinks: each
    # reader's peak 0.56-0.95 of its link (median 0.76), together 78% of all six links
    shared = plan(6, 60, [33.4, 42.8, 44.9, 53.8, 57.1, 47.0], together=280)
    assert shared is not None and shared.mode is Mode.ALL
    # ...which a slow origin's readers never sum to, whatever their shares of it
    slow = plan(6, 60, [33.4, 42.8, 44.9, 53.8, 57.1, 47.0], together=200)
    assert slow is not None and slow.mode is not Mode.ALL


def test_on_the_fast_warm_up_the_origin_must_feed_the_fleets_links() -> None:
    """swarm-bound at full rates (1000 Mbit for eight nodes of 200), one second of peer
    traffic in: the nodes' peaks had not reached their links (median 20.4 MB/s of 25),
    and the readers' 124.5 MB/s at once was 0.76 of eight of those peaks; ALL then had
    every node read everything from the saturated origin. Of eight fleet links (22.9
    MB/s, the most any node moved) it is 0.68. s3-fast at full rates, its six readers
    at 0.93 of six fleet links, stays ALL."""
    rows = [  # (down, up, peers, S3 peak) as the coordinator's debug log gave them
        (21191611, 9607717, 4455971, 11237251),
        (22410211, 8466192, 2102796, 19901798),
        (21834562, 9878110, 4806152, 12836432),
        (22939245, 9038856, 4578291, 16100975),
        (19644429, 14596301, 2041206, 14488097),
        (18105774, 3460647, 776978, 17154618),
        (18525734, 11530884, 1919686, 15709004),
        (19173961, 9540512, 1104199, 19173961),
    ]
    links = [Link(down, up, peers, s3=s3) for down, up, peers, s3 in rows]

    def origin(links: list[Link], together: float, fine_rates: bool) -> float:
        snap = snapshot(F, links, [], 4e6, 8, together=together, fine_rates=fine_rates)
        assert snap is not None
        return snap.origin

    assert not math.isinf(origin(links, 124486617, fine_rates=True))
    assert math.isinf(origin(links, 124486617, fine_rates=False))  # as it went
    # s3-fast at full rates, as logged at its ALL: together 160.7 MB/s, median download
    # peak 28.3, fleet link 28.7; its per-node S3 peaks and peer rates were not logged
    # (27 and 0.5 here: the other two tests pass with them, as they did in that run)
    s3_fast = [Link(28.3e6, 28.7e6, 0.5e6, s3=27e6) for _ in range(6)]
    assert math.isinf(origin(s3_fast, 160.7e6, fine_rates=True))


def test_a_share_of_a_slow_origin_is_not_a_link_filled() -> None:
    """Origin-bound at a quarter of its rates, before peers gave much and before every
    piece left the origin: six of eight nodes had received only their S3 share (3
    Mbit), so their peaks showed it as their links; the two that had sent pieces to
    peers showed the links (50 Mbit). Neither the early ALL's test (:func:`~swarm.
    coordinator.links.fed_every_link`) nor an allocation on those peaks says ALL."""
    book = CapacityBook()
    names = [f"n{i}" for i in range(8)]
    _report(book, names[:6], down=3, up=0, peers=1, s3=3)
    _report(book, names[6:], down=10, up=50, peers=1, s3=3)
    delivered(book, names, 24)
    book.allocation("ih", 3 * MBIT, readers=8, now=0.0, only_all=True)
    plan = book.allocation("ih", 3 * MBIT, readers=8, now=PEERS_WARMUP, only_all=True)
    assert plan is None or plan.mode is not Mode.ALL


def test_stripes_read_together_count_though_the_first_snapshot_comes_after_them() -> None:
    """s3-fast with peers meeting early: every piece had left the origin (the first
    snapshot's condition) only once most stripes were done, and a sum of the S3 rates
    taken at the snapshot saw the last stripes only: MIX (peers took 57-74% of the
    bytes), where the six stripes had filled the six links at once."""
    book = CapacityBook()
    names = [f"n{i}" for i in range(6)]
    _report(book, names, down=250, up=250, peers=80, s3=220)
    delivered(book, names, 1300)  # the stripes, read at once
    for i, node in enumerate(names):  # done: the next reports carry no S3
        book.note_s3("ih", node, 0.0, now=2.0 + 0.1 * i)
    book.allocation("ih", 100 * MBIT, readers=1, now=3.0)
    plan = book.allocation("ih", 100 * MBIT, readers=1, now=3.0 + PEERS_WARMUP)
    assert plan is not None and plan.mode is Mode.ALL
    # the same rates one after another never summed to more than one link's: no ALL
    apart = CapacityBook()
    _report(apart, names, down=250, up=250, peers=80, s3=220)
    for i, node in enumerate(names):
        apart.note_s3("ih", node, 220 * MBIT, now=2.0 * i)
        apart.note_s3("ih", node, 0.0, now=2.0 * i + 1.0)
    apart.allocation("ih", 100 * MBIT, readers=1, now=13.0)
    plan = apart.allocation("ih", 100 * MBIT, readers=1, now=13.0 + PEERS_WARMUP)
    assert plan is not None and plan.mode is not Mode.ALL


def counted_reads(book: CapacityBook, names: list[str]) -> Callable[[float, float], None]:
    """``s3_now(mbit, at)``: each of ``names`` reports reading ``mbit`` Mbit/s over the
    last second, at ``at`` (a little apart), with its S3 byte counter."""
    totals = dict.fromkeys(names, 0)

    def s3_now(mbit: float, at: float) -> None:
        for i, node in enumerate(names):
            totals[node] += int(mbit * MBIT)
            book.note_s3(
                "ih", node, mbit * MBIT, now=at + 0.05 * i, total=totals[node], started=0.0
            )

    return s3_now


def _under_all(estimate: float, readers: int) -> tuple[CapacityBook, list[str]]:
    """Six 250 Mbit nodes whose stripes filled their links at once: ALL once the swarm
    has had its warm-up (at PEERS_WARMUP)."""
    book = CapacityBook()
    names = [f"n{i}" for i in range(6)]
    _report(book, names, down=250, up=250, peers=80, s3=220)
    delivered(book, names, 1300)
    book.allocation("ih", estimate, readers=readers, now=0.0)
    plan = book.allocation("ih", estimate, readers=readers, now=PEERS_WARMUP)
    assert plan is not None and plan.mode is Mode.ALL
    return book, names


def test_all_stands_until_the_fleet_read_at_full_width() -> None:
    """A snapshot right after ALL does not take it back: the stripes were read at
    slightly different moments and the nodes' peaks are still rising, and s3-fast went
    ALL, MIX, ALL in three seconds. After ALL_PROOF the origin has shown what it gives
    every node at once, and a snapshot may narrow the fleet again."""
    book, names = _under_all(100 * MBIT, readers=2)
    _report(book, names, down=500, up=250, peers=80, s3=220)  # peaks rise: 220 < 0.8 x 500
    soon = PEERS_WARMUP + ALL_PROOF - SNAPSHOT_PERIOD
    assert book.allocation("ih", 100 * MBIT, readers=6, now=soon).mode is Mode.ALL
    later = book.allocation("ih", 100 * MBIT, readers=6, now=PEERS_WARMUP + ALL_PROOF)
    assert later is not None and later.mode is not Mode.ALL


def test_all_stands_while_the_origin_gives_the_fleet_as_much() -> None:
    """A node's S3 peak may be from a moment it had the origin to itself; under ALL every
    node shares it. Each node getting under ALL_SLOWED of its peak is no slowdown while
    the fleet's byte counters show the origin giving what it gave: slow-uploads at a
    quarter of its rates had ALL taken back so while its origin sent all it could."""
    book, names = _under_all(200 * MBIT, readers=6)
    s3_now = counted_reads(book, names)
    t = 0.0
    while t < PEERS_WARMUP + ALL_PROOF:  # the stripes and ALL's first seconds: 150 each
        s3_now(150, t)
        book.allocation("ih", 200 * MBIT, readers=6, now=t + 0.5)
        t += SNAPSHOT_PERIOD
    _report(book, names, down=250, up=250, peers=80, s3=250)  # one interval each, alone
    for _ in range(4):  # 80 of 250 each (under a third); 480 together, of 900 at most
        s3_now(80, t)
        plan = book.allocation("ih", 200 * MBIT, readers=6, now=t + 0.5)
        assert plan is not None and plan.mode is Mode.ALL
        assert not book.measured_afresh("ih")
        t += SNAPSHOT_PERIOD
    for _ in range(3):  # 40 each, 240 together: a fifth, S3 slowed
        s3_now(40, t)
        book.allocation("ih", 200 * MBIT, readers=6, now=t + 0.5)
        t += SNAPSHOT_PERIOD
    assert book.measured_afresh("ih")


def test_all_stands_while_the_nodes_still_take_their_links_from_peers() -> None:
    """ALL reaches a node with its next report, and its reader takes it after the batch
    it is on: for a second or three the nodes still read their stripes and take most of
    their links from peers, S3 at a fraction of its peak. That is no slowed S3 (s3-fast
    at a quarter had ALL taken back so, and finished a second later on stripes); S3 that
    slows while the nodes receive next to nothing else is."""
    book, names = _under_all(200 * MBIT, readers=6)
    read = counted_reads(book, names)
    t = 0.0
    while t < PEERS_WARMUP + ALL_PROOF:  # the stripes: 150 each
        read(150, t)
        book.allocation("ih", 200 * MBIT, readers=6, now=t + 0.5)
        t += SNAPSHOT_PERIOD
    for _ in range(3):  # S3 at 40 of 220 each; peers 160 of their 250
        _report(book, names, down=250, up=250, peers=160, s3=220, received=200)
        read(40, t)
        plan = book.allocation("ih", 200 * MBIT, readers=6, now=t + 0.5)
        assert plan is not None and plan.mode is Mode.ALL
        t += SNAPSHOT_PERIOD
    assert not book.measured_afresh("ih")
    for _ in range(3):  # under ALL at last, and S3 gives them as little
        _report(book, names, down=250, up=250, peers=0, s3=220, received=40)
        read(40, t)
        book.allocation("ih", 200 * MBIT, readers=6, now=t + 0.5)
        t += SNAPSHOT_PERIOD
    assert book.measured_afresh("ih")


def test_all_is_taken_back_when_s3_slows_under_it() -> None:
    """Under ALL a node takes nothing from peers and its peaks are maxima: they went on
    saying that S3 filled every link, and a slowing S3 kept ALL for good (every node
    upload-only, reading at S3's new rate). S3's rates of the moment against the peaks
    take it back, and the origin is measured afresh: neither the old peaks nor the
    per-reader estimate that still remembers the fast S3 make ALL again; S3 filling every
    link at once again does."""
    book, names = _under_all(200 * MBIT, readers=6)
    read = counted_reads(book, names)

    def s3_now(mbit: float, at: float) -> None:
        read(mbit, at)
        book.note_origin("ih", 200 * MBIT * len(names))  # the readers' averages lag

    # at half the stripes' rate (CPU-bound nodes under ALL) ALL stands
    t = PEERS_WARMUP + ALL_PROOF
    s3_now(110, t)
    assert book.allocation("ih", 200 * MBIT, readers=6, now=t + 0.5).mode is Mode.ALL
    # S3 throttled to a tenth: ALL is taken back; the origin is what it gave since
    # (not the estimate of 200 Mbit per reader, nor the readers' lagging averages)
    t += SNAPSHOT_PERIOD
    s3_now(20, t)
    slowed = book.allocation("ih", 200 * MBIT, readers=6, now=t + 0.5)
    assert slowed is None or slowed.mode is not Mode.ALL
    for _ in range(3):
        t += SNAPSHOT_PERIOD
        s3_now(20, t)
        later = book.allocation("ih", 200 * MBIT, readers=6, now=t + 0.5)
        assert later is not None and later.mode is not Mode.ALL
        assert later.direct < 0.5
    # S3 recovers and fills every link at once: ALL again
    t += SNAPSHOT_PERIOD
    s3_now(240, t)
    recovered = book.allocation("ih", 200 * MBIT, readers=6, now=t + 0.5)
    assert recovered is not None and recovered.mode is Mode.ALL


def test_a_direct_share_is_read_only_once_it_held_two_snapshots() -> None:
    """A node reads its direct share at once and for good: a share that one snapshot's
    noise brought (origin-bound at the edge of MIX) would cost the origin for nothing."""
    book = CapacityBook()
    eight = [f"n{i}" for i in range(8)]
    _report(book, eight, down=300, up=100, peers=90, backlog=64 << 20)
    book.allocation("ih", 50 * MBIT, readers=8, now=0.0)
    plan = book.allocation("ih", 50 * MBIT, readers=8, now=PEERS_WARMUP)
    assert plan is not None and plan.mode is Mode.MIX
    assert book.direct_share("ih", PEERS_WARMUP) == 0.0  # one snapshot: not yet
    book.allocation("ih", 50 * MBIT, readers=8, now=PEERS_WARMUP + DIRECT_HOLD)
    assert book.direct_share("ih", PEERS_WARMUP + DIRECT_HOLD) == plan.direct
    # back to stripes (the origin turned out to be the limit): no share, and the hold
    # starts over
    book.allocation("ih", 5 * MBIT, readers=8, now=PEERS_WARMUP + 2 * DIRECT_HOLD)
    assert book.direct_share("ih", PEERS_WARMUP + 2 * DIRECT_HOLD) == 0.0
    # a cohort that ends on a held share leaves no hold to the next one
    book.allocation("ih", 50 * MBIT, readers=8, now=10.0)
    book.allocation("ih", 50 * MBIT, readers=8, now=11.0)
    assert book.direct_share("ih", 11.0) > 0
    _report(book, eight, down=300, up=100, peers=0, complete=True)
    _report(book, eight, down=300, up=100, peers=90, backlog=64 << 20)  # a new cohort
    book.allocation("ih", 50 * MBIT, readers=8, now=20.0)
    assert book.allocation("ih", 50 * MBIT, readers=8, now=20.0 + PEERS_WARMUP) is not None
    assert book.direct_share("ih", 20.0 + PEERS_WARMUP) == 0.0


def test_the_origin_gave_at_least_what_the_cohort_read_since_it_started() -> None:
    """s3-fast: six nodes read the whole object from S3 in a second and a half, in
    stripes that started apart; their averaged rates said 27 MB/s of the origin's 187,
    and the plan went to stripes alone. What the cohort read since its first fetch began,
    over that time, is a floor the origin gave for sure; it never exceeds what the origin
    sent (origin-bound: 100 Mbit for 8 nodes stays striped)."""
    six = [f"n{i}" for i in range(6)]

    def plan(mbit_read: float, seconds: float, down: float) -> Allocation | None:
        book = CapacityBook()
        _report(book, six, down=down, up=down, peers=down / 2)
        # peers seen from here: the book allocates PEERS_WARMUP later (it has read
        # nothing yet, so this says nothing of the origin)
        book.allocation("ih", 10 * MBIT, readers=6, now=seconds - PEERS_WARMUP)
        for i, node in enumerate(six):  # fetches started 0.1 s apart from t = 0
            share = int(mbit_read * MBIT * seconds / len(six))
            book.note_s3("ih", node, 0.0, now=seconds, total=share, started=0.1 * i)
        return book.allocation("ih", 10 * MBIT, readers=6, now=seconds)

    fast = plan(700, 1.5, down=250)  # 128 MiB in 1.5 s: the origin gave 700 Mbit at least
    assert fast is not None and fast.mode is Mode.MIX and fast.direct > 0.3
    forgetful = plan(0, 1.5, down=250)  # without the counters: the readers' 10 Mbit
    assert forgetful is not None and forgetful.mode is Mode.STRIPE
    bound = plan(100, 10.0, down=200)  # the origin-bound cohort: 100 Mbit over 10 s
    assert bound is not None and bound.mode is Mode.STRIPE


def test_an_origin_its_readers_leave_half_idle_has_room_for_fills() -> None:
    """Under MIX a node's direct share is bytes, read at full width and done: the
    origin then idles while uploads are the bottleneck. The book says so when the
    nodes' S3 rates of the last second sum to under SPARE_SHARE of the origin the
    allocation planned on; never for an unlimited origin or before an allocation."""
    book = CapacityBook()
    eight = [f"n{i}" for i in range(8)]
    _report(book, eight, down=300, up=100, peers=90, backlog=64 << 20)
    assert not book.origin_spare("ih")  # no snapshot yet
    book.allocation("ih", 50 * MBIT, readers=8, now=0.0)
    plan = book.allocation("ih", 50 * MBIT, readers=8, now=PEERS_WARMUP)
    assert plan is not None and plan.mode is Mode.MIX
    origin = 8 * 50 * MBIT  # what the snapshot planned on: the readers' rates together
    t = PEERS_WARMUP
    for i, node in enumerate(eight):  # reading at 90% of it
        book.note_s3("ih", node, 0.9 * origin / 8, now=t + 0.01 * i)
    assert not book.origin_spare("ih")
    t += 1.5  # a second later only two read, slowly: room
    for i, node in enumerate(eight):
        book.note_s3("ih", node, 0.1 * origin if i < 2 else 0.0, now=t + 0.01 * i)
    assert SPARE_SHARE > 0.2 and book.origin_spare("ih")  # the two read 0.2 of it
    # an origin taken as unlimited (ALL) never has "room": every node reads it at once
    fast = CapacityBook()
    six = [f"n{i}" for i in range(6)]
    _report(fast, six, down=250, up=80, peers=80)
    fast.allocation("ih", 300 * MBIT, readers=6, now=0.0)
    fast.allocation("ih", 300 * MBIT, readers=6, now=PEERS_WARMUP)
    assert not fast.origin_spare("ih")


def _under_mix() -> tuple[CapacityBook, list[str], float]:
    """The mixed fleet under its direct share, its origin's peak 400 Mbit; the time."""
    book = CapacityBook()
    eight = [f"n{i}" for i in range(8)]
    _report(book, eight, down=300, up=100, peers=90, backlog=64 << 20)
    book.note_origin("ih", 400 * MBIT)
    book.allocation("ih", 50 * MBIT, readers=8, now=0.0)
    plan = book.allocation("ih", 50 * MBIT, readers=8, now=PEERS_WARMUP)
    assert plan is not None and plan.mode is Mode.MIX
    book.allocation("ih", 50 * MBIT, readers=8, now=PEERS_WARMUP + DIRECT_HOLD)
    assert book.direct_share("ih", PEERS_WARMUP + DIRECT_HOLD) > 0
    return book, eight, PEERS_WARMUP + DIRECT_HOLD


def _reading(book: CapacityBook, names: list[str], mbit: float, at: float) -> None:
    """Each of ``names`` reports reading S3 at ``mbit`` Mbit/s (over its busy seconds)."""
    for i, node in enumerate(names):
        book.note_s3("ih", node, mbit * MBIT, now=at - 0.5 + 0.05 * i)


def test_a_direct_share_is_taken_back_when_s3_slows_under_it() -> None:
    """The origin's peak stands for the cohort, and the direct shares planned on it went
    on after the origin fell to an eighth: every node read a tenth of its bytes through
    it, pieces peers held, while pieces nobody held waited. Readers getting under a
    third of the peak for MIX_SLOWED_PROOF have the origin measured afresh: no share
    until it shows room again. (The per-reader estimate still remembers 50 Mbit.)"""
    book, eight, t = _under_mix()
    for _ in range(int(MIX_SLOWED_PROOF / SNAPSHOT_PERIOD)):  # 8 x 6 Mbit: 48 of 400
        t += SNAPSHOT_PERIOD
        _reading(book, eight, 6, t)
        book.allocation("ih", 50 * MBIT, readers=8, now=t)
        assert not book.measured_afresh("ih")  # not on one snapshot's say
    t += SNAPSHOT_PERIOD
    _reading(book, eight, 6, t)
    book.allocation("ih", 50 * MBIT, readers=8, now=t)
    assert book.measured_afresh("ih")
    assert book.direct_share("ih", t + DIRECT_HOLD) == 0.0


def test_a_direct_share_stands_while_its_readers_get_their_part() -> None:
    """Eight readers at 45 Mbit (360 of 400), or one reader at half its 300 Mbit link
    while the others idle (a few readers cannot take the origin's peak): no slowdown."""
    for readers, each in ((8, 45.0), (1, 150.0)):
        book, eight, t = _under_mix()
        for _ in range(4):
            t += SNAPSHOT_PERIOD
            _reading(book, eight[:readers], each, t)
            _reading(book, eight[readers:], 0, t)
            plan = book.allocation("ih", 50 * MBIT, readers=readers, now=t)
            assert plan is not None and plan.mode is Mode.MIX
        assert not book.measured_afresh("ih")
