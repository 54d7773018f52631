"""The automatic UDP source: its choices (pure, :mod:`swarm.agent.udpchoice`): when to
probe, when to stay, what to pull; the rate it competes with; and the round-trip probes
(:mod:`swarm.agent.rtt`), on real sockets."""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import socket
from collections.abc import Iterator

import pytest

from swarm.agent import rtt as rtt_module
from swarm.agent import udpauto, udplane
from swarm.agent.rtt import (
    connect_rtt,
    endpoint_round_trip,
    handshake_rtt,
    kernel_min_rtts,
    least_round_trip,
)
from swarm.agent.udpchoice import (
    HOLDER_WAIT,
    NEAR_RTT,
    OWNER_HORIZON,
    OWNER_NEXT,
    OWNER_STALL,
    PROBE_BACKOFF,
    PROBE_BACKOFF_CAP,
    PROBE_SECONDS,
    RELIEF_MIN_PIECES,
    SESSION_BYTES,
    SESSION_SECONDS,
    START_AFTER,
    Holder,
    OwnerProgress,
    UdpChoice,
    batch_pieces,
    best_holder,
    lane_part,
    owners_next,
    region_order,
    region_shares,
    relief_pieces,
    s3_far,
    share_lacking,
    udp_wanted,
    with_seeders,
)
from swarm.messages import OriginPlan

MiB = 1 << 20


def test_a_near_fleet_never_tries_udp() -> None:
    choice = UdpChoice(started_at=0.0)
    assert choice.session_bytes(START_AFTER / 2, 0.0, 100 * MiB) == 0  # TCP still starting
    # TCP at 25 MB/s finishes 100 MiB in 4 s: not worth a session
    assert choice.session_bytes(START_AFTER, 25e6, 100 * MiB) == 0


def test_slow_tcp_gets_a_session_that_goes_on_while_udp_is_faster() -> None:
    choice = UdpChoice(started_at=0.0)
    # TCP crawls at 0.5 MB/s (a far region): a session
    assert choice.session_bytes(START_AFTER, 0.5e6, 100 * MiB) == SESSION_BYTES
    assert choice.keep(PROBE_SECONDS / 2, udp_rate=0.0, tcp_rate=0.5e6)  # still starting
    assert choice.keep(PROBE_SECONDS, udp_rate=20e6, tcp_rate=0.5e6)
    # it ran its course at 20 MB/s: the next one at once, eight seconds of that rate
    choice.ended(START_AFTER + 2, udp_rate=20e6, paid=True)
    assert choice.session_bytes(START_AFTER + 2, 0.5e6, 1 << 30) == int(20e6 * SESSION_SECONDS)
    # TCP caught up (the path healed): the session stops, the next try waits
    assert not choice.keep(PROBE_SECONDS, udp_rate=20e6, tcp_rate=15e6)
    choice.ended(START_AFTER + 10, udp_rate=20e6, paid=False)
    assert choice.session_bytes(START_AFTER + 11, 0.5e6, 100 * MiB) == 0
    assert choice.session_bytes(START_AFTER + 10 + PROBE_BACKOFF, 0.5e6, 100 * MiB) > 0


def test_failed_tries_back_off_doubling() -> None:
    choice = UdpChoice(started_at=0.0)
    now = START_AFTER
    waits = []
    for _ in range(4):
        assert choice.session_bytes(now, 0.0, 100 * MiB) > 0
        choice.ended(now, udp_rate=0.0, paid=False)  # nobody answered
        waits.append(choice.next_try_at - now)
        now = choice.next_try_at
    assert waits == pytest.approx([PROBE_BACKOFF * 2**k for k in range(4)])


def test_a_holder_failing_lets_the_next_be_tried_at_once() -> None:
    """A session that failed on its holder (the server closed the connection) says
    nothing of UDP against TCP: the next holder is tried at once, at the last rate."""
    choice = UdpChoice(started_at=0.0)
    choice.ended(START_AFTER, udp_rate=20e6, paid=True)
    choice.failed(START_AFTER + 1)
    assert choice.session_bytes(START_AFTER + 1, 0.5e6, 1 << 30) == int(20e6 * SESSION_SECONDS)
    assert choice.backoff == PROBE_BACKOFF


def test_no_holder_yet_is_not_a_failed_try() -> None:
    """In the fetch's first second libtorrent has no holder connected: look again soon,
    and the backoff stays as it was (it once doubled to 10 s, and far nodes were a third
    done before their first UDP datagram)."""
    choice = UdpChoice(started_at=0.0)
    choice.no_holder(START_AFTER)
    assert choice.next_try_at == START_AFTER + HOLDER_WAIT
    assert choice.backoff == PROBE_BACKOFF
    assert choice.session_bytes(START_AFTER + HOLDER_WAIT, 0.0, 100 * MiB) > 0


def test_only_near_holders_are_looked_at_again_later_each_time() -> None:
    choice = UdpChoice(started_at=0.0)
    now, waits = START_AFTER, []
    for _ in range(14):
        choice.all_near(now)
        waits.append(choice.next_try_at - now)
        now = choice.next_try_at
    assert waits[:3] == pytest.approx([HOLDER_WAIT, 2 * HOLDER_WAIT, 4 * HOLDER_WAIT])
    assert max(waits) == PROBE_BACKOFF_CAP


class _Peer:
    def __init__(self, ip: str, rate: int) -> None:
        self.ip, self.payload_down_speed = (ip, 6881), rate


class _Handle:
    def __init__(self, peers: list[_Peer]) -> None:
        self.peers = peers

    def get_peer_info(self) -> list[_Peer]:
        return self.peers


class _Holding:
    """A connected peer as ``get_peer_info`` gives it: its address, flags, bitfield."""

    def __init__(self, ip: str, pieces: list[bool]) -> None:
        self.ip, self.flags, self.pieces = (ip, 6881), 0, pieces


def test_running_sessions_skip_what_the_region_holds() -> None:
    """What a near peer holds comes through the region's exchange: a session skips it.
    A far holder's pieces (the seeder the sessions pull from) are not skipped, nor a
    near peer's before the kernel has timed its connection."""
    near = _Holding("10.0.0.2", [True, False, True, False])
    far = _Holding("10.0.1.1", [True] * 4)
    untimed = _Holding("10.0.0.3", [False, True, False, False])
    region_held = udpauto.RegionHeld()
    assert not region_held(0)  # nothing looked at yet
    rtts = {"10.0.0.2": 0.001, "10.0.1.1": 0.1}
    region_held.look([near, far, untimed], "10.0.0.9", rtts)
    assert [i for i in range(4) if region_held(i)] == [0, 2]
    region_held.look([near, far, untimed], "10.0.0.9", {**rtts, "10.0.0.3": 0.001})
    assert [i for i in range(4) if region_held(i)] == [0, 1, 2]
    # the S3 reader waits only while the region holds every missing piece
    assert region_held.holds([0, 2]) and region_held.holds([1])
    assert not region_held.holds([2, 3])  # piece 3 only the far seeder has
    assert not region_held.holds([])


def test_a_session_competes_with_tcp_from_its_own_holder() -> None:
    """Not with S3 nor other holders (other paths: what they bring adds to UDP's); every
    connection to the holder counts."""
    handle = _Handle([_Peer("10.0.0.2", 20_000_000), _Peer("10.0.0.3", 1_000_000),
                      _Peer("10.0.0.3", 500_000)])  # fmt: skip
    assert udplane.tcp_rate_from(handle, "10.0.0.3") == 1_500_000
    assert udplane.tcp_rate_from(handle, "10.0.0.9") == 0.0


@pytest.mark.parametrize(
    ("delivered_bps", "ask"),
    [
        (None, None),  # nothing measured: the default ask
        (0.0, None),
        (40e6, 80_000_000),  # twice what the path delivered
        (1e6, udpauto.MIN_ASK_BPS),  # never below the floor
        (900e6, udpauto.DEFAULT_RATE_BPS),  # never above a 1 Gbit/s NIC
    ],
)
def test_the_next_session_asks_for_twice_what_the_holder_delivered(
    delivered_bps: float | None, ask: int | None
) -> None:
    assert udpauto.next_ask(delivered_bps) == ask


def test_sessions_take_what_the_holder_has_in_this_nodes_order() -> None:
    by_index = int  # an order that is the pieces' own
    half = Holder("10.0.0.2", seed=False, pieces=[True] * 5 + [False] * 5)
    missing = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert batch_pieces(missing, half, in_flight={1}, count=3, order=by_index) == [0, 2, 3]
    seed = Holder("10.0.0.3", seed=True, pieces=[True] * 10)
    backwards = lambda i: -i  # noqa: E731
    assert batch_pieces(missing, seed, in_flight={9}, count=2, order=backwards) == [8, 7]
    # what a near peer holds is the region's exchange; what libtorrent downloads comes last
    got = batch_pieces(
        missing, half, in_flight={2, 4}, count=5, order=by_index, nearby=frozenset({0, 1, 4})
    )
    assert got == [3, 2]


def test_a_few_pieces_left_are_split_between_the_holders_free_now() -> None:
    """Sessions that could fill their limit take it whole; a short list (the region's
    last pieces) is split evenly between the sessions that could start now, each from
    another holder; alone, one session takes it all."""
    many = list(range(16))
    assert lane_part(many, limit=16, lanes=2) == many
    assert lane_part(list(range(14)), limit=16, lanes=2) == list(range(7))
    assert lane_part(list(range(5)), limit=16, lanes=2) == [0, 1, 2]
    assert lane_part(list(range(14)), limit=16, lanes=1) == list(range(14))
    assert lane_part([3], limit=16, lanes=2) == [3]
    assert lane_part([], limit=16, lanes=2) == []


def test_a_free_seeder_takes_the_back_half_of_a_running_sessions_pieces() -> None:
    """The last pieces the running session would get (its order), half of them rounded
    down; none while fewer than RELIEF_MIN_PIECES remain."""
    assert relief_pieces([9, 3, 7, 1, 5, 0, 2, 4, 6], least=8) == [0, 2, 4, 6]
    assert relief_pieces([4, 8, 2, 6, 1, 3, 5, 7], least=8) == [1, 3, 5, 7]
    assert relief_pieces([4, 8, 2, 6, 1, 3, 5], least=8) == []
    enough = list(range(RELIEF_MIN_PIECES))
    assert relief_pieces(enough) == enough[RELIEF_MIN_PIECES - RELIEF_MIN_PIECES // 2 :]
    assert relief_pieces(enough[1:]) == []  # one fewer: no relief
    assert relief_pieces([4, 8, 2], least=2) == [2]
    assert relief_pieces([]) == []


def test_a_region_deals_the_pieces_so_its_first_sessions_are_disjoint() -> None:
    """Four far nodes that see each other near: each piece has one owner, each node's
    share comes first in its sessions, and the first sessions share no piece."""
    ips = [f"10.0.1.{n}" for n in range(4)]
    orders = [region_order(ip, [o for o in ips if o != ip], 128) for ip in ips]
    owners = [[n for n, key in enumerate(orders) if key(i)[0] == 0] for i in range(128)]
    assert all(len(o) == 1 for o in owners)
    assert all(20 <= sum(1 for o in owners if o == [n]) <= 44 for n in range(4))
    seed = Holder("10.0.0.3", seed=True, pieces=[True] * 128)
    firsts = [set(batch_pieces(list(range(128)), seed, set(), 16, key)) for key in orders]
    assert all(len(f) == 16 for f in firsts)
    assert all(not (a & b) for i, a in enumerate(firsts) for b in firsts[i + 1 :])
    assert region_order(ips[0], ips[1:], 128)(5) == orders[0](5)  # stable


def test_a_node_helps_with_the_others_shares_from_their_far_end() -> None:
    """After its own share, a node takes an owner's pieces in the reverse of the order
    the owner pulls them in: a late owner is helped, and the two meet in the middle."""
    a, b = "10.0.1.1", "10.0.1.2"
    seed = Holder("10.0.0.3", seed=True, pieces=[True] * 64)
    of_a, of_b = region_order(a, [b], 64), region_order(b, [a], 64)
    b_share = [i for i in range(64) if of_b(i)[0] == 0]
    b_pulls = batch_pieces(b_share, seed, set(), 64, of_b)  # b's own, first to last
    a_helps = batch_pieces(b_share, seed, set(), 64, of_a)  # a's help with b's share
    assert a_helps == b_pulls[::-1]
    # alone, a node owns every piece; a member more only takes pieces from a share
    assert all(region_order(a, [], 64)(i)[0] == 0 for i in range(64))
    three = region_order(a, [b, "10.0.1.3"], 64)
    assert all(of_a(i)[0] == 0 for i in range(64) if three(i)[0] == 0)


def test_a_node_that_knows_part_of_its_region_first_pulls_pieces_it_surely_owns() -> None:
    """Dealt before it has met its region (alone, or with one of three peers), a node's
    first session takes mostly pieces of its share in the whole region."""
    ips = [f"10.0.1.{n}" for n in range(4)]
    seed = Holder("10.0.0.3", seed=True, pieces=[True] * 128)
    for n, ip in enumerate(ips):
        whole = region_order(ip, [o for o in ips if o != ip], 128)
        owned = {i for i in range(128) if whole(i)[0] == 0}
        for known in ([], [ips[(n + 1) % 4]]):
            first = batch_pieces(list(range(128)), seed, set(), 16, region_order(ip, known, 128))
            assert len(set(first) & owned) >= 10, (ip, known)


def test_the_helpers_of_a_region_are_dealt_too() -> None:
    """Once their own shares are held in the region, four nodes' next sessions take
    different pieces: each piece has one first helper, as it has one owner (with one
    helper order for all, the far-region nodes' second sessions took the same 16)."""
    ips = [f"10.0.1.{n}" for n in range(4)]
    orders = [region_order(ip, [o for o in ips if o != ip], 128) for ip in ips]
    for tier in range(4):
        dealt = [[n for n, key in enumerate(orders) if key(i)[0] == tier] for i in range(128)]
        assert all(len(d) == 1 for d in dealt), tier
    seed = Holder("10.0.0.3", seed=True, pieces=[True] * 128)
    owned = [{i for i in range(128) if key(i)[0] == 0} for key in orders]
    helps = [
        set(batch_pieces([i for i in range(128) if i not in own], seed, set(), 16, key))
        for own, key in zip(owned, orders, strict=True)
    ]
    assert all(len(h) == 16 for h in helps)
    assert all(not (a & b) for i, a in enumerate(helps) for b in helps[i + 1 :])


def test_region_shares_are_the_owners_shares_in_their_pull_order() -> None:
    """region_shares deals as region_order does (each member's share, in the order it
    pulls it), and share_lacking keeps what nobody else in the region brings."""
    ips = [f"10.0.1.{n}" for n in range(5)]
    shares = region_shares(tuple(ips), 300)
    assert sorted(i for share in shares.values() for i in share) == list(range(300))
    for ip in ips:
        key = region_order(ip, [o for o in ips if o != ip], 300)
        assert list(shares[ip]) == sorted((i for i in range(300) if key(i)[0] == 0), key=key)
    own = shares[ips[0]]
    lacking = share_lacking(own, range(300), {own[0]}, frozenset({own[1]}))
    assert lacking == list(own[2:])


def test_a_helper_leaves_an_owner_its_next_pulls_unless_it_stalls() -> None:
    """Two nodes, b holding half of its share: a's help skips the next OWNER_NEXT pieces
    b lacks of its share (b's own sessions pull them), and takes them once b stalls."""
    a, b = "10.0.1.1", "10.0.1.2"
    count = 256
    of_a, of_b = region_order(a, [b], count), region_order(b, [a], count)
    b_share = sorted((i for i in range(count) if of_b(i)[0] == 0), key=of_b)
    b_holds = [False] * count
    for i in b_share[: len(b_share) // 2]:
        b_holds[i] = True
    holders = [Holder(b, seed=False, pieces=b_holds)]
    shares = region_shares((a, b), count)
    now = [0.0]
    progress = OwnerProgress(lambda: now[0])
    skipped = owners_next(a, shares, holders, progress)
    assert skipped == set(b_share[len(b_share) // 2 :][:OWNER_NEXT])
    seed = Holder("10.0.0.3", seed=True, pieces=[True] * count)
    lacks = [i for i in b_share if not b_holds[i]]
    helps = batch_pieces(lacks, seed, set(), 16, of_a, skipped)
    assert helps and not set(helps) & skipped
    now[0] = OWNER_STALL + 1  # b's share did not grow since
    assert owners_next(a, shares, holders, progress) == frozenset()
    b_holds[lacks[0]] = True  # it grows again, by one piece in OWNER_STALL + 1 seconds:
    # a's help leaves it the few it brings in OWNER_HORIZON at that rate
    slow = math.ceil(OWNER_HORIZON / (OWNER_STALL + 1))
    assert owners_next(a, shares, holders, progress) == set(lacks[1 : 1 + slow])
    for i in lacks[1:40]:  # then 39 more in a second: 8 a second since first seen
        b_holds[i] = True
    now[0] += 1
    fast = math.ceil(40 / now[0] * OWNER_HORIZON)
    assert owners_next(a, shares, holders, progress) == set(lacks[40 : 40 + fast])


def test_an_owner_whose_share_shrinks_is_counted_afresh() -> None:
    """A share seen smaller (the region grew, or a bitfield was briefly missing) restarts
    the owner's count: never a negative reserve (which kept all but a few pieces)."""
    now = [0.0]
    progress = OwnerProgress(lambda: now[0])
    assert progress("10.0.1.2", 20) == OWNER_NEXT
    now[0] = 1.5
    assert progress("10.0.1.2", 0) == OWNER_NEXT  # afresh: first seen now
    now[0] = 1.5 + OWNER_STALL + 0.5
    assert progress("10.0.1.2", 0) == 0  # stalled since
    now[0] += 1
    assert 0 < progress("10.0.1.2", 12) <= OWNER_NEXT


def test_the_best_holder_is_a_seed_else_the_one_with_most_of_what_is_missing() -> None:
    a = Holder("10.0.0.2", seed=False, pieces=[True, True, False])
    b = Holder("10.0.0.3", seed=False, pieces=[True, False, False])
    s = Holder("10.0.0.4", seed=True, pieces=[True, True, True])
    assert best_holder([a, b, s], [0, 1, 2], skip=lambda ip: False) == s
    assert best_holder([a, b, s], [0, 1, 2], skip=lambda ip: ip == s.ip) == a
    assert best_holder([b], [1, 2], skip=lambda ip: False) is None  # holds none of it


def test_the_seeders_a_plan_names_are_holders_until_libtorrent_connects_them() -> None:
    plan = OriginPlan.from_json(
        {"stripe": [], "holders": ["10.0.0.4", "10.0.0.5", "not an address", 7, "10.0.0.9"]}
    )
    assert plan is not None and plan.holders == ("10.0.0.4", "10.0.0.5", "10.0.0.9")
    assert OriginPlan.from_json({"stripe": [], "holders": "10.0.0.4"}) is None
    peers = ["10.0.1.4:6881", "[2001:db8::1]:6881", "10.0.1.5", "10.0.1.6:0", "x:1", 3]
    peers += ["2001:db8::1:6881", "[10.0.1.7]:6881"]
    named = OriginPlan.from_json({"stripe": [], "peers": peers})
    assert named is not None and named.peers == (("10.0.1.4", 6881), ("2001:db8::1", 6881))
    odd = OriginPlan.from_json({"stripe": [3], "peers": "10.0.1.4:6881"})  # ignored only
    assert odd is not None and odd.stripe == (3,) and odd.peers == ()
    connected = Holder("10.0.0.4", seed=False, pieces=[True, False])
    found = with_seeders([connected], plan.holders, own_ip="10.0.0.9")
    # libtorrent's view of a connected one stands; this node is no holder of its own
    assert found == [connected, Holder("10.0.0.5", seed=True, pieces=())]
    assert best_holder(found, [1], skip=lambda ip: False) == found[1]


def test_far_nodes_spread_over_equal_seeds() -> None:
    """Sixteen far nodes, each breaking ties with the daemon's hash of its id and the
    holder (a SHA-1: the same in every process, where ``hash()`` of a string is salted
    per process and once gave one seed all sixteen)."""
    seeds = [Holder(f"10.0.0.{i}", seed=True, pieces=[True] * 4) for i in (2, 3)]
    picks = set()
    for n in range(16):
        tie = functools.partial(udpauto._node_hash, f"node{n:02d}")
        pick = best_holder(seeds, [0, 1], lambda ip: False, tie)
        assert pick is not None
        picks.add(pick.ip)
    assert picks == {"10.0.0.2", "10.0.0.3"}


def test_connect_rtt_times_a_real_listener_and_says_none_for_a_closed_port() -> None:
    """A listener on loopback answers in well under :data:`NEAR_RTT` (a near holder is
    found before any session); a port nobody listens on gives None (the holder is put
    aside, as a failed session would be)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        rtt = connect_rtt("127.0.0.1", port)
        assert rtt is not None and rtt < NEAR_RTT
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free_port = closed.getsockname()[1]  # bound, never listening: connects are refused
        assert connect_rtt("127.0.0.1", free_port, timeout=0.5) is None


def test_connect_rtt_leaves_out_a_late_wake_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """The round trip is the kernel's handshake time (TCP_INFO), not the connect's wall
    time: a node that wakes a second late after its connect (its clock is made to jump
    here) still finds a loopback holder near."""
    ticks = itertools.count()

    class LateClock:
        @staticmethod
        def monotonic() -> float:
            return float(next(ticks))  # a second passes between any two readings

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as sock:
            kernel = handshake_rtt(sock)
        monkeypatch.setattr(rtt_module, "time", LateClock)
        rtt = connect_rtt("127.0.0.1", port, tries=1)
    assert kernel is not None and 0 < kernel < NEAR_RTT
    assert rtt is not None and rtt < NEAR_RTT


@contextlib.contextmanager
def live_loopback_connection() -> Iterator[int]:
    """A TCP connection on loopback that has carried data both ways (so the kernel has
    timed round trips on it), open for the block; yields the listener's port."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as sock:
            peer, _ = listener.accept()
            with peer:
                sock.sendall(b"x" * 4096)
                assert peer.recv(4096)
                peer.sendall(b"y")
                assert sock.recv(1) == b"y"
                yield port


def test_kernel_min_rtt_reads_the_kernels_least_round_trip_of_a_live_connection() -> None:
    """The least round trip of this node's TCP connections to an address, as the kernel
    measured it (netlink sock_diag): a loopback connection that carried data is near; an address
    with no connection gives None (the connects decide then)."""
    with live_loopback_connection():
        rtt = kernel_min_rtts().get("127.0.0.1")
    assert rtt is not None and 0 < rtt < NEAR_RTT
    assert "192.0.2.1" not in kernel_min_rtts()  # TEST-NET-1: nothing connects there


def test_with_s3_near_a_fetch_uses_no_udp() -> None:
    """S3 near (its round trip under NEAR_RTT): TCP's; far, or no connection to it (S3
    refused): UDP may be tried."""
    assert not udp_wanted(0.0005)
    assert udp_wanted(0.1)
    assert udp_wanted(None)


def test_s3_is_far_only_when_its_round_trip_says_so() -> None:
    """A node takes no ALL plan only when S3's measured round trip says another region:
    unmeasured (or refused) is not far."""
    assert s3_far(0.1)
    assert s3_far(0.02)
    assert not s3_far(0.0005)
    assert not s3_far(None)


def test_endpoint_round_trip_is_the_kernels_least_to_that_host() -> None:
    """S3's distance: the kernel's least round trip of this node's connections to the
    endpoint's host (a loopback connection: near), else timed connects (a listener, no
    connection yet: near too); nothing answering, or no endpoint: None."""
    with live_loopback_connection() as port:
        rtt = endpoint_round_trip(f"http://127.0.0.1:{port}/bucket")
    assert rtt is not None and rtt < NEAR_RTT
    # Addresses nobody else connects to: the kernel's least round trip is per host, and
    # other processes' connections to 127.0.0.1 would answer instead of the connects
    listening, quiet = "127.61.73.88", "127.61.73.89"
    assert listening not in kernel_min_rtts()  # so only the connects can answer
    with socket.socket() as listener:
        listener.bind((listening, 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        by_connects = endpoint_round_trip(f"http://{listening}:{port}")
    assert by_connects is not None and by_connects < NEAR_RTT
    # bound, never listening: connects are refused
    with socket.socket() as closed:
        closed.bind((quiet, 0))
        assert endpoint_round_trip(f"http://{quiet}:{closed.getsockname()[1]}") is None
    assert endpoint_round_trip(None) is None


def test_s3_s_least_round_trip_is_over_its_own_addresses() -> None:
    """S3's distance from the kernel's table (``Artifact.s3_round_trip`` revises a far
    figure with it): the least over any of S3's addresses; other hosts' round trips say
    nothing of S3."""
    s3 = {"10.77.0.1", "10.77.0.254"}
    assert least_round_trip({"10.77.0.1": 0.035, "10.77.0.5": 0.001}, s3) == 0.035
    assert least_round_trip({"10.77.0.254": 0.004, "10.77.0.1": 0.035}, s3) == 0.004
    assert least_round_trip({}, s3) is None
    assert least_round_trip({"10.77.0.1": 0.001}, set()) is None
