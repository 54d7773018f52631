"""The coordinator's incremental state (issue 12) against brute force, and its bounds
(issue 15): planner availability counts and stripes, announce ranking of large swarms,
membership epochs, node TTLs and caps. No sockets; clocks are floats."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.coordinator.app import make_app
from swarm.coordinator.fleet import (
    MEMBERS_FULL_NODES,
    MEMBERS_FULL_PERIOD,
    RANK_PERIOD,
    StoreFull,
    full_list_period,
)
from swarm.coordinator.handlers import handle_report
from swarm.coordinator.holders import (
    FETCHERS_TTL,
    MAX_PLAN_HOLDERS,
    MAX_PLAN_PEERS,
    SEEDERS_TTL,
    RecentFetchers,
    SeederCache,
    seeders_for,
)
from swarm.coordinator.load import (
    MEMBERS_CHANGED_INTERVAL,
    members_changed_interval,
    report_interval,
)
from swarm.coordinator.memorystore import MemoryPeerStore
from swarm.coordinator.origin import MAX_STRIPE_PIECES, StripePlanner
from swarm.coordinator.planstate import GeometryError, MemoryPlanState, PlanState
from swarm.coordinator.ranking import rank_peers
from swarm.coordinator.reports import PeerRecord, parse_report
from swarm.coordinator.tracker import Announce

MiB = 1 << 20
HASH = "ab" * 20


def plan(planner: StripePlanner, node: str, held: int, now: float, count: int = 64, **kw):
    return planner.plan(
        node,
        HASH,
        piece_size=MiB,
        count=count,
        held=held,
        complete=kw.get("complete", False),
        counters={"s3": kw.get("s3", 0), "peers": 0},
        up_rate=0.0,
        now=now,
        interval=kw.get("interval", 1.0),
    )


# -- planner: incremental state equals brute force ------------------------------------------

steps = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=5),  # node
        st.integers(min_value=0, max_value=2**40 - 1),  # bits it holds now
        st.booleans(),  # departs instead
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(steps=steps)
def test_availability_and_stripes_match_brute_force(steps) -> None:
    count = 40
    state = MemoryPlanState()
    planner = StripePlanner(stripe_bytes=4 * MiB, max_readers=3, state=state)
    held: dict[str, int] = {}
    stripes: dict[str, list[int]] = {}
    now = 0.0
    for index, value, departs in steps:
        node = f"n{index}"
        now += 0.5
        if departs:
            planner.forget([node])
            held.pop(node, None)
            stripes.pop(node, None)
            continue
        held[node] = value
        complete = value == (1 << count) - 1
        stripes[node] = plan(planner, node, value, now, count=count, complete=complete).stripe
        union = 0
        for bits in held.values():
            union |= bits
        expected = [sum(v >> p & 1 for v in held.values()) for p in range(count)]
        assert state.availability(HASH) == (expected if held else [])
        # a stripe holds nobody's pieces, at most 4 (4 MiB of 1 MiB pieces)
        assert all(not union >> p & 1 for p in stripes[node])
        assert len(stripes[node]) <= 4
    # stripes handed out are disjoint among the nodes still holding them
    union = 0
    for bits in held.values():
        union |= bits
    if held:
        art = state._artifacts[HASH]
        owned = [p for stripe in art.stripes.values() for p in stripe]
        assert len(owned) == len(set(owned))
        assert art.union == union and art.assigned == sum(1 << p for p in owned)
        assert len(art.stripes) <= 3


def test_geometry_is_fixed_by_the_first_report_and_forgotten_with_the_last_node() -> None:
    planner = StripePlanner()
    plan(planner, "a", 0, 0.0, count=64)
    planner.check(HASH, MiB, 64)
    with pytest.raises(GeometryError, match="has 64 pieces of 1048576 bytes here"):
        planner.check(HASH, MiB, 65)
    planner.forget(["a"])
    planner.check(HASH, MiB, 65)  # nobody holds it any more: a new geometry may start


def test_planner_state_is_bounded() -> None:
    # room for one artifact of 64 pieces and two nodes' bitfields, not a third
    state = MemoryPlanState(max_artifacts=1, budget=64 * 4 + 2 * (8 + 64))
    planner = StripePlanner(state=state)
    assert plan(planner, "a", 0, 0.0).stripe and plan(planner, "b", 0, 0.0).stripe
    assert plan(planner, "c", 0, 0.0).stripe == []  # no plan: c decides alone
    other = planner.plan(
        "a", "cd" * 20, piece_size=MiB, count=8, held=0, complete=False,
        counters={}, up_rate=0.0, now=0.0,
    )  # fmt: skip
    assert other.stripe == [] and state.availability("cd" * 20) == []
    planner.forget(["a", "b"])
    assert state.used == 0 and plan(planner, "c", 0, 1.0).stripe


def test_a_stripe_is_capped_and_stalls_scale_with_the_interval() -> None:
    planner = StripePlanner(stall_seconds=6.0)
    plan(planner, "a", 0, 0.0, count=4096)
    fast = plan(planner, "a", 0, 1.0, count=4096, s3=10_000 * MiB)  # 10 GB/s
    assert len(fast.stripe) == MAX_STRIPE_PIECES
    # at a 5 s report interval, 8 s without news is not a stall (2 x 5 s is)
    b = plan(planner, "b", 0, 8.0, count=4096, interval=5.0)
    assert set(b.stripe).isdisjoint(fast.stripe)
    c = plan(planner, "c", 0, 12.0, count=4096, interval=5.0)
    assert set(c.stripe) & set(fast.stripe)  # 11 s > 10 s: a's stripe was released


def seeded(node: str, *pieces: tuple[str, int]) -> dict[str, object]:
    """A report listing, per (info_hash, held pieces), a 64-piece artifact."""
    full = (1 << 64) - 1
    return {
        "node": node,
        "addr": "10.0.0.1:6881",
        "artifacts": [
            {
                "info_hash": info_hash,
                "name": "x",
                "size": 64 * MiB,
                "have_bytes": held.bit_count() * MiB,
                "complete": held == full,
                "bytes_by_source": {"s3": 0},
                "down_rate": 0,
                "up_rate": 0,
                "piece_size": MiB,
                "piece_count": 64,
                # piece 0 is the high bit of byte 0 (BitTorrent order)
                "pieces": base64.b64encode(
                    int(format(held, "064b")[::-1], 2).to_bytes(8, "big")
                ).decode(),
            }
            for info_hash, held in pieces
        ],
    }


def stops_listing_leaves_the_union(state: PlanState) -> None:
    """A seeder whose data was deleted reports without the artifact: its pieces leave
    the union at once (not when the node expires), so a fresh node is striped to read
    them from S3 again instead of waiting to go WIDE. Shared with the Redis plan state's
    test."""
    planner = StripePlanner(stripe_bytes=4 * MiB, state=state)
    app = make_app(planner=planner)
    other, full = "cd" * 20, (1 << 64) - 1

    def send(body: dict[str, object], now: float) -> dict[str, object]:
        outcome = handle_report(app, parse_report(body), body, now)
        assert outcome.error is None
        return outcome.plans

    send(seeded("seeder", (HASH, full), (other, full)), 0.0)
    assert send(seeded("a", (HASH, 0)), 0.5)[HASH]["stripe"] == []  # all held: no S3
    send(seeded("seeder", (other, full)), 1.0)  # HASH deleted under it
    assert planner.availability(HASH) == [0] * 64
    assert send(seeded("b", (HASH, 0)), 1.5)[HASH]["stripe"] == [0, 1, 2, 3]
    # the artifact it still lists is untouched
    assert planner.availability(other) == [1] * 64
    send(seeded("seeder"), 2.0)  # lists nothing: nothing of it is left
    assert planner.availability(other) == []


def test_an_artifact_a_node_stops_listing_leaves_the_union() -> None:
    state = MemoryPlanState()
    stops_listing_leaves_the_union(state)
    assert state.known_nodes() == {"a", "b"}


def flowing_bytes_are_progress(state: PlanState) -> None:
    """A stripe whose S3 bytes flow is not stalled, a piece finished or not: at a slow
    origin's share (eight readers of 25 Mbit) a reader's first piece came after the
    stall, and its stripe went to another node while it read on. A reader with neither
    still loses it. Shared with the Redis plan state's test."""
    planner = StripePlanner(stripe_bytes=8 * MiB, stall_seconds=5.0, state=state)
    a = plan(planner, "a", 0, 0.0).stripe
    b = plan(planner, "b", 0, 0.0).stripe
    for second in range(1, 6):
        plan(planner, "a", 0, float(second), s3=second * 300_000)  # 300 KB/s
        plan(planner, "b", 0, float(second))  # nothing
    c = plan(planner, "c", 0, 5.5).stripe  # b stalled 5.5 s
    assert c == b and a == list(range(8))


def readers_are_counted_once(state: PlanState) -> None:
    """Each node reading the origin is in a view's readers once, the reporting node
    first: the planner multiplies the per-reader rate by their count (the in-memory
    state listed the reporting node twice: nine readers in a fleet of eight). Shared
    with the Redis plan state's test."""
    planner = StripePlanner(stripe_bytes=4 * MiB, state=state)
    for node in ("a", "b", "c"):
        plan(planner, node, 0, 0.0, s3=0)
    for node in ("a", "b", "c"):
        plan(planner, node, 0, 1.0, s3=MiB)
    view = state.load("b", HASH, MiB, 64)
    assert view is not None
    assert view.reader_s3[0][0] == "b"
    assert sorted(n for n, _ in view.reader_s3) == ["a", "b", "c"]


def test_readers_are_counted_once() -> None:
    readers_are_counted_once(MemoryPlanState())


def test_flowing_bytes_are_progress() -> None:
    flowing_bytes_are_progress(MemoryPlanState())


# -- tracker: a large swarm ----------------------------------------------------------------


def announce(n: int, left: int = 0, numwant: int = 50) -> Announce:
    return Announce(
        info_hash=b"\x01" * 20,
        peer_id=b"-TEST00-" + n.to_bytes(12, "big"),
        port=6881,
        uploaded=0,
        downloaded=0,
        left=left,
        numwant=numwant,
    )


def test_a_large_swarm_is_served_from_its_ranking() -> None:
    store = MemoryPeerStore()
    for n in range(2000):
        store.announce(announce(n, left=0 if n < 1000 else n), f"10.9.{n >> 8}.{n & 255}", 0.0)
    picks = []
    for requester in range(5000, 5040):
        ip = f"10.8.0.{requester - 4999}"
        got = store.announce(announce(requester, left=10**9), ip, 0.5)
        assert len(got) == 50 and len({p.peer_id for p in got}) == 50
        assert all(int.from_bytes(p.peer_id[8:], "big") < 1000 for p in got)  # seeders
        picks.append(got[0].peer_id)
    # each requester its own slice of the 1,000 equal seeders, not all the same five
    assert len(set(picks)) > 30
    # the same requester again (within the ranking's period): the same slice
    again = store.announce(announce(5000, left=10**9), "10.8.0.1", 0.6)
    first = store.announce(announce(5000, left=10**9), "10.8.0.1", 0.7)
    assert again == first


def test_a_large_swarm_ranks_by_spare_upload_then_left() -> None:
    store = MemoryPeerStore()
    for n in range(300):
        store.announce(announce(n, left=1000 + n), f"10.7.{n >> 8}.{n & 255}", 0.0)
    store.set_spare("10.7.0.200:6881", 50 * MiB)  # an idle uploader
    got = store.announce(announce(999, left=10**9, numwant=5), "10.6.0.1", RANK_PERIOD + 1)
    expected = rank_peers(
        store.peers(b"\x01" * 20, RANK_PERIOD + 1),
        announce(999).peer_id,
        5,
        ("10.6.0.1", 6881),
        {("10.7.0.200", 6881): 50 * MiB},
    )
    assert got == [p.peer for p in expected]
    assert got[0].ip == "10.7.0.200" and [p.port for p in got] == [6881] * 5


def test_peer_and_node_caps() -> None:
    store = MemoryPeerStore(max_peers=2, max_nodes=1, node_budget=10_000)
    store.announce(announce(1), "10.0.0.1", 0.0)
    store.announce(announce(2), "10.0.0.2", 0.0)
    store.announce(announce(1), "10.0.0.1", 1.0)  # a known peer re-announces
    with pytest.raises(StoreFull, match="holds 2 peers"):
        store.announce(announce(3), "10.0.0.3", 1.0)
    store.report(parse_report(report_body("a")), 0.0)
    with pytest.raises(StoreFull, match="1 nodes"):
        store.report(parse_report(report_body("b")), 0.0)
    with pytest.raises(StoreFull, match="budget"):  # a's report grows past the budget
        store.report(parse_report(report_body("a", artifacts=40)), 0.0)
    assert store.expire(100.0) == (2, 1)  # all stale: room again
    store.report(parse_report(report_body("b")), 100.0)


def report_body(node: str, artifacts: int = 1) -> dict[str, object]:
    return {
        "node": node,
        "addr": "10.0.0.1:6881",
        "artifacts": [
            {
                "info_hash": f"{k:040x}",
                "name": "x",
                "size": MiB,
                "have_bytes": 0,
                "complete": False,
                "bytes_by_source": {"s3": 0},
                "down_rate": 0,
                "up_rate": 0,
                "piece_size": MiB,
                "piece_count": 1,
                "pieces": base64.b64encode(b"\x00").decode(),
            }
            for k in range(artifacts)
        ],
    }


def test_stored_reports_drop_bitfields_and_follow_their_ttl() -> None:
    store = MemoryPeerStore(report_ttl=10)
    store.report(parse_report(report_body("a")), 0.0, ttl=30.0)
    (state,) = store.nodes(29.0)
    assert state.report.artifacts[0].pieces is None  # the planner keeps those
    assert store.nodes(30.5) == [] and store.expire(31.0) == (0, 1)
    assert store.departed() == ["a"] and store.departed() == []


# -- membership ----------------------------------------------------------------------------


def test_membership_log_replays_to_the_current_list() -> None:
    store = MemoryPeerStore(generation="g")
    held: set[str] = set()
    epoch = None
    members = store.members(None, 0.0)
    assert members.members == "[]" and members.epoch == "g.0"
    for step in range(200):
        node = f"n{step % 37}"
        body = report_body(node)
        body["addr"] = f"10.5.{step % 11}.1:{6000 + step % 37}"
        store.report(parse_report(body), float(step), ttl=20.0)
        store.expire(float(step))
        if step % 7 == 0:  # a node that reports now and then, applying what it is told
            reply = store.members(epoch, float(step))
            if reply.members is not None:
                held = set(json.loads(reply.members))
            for op in json.loads(reply.delta or "[]"):
                (held.add if op[0] == "+" else held.discard)(op[1:])
            epoch = reply.epoch
            # the whole list may be a second old; the next reply brings the rest
            reply = store.members(epoch, float(step))
            for op in json.loads(reply.delta or "[]"):
                (held.add if op[0] == "+" else held.discard)(op[1:])
            epoch = reply.epoch
            live = {s.report.addr.rpartition(":")[0] for s in store.nodes(float(step))}
            assert held == live and reply.members is None
    # another generation's epoch is never current
    assert store.members("other.3", 300.0).members is not None


def test_a_node_joining_a_small_fleet_gets_the_nodes_that_joined_just_before() -> None:
    """Its first list is its peer filter until its next report: a list a second old
    would refuse the nodes of its own scale-out (far-region's four joined in 0.1 s)."""
    store = MemoryPeerStore(generation="g")
    for step, node in enumerate("abcd"):
        body = report_body(node)
        body["addr"] = f"10.0.0.{step + 1}:6881"
        store.report(parse_report(body), step * 0.03, ttl=20.0)
        first = store.members(None, step * 0.03)
        assert first.members is not None and len(json.loads(first.members)) == step + 1
    # a list as long as MEMBERS_FULL_NODES is reused for the whole period
    assert full_list_period(4) < 0.001
    assert full_list_period(MEMBERS_FULL_NODES) == full_list_period(10**6) == MEMBERS_FULL_PERIOD


def test_report_interval_follows_the_budget() -> None:
    assert report_interval(0, 2000) == 1.0
    assert report_interval(2000, 2000) == 1.0
    assert report_interval(5000, 2000) == 2.5
    assert report_interval(5000, 2000, coordinators=2) == 1.5
    assert report_interval(10**6, 2000) == 15.0


def test_a_changed_member_list_shortens_the_interval_within_the_budget() -> None:
    assert members_changed_interval(8, 2000) == MEMBERS_CHANGED_INTERVAL
    assert members_changed_interval(250, 2000) == 0.25
    # the whole fleet so would take at most half the budget
    assert members_changed_interval(500, 2000) == 0.5
    assert members_changed_interval(1000, 2000) == 1.0  # = report_interval: no change
    assert members_changed_interval(1000, 2000, coordinators=4) == MEMBERS_CHANGED_INTERVAL


def test_the_load_governor_stretches_fast_and_shrinks_slowly() -> None:
    from swarm.coordinator.load import LAG_HIGH, LAG_LOW, MAX_LOAD_FACTOR, govern

    factor = 1.0
    for _ in range(3):  # a loop 50+ ms late for three seconds: x1.5 each second
        factor = govern(factor, LAG_HIGH * 2)
    assert factor == pytest.approx(3.375)
    assert govern(factor, (LAG_HIGH + LAG_LOW) / 2) == factor  # in between: hold
    for _ in range(100):
        factor = govern(factor, 0.0)
    assert factor == 1.0
    for _ in range(100):
        factor = govern(factor, 1.0)
    assert factor == MAX_LOAD_FACTOR


class _CountingStore(MemoryPeerStore):
    """The real in-memory store, counting its whole-swarm reads."""

    reads = 0

    def peers(self, info_hash: bytes, now: float) -> list[PeerRecord]:
        self.reads += 1
        return super().peers(info_hash, now)


def test_plans_name_a_few_seeders_per_node_from_one_read_a_second() -> None:
    """At a scale-out every new node asks for seeders in each report until it holds a
    piece: the store's swarm is read once a SEEDERS_TTL, and a node is named the same
    MAX_PLAN_HOLDERS of many seeders each time, others than the next node."""
    store = _CountingStore()
    for n in range(20):
        seed = Announce(bytes.fromhex(HASH), bytes([n]) * 20, 6881, 0, 0, left=0)
        store.announce(seed, f"10.0.0.{n + 1}", 0.0)
    store.announce(Announce(bytes.fromhex(HASH), b"x" * 20, 6881, 0, 0, left=9), "10.0.1.1", 0.0)
    cache = SeederCache()

    def named(node: str, addr: str, now: float) -> list[str]:
        report = parse_report(seeded(node, (HASH, 0)) | {"addr": addr})
        return seeders_for(cache, store, HASH, report, now)

    first = named("a", "10.0.1.1:6881", 0.0)
    assert len(set(first)) == MAX_PLAN_HOLDERS and all(ip.startswith("10.0.0.") for ip in first)
    assert named("a", "10.0.1.1:6881", 0.5) == first
    assert named("b", "10.0.1.2:6881", 0.6) != first
    assert "10.0.0.3" not in named("s", "10.0.0.3:6881", 0.7)  # a seeder is not its own
    assert store.reads == 1
    named("a", "10.0.1.1:6881", 0.0 + SEEDERS_TTL)
    assert store.reads == 2


def test_the_fetchers_named_to_a_new_node_are_the_latest_few() -> None:
    """A scale-out of many nodes: a new node is told at most MAX_PLAN_PEERS, the latest."""
    fetchers = RecentFetchers()
    for n in range(MAX_PLAN_PEERS + 5):
        report = parse_report(seeded(f"n{n}", (HASH, 0)) | {"addr": f"10.0.1.{n}:6881"})
        fetchers.note(report, n / 2)  # a report every half second
    now = (MAX_PLAN_PEERS + 5) / 2
    named = fetchers.others(HASH, "10.0.9.9:6881", now)
    assert len(named) == MAX_PLAN_PEERS
    assert named[0] == f"10.0.1.{MAX_PLAN_PEERS + 4}:6881" and "10.0.1.4:6881" not in named
    assert fetchers.others("cd" * 20, "10.0.9.9:6881", now) == []
    # the same host on another port is not named to itself; nor is a node gone quiet
    assert "10.0.1.20:6881" not in fetchers.others(HASH, "10.0.1.20:7000", now)
    later = fetchers.others(HASH, "10.0.9.9:6881", 5 / 2 + FETCHERS_TTL + 0.25)
    assert later == [f"10.0.1.{n}:6881" for n in range(MAX_PLAN_PEERS + 4, 5, -1)]
