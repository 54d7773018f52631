"""The daemon's automatic UDP source: pull missing pieces over UDP when TCP is slow.

Where a node's TCP sources are far away (another region: 100 ms of RTT and a fraction of
a percent of loss hold one CUBIC flow to a few Mbit/s), a holder's UDP server (every
daemon with the fleet secret runs one, :mod:`swarm.udp`) carries the pieces at link
rate. Nothing tells a node that it is far: it measures (:mod:`.rtt`). What to pull from
whom, and when, is :mod:`.udpchoice`'s (pure); this module runs the loop that decides,
and :mod:`.udplane` each session (a thread that moves the bytes, one that judges them).
The holder's UDP port is taken to be this node's own (a fleet-wide setting,
``--udp-port``).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Final

import libtorrent as lt

from swarm.agent.downloadqueue import InFlight
from swarm.agent.registry import Artifact
from swarm.agent.rtt import (
    RTT_PROBES,
    connect_rtt,
    kernel_min_rtts,
)
from swarm.agent.udpchoice import (
    HOLDER_PENALTY,
    MAX_LANES,
    NEAR_RTT,
    REGION_WAIT,
    Holder,
    OwnerProgress,
    RateWindow,
    UdpChoice,
    batch_pieces,
    best_holder,
    held_nearby,
    lane_part,
    owners_next,
    region_order,
    region_shares,
    relief_pieces,
    share_lacking,
    udp_wanted,
    with_seeders,
)
from swarm.agent.udplane import Lane
from swarm.sources.ltsettings import FAR_FETCH_SETTINGS
from swarm.sources.peers import TorrentSession
from swarm.udp.api import CONNECT_TIMEOUT, DEFAULT_RATE_BPS

log = logging.getLogger(__name__)

FIND_HOLDER_SECONDS: Final = 2.0
"""While S3 is far, the S3 reader leaves it alone this long from the fetch's start for UDP
to find a far holder (:meth:`~swarm.agent.registry.Artifact.udp_carries_wan`), then as
long as sessions run and :data:`LANE_GAP_SECONDS` after. far-region's nodes read a few
pieces from S3 across the 100 ms, 0.5% loss WAN (2% of their bytes, 1-3 s a piece, not
dealt among the region, and fetched again by libtorrent from the region's peers):
without them 8.53, 8.48, 9.08, 8.71 s against 8.80, 9.08, 9.56, 8.68 in runs just
before (CPU 14 against 17 CPU-s per node and GiB), and the far nodes' downlinks carried
144-149 MB each for the 134 MB artifact against 150-165. A far node without a UDP holder
reads S3 after the wait. After that the reader leaves S3 alone as long as a far holder is
found and not under penalty, sessions or none: a read across the WAN brings what UDP and
libtorrent's TCP to that holder bring, only slower and twice (far-region's nodes read
26-32-piece stripes from S3 in their last two seconds while other members' sessions
still carried those pieces: 6.7-7.1 MB redundant, 8.51 s; sixteen alternating pairs
without these reads ran 7.92 s mean, median 7.86, against 8.03, 7.96, faster in ten,
12 of 16 runs at most 8.05 s against 10)."""

LANE_GAP_SECONDS: Final = 1.0
"""See :data:`FIND_HOLDER_SECONDS`: the gap between one session and the next is the
loop's look (at most half a second) and a holder's choice."""

REGION_HOLDS_SECONDS: Final = 1.0
"""While S3 is far and no session runs, the S3 reader leaves it alone this long each time
the loop finds that this node's region (:class:`RegionHeld`, looked at every quarter to
half second) holds every missing piece: they come at LAN speed from there, and a read
across the WAN only arrives second. After far-region's sessions, the far nodes read
their stripes from S3 (the plan's) with 17-34 pieces missing, all held next door: the
origin sent 0.07-0.21 F across the WAN into the far downlinks, 0.03 F with this, and
eight alternating pairs ran 8.04 s mean (median 7.99, faster in seven) against 8.30
(8.16)."""

OPENED_AHEAD_SECONDS: Final = 2.0
"""A session opened ahead of its pieces (to a far holder as it is found, while this node
waits to meet its region) that is dealt none this long is ended."""

UNPROBED_CONNECT_TIMEOUT: Final = 1.0
"""Seconds a session's connect may take to a seeder the coordinator named that this node
never connected to (no connect times it first: :func:`auto_udp`)."""

ASK_HEADROOM: Final = 2.0
"""A holder's next session asks for this multiple of the rate its last session delivered
(:func:`next_ask`)."""
MIN_ASK_BPS: Final = 8_000_000


def next_ask(delivered_bps: float | None) -> int | None:
    """The rate (bit/s) the next session from a holder asks for: twice what the path
    delivered to this node's last (or still running) session from it, or None (ask the
    default) when nothing was measured (or the last session lost to TCP).

    The sender starts at an eighth of the ask and doubles until its first loss. Asking
    for a 1 Gbit/s NIC every time, far-region's sessions (four far nodes pulling from
    each seeder's 200 Mbit uplink) ran their senders at 100-420 Mbit/s each, and the
    seeders' queues dropped 10-35% of every session's datagrams; each session is a few
    seconds long, too short for the rate rule to settle. Twice the last delivered rate
    bounds that overshoot and still lets a session double when capacity frees up."""
    if not delivered_bps or delivered_bps <= 0:
        return None
    return int(min(DEFAULT_RATE_BPS, max(MIN_ASK_BPS, ASK_HEADROOM * delivered_bps)))


def holders_of(peers: list[Any], own_ip: str) -> list[Holder]:
    """Of the torrent's connected peers (libtorrent's ``get_peer_info``), those that hold
    pieces. Peers on this
    node's address or on loopback are left out: daemons sharing an address (tests, one
    host) serve UDP on ports of their own, and ``port`` would be this node's server."""
    found = []
    for peer in peers:
        ip = peer.ip[0]
        if ip == own_ip or ipaddress.ip_address(ip).is_loopback:
            continue
        seed = bool(peer.flags & lt.peer_info.seed)
        if seed or any(peer.pieces):
            found.append(Holder(ip, seed, peer.pieces))
    return found


def near_peers(peers: list[Any], own_ip: str, rtts: dict[str, float]) -> list[str]:
    """Of the torrent's connected peers (libtorrent's ``get_peer_info``), those in this
    node's region (kernel round trip under :data:`NEAR_RTT`), holders or not: the nodes
    that share its UDP pulls."""
    ips = {peer.ip[0] for peer in peers} - {own_ip}
    return [ip for ip in ips if rtts.get(ip, math.inf) < NEAR_RTT]


class RegionHeld:
    """The pieces this node's region holds (its peers under :data:`NEAR_RTT`, holders or
    not, as :func:`near_peers` finds them), as last looked at: the region's exchange
    brings them, so a running session skips them (two members whose first sessions were
    dealt before they met pulled the same pieces across the WAN, and far-region's two
    seeders sent 188 MB for its 134 MB artifact), and while the region holds every missing
    piece the S3 reader leaves the far S3 alone (:data:`REGION_HOLDS_SECONDS`)."""

    def __init__(self) -> None:
        self.pieces: frozenset[int] = frozenset()

    def look(self, peers: list[Any], own_ip: str, rtts: dict[str, float]) -> None:
        near = set(near_peers(peers, own_ip, rtts))
        self.pieces = held_nearby(holders_of(peers, own_ip), near.__contains__)

    def __call__(self, index: int) -> bool:
        return index in self.pieces

    def holds(self, missing: list[int]) -> bool:
        """The region holds every one of ``missing`` (some are missing)."""
        return bool(missing) and self.pieces.issuperset(missing)


def _node_hash(node_id: str, ip: str) -> int:
    return int.from_bytes(hashlib.sha1(f"{node_id} {ip}".encode()).digest()[:4], "big")


@dataclass
class _Penalties:
    until: dict[str, float] = field(default_factory=dict)

    def skip(self, ip: str) -> bool:
        return self.until.get(ip, 0.0) > time.monotonic()

    def add(self, ip: str, seconds: float = HOLDER_PENALTY) -> None:
        self.until[ip] = time.monotonic() + seconds


def auto_udp(
    session: TorrentSession,
    artifact: Artifact,
    node_id: str,
    own_ip: str,
    port: int,
    secret: bytes,
) -> None:
    """Pull pieces over UDP while it beats TCP (see :mod:`.udpchoice`), from up to
    :data:`MAX_LANES` far holders at once. Returns when the artifact is complete or
    cancelled, or at once when S3 is near (:func:`.udpchoice.udp_wanted`)."""
    manifest, sink = artifact.manifest, artifact.sink
    lanes: list[Lane] = []
    scoped = contextlib.ExitStack()  # while this runs: far-fetch settings, S3 left to UDP
    try:
        handle = session.torrents[manifest.info_hash].handle
        in_flight = InFlight(handle)
        s3_rtt = artifact.s3_round_trip()
        if s3_rtt is not None and not udp_wanted(s3_rtt):
            log.info("udp: S3 is near (%.1f ms): TCP's, no UDP for this fetch", s3_rtt * 1e3)
            return
        # S3 is far (or refused): sessions will bring what libtorrent asks near peers for
        # (FAR_REQUEST_QUEUE_SECONDS); from the start, not the first session, since the
        # queues libtorrent fills in the fetch's first second are what comes twice
        scoped.enter_context(session.tuned(FAR_FETCH_SETTINGS))
        # and the S3 reader leaves the far S3 to UDP while it finds a far holder (the
        # coordinator names the seeders in its first plans) and while sessions run
        artifact.leave_s3_to_udp(FIND_HOLDER_SECONDS)
        scoped.callback(artifact.leave_s3_to_udp, None)
        choice = UdpChoice(time.monotonic())
        penalties = _Penalties()
        far: dict[str, float] = {}  # holders found far: their last round trip (s)
        first_far = 0.0  # when the first far holder was found (monotonic)
        owners = OwnerProgress(time.monotonic)  # the region's members' own pulls
        own_share: tuple[int, ...] | None = None  # as the last session was dealt
        near_ips: set[str] = set()
        asks: dict[str, int] = {}  # holder -> bit/s its next session asks for
        unprobed: set[str] = set()  # named seeders never connected to yet
        region_held = RegionHeld()  # what running sessions skip
        served: set[str] = set()  # holders whose dealt sessions ended (relieve)

        def set_near(ip: str, seconds: float, how: str) -> None:
            log.info("udp: %s is near (%s %.1f ms): TCP's", ip, how, seconds * 1e3)
            penalties.add(ip, math.inf)
            near_ips.add(ip)

        def open_lane(ip: str, rtt: float, pieces: list[int] | None, ask: int) -> Lane:
            # a seeder never connected to gets the connect timeout a timing connect had:
            # one the store named that has since died holds no lane for 10 s
            timeout = UNPROBED_CONNECT_TIMEOUT if ip in unprobed else CONNECT_TIMEOUT
            unprobed.discard(ip)
            return Lane(
                artifact, ip, port, secret, pieces, handle, choice, rtt, ask,
                connect_timeout=timeout, skip=region_held,
            )  # fmt: skip

        def reap(lane: Lane) -> None:
            if not lane.dealt:  # opened ahead and never dealt: says nothing of the path
                if lane.error is not None:
                    lane.log_outcome()
                    penalties.add(lane.ip)
                    choice.failed(time.monotonic())
                return
            lane.log_outcome()
            if lane.error is not None:
                penalties.add(lane.ip)  # unreachable, no UDP server, wrong secret
                choice.failed(time.monotonic())
                return
            served.add(lane.ip)
            paid = lane.paid
            stats = lane.stats
            # A session that lost to TCP may have been slow for a passing reason; asking
            # twice its rate would hold the next one near it, so it asks afresh.
            ask = next_ask(lane.delivered_bps()) if paid else None
            if ask is not None:
                asks[lane.ip] = ask
            else:
                asks.pop(lane.ip, None)
            if stats is not None and stats.min_rtt is not None and stats.min_rtt < NEAR_RTT:
                set_near(lane.ip, stats.min_rtt, "rtt")
                paid = False
            if not paid:  # lost to TCP: this holder waits, longer each time
                penalties.add(lane.ip, choice.backoff)
            choice.ended(time.monotonic(), lane.rate, paid)

        def wait_for_holders(holders: list[Holder], now: float) -> None:
            """Nothing to pull from anyone now: wait on the lanes, or for holders."""
            if lanes:
                artifact.cancel.wait(0.25)
            elif holders and not any(not penalties.skip(h.ip) for h in holders):
                choice.all_near(now)
            else:
                choice.no_holder(now)  # none yet (libtorrent still connecting)

        def ask_of(ip: str) -> int:
            """The rate a new session from ``ip`` asks for: a session from it still in
            its tail tells the path's rate best, else its last one (:func:`next_ask`)."""
            running = [
                next_ask(lane.delivered_bps()) for lane in lanes if lane.dealt and lane.ip == ip
            ]
            return max((a for a in running if a), default=asks.get(ip, DEFAULT_RATE_BPS))

        def relieve(busy: set[str]) -> bool:
            """A far seeder whose session is done or in its tail takes the back half of a
            running session's pieces from another seeder (RELIEF_MIN_PIECES); True if it
            did."""
            # free: a seeder whose dealt session is in its tail or over (not one whose
            # session opened ahead still waits for its first deal)
            waiting = {lane.ip for lane in lanes if not lane.dealt}
            free = [
                ip
                for ip in served | {lane.ip for lane in lanes if lane.dealt and lane.in_tail()}
                if ip in artifact.seeders and ip in far and ip not in busy and ip not in waiting
                and not penalties.skip(ip)
            ]  # fmt: skip
            donors = [lane for lane in lanes if lane.ip in busy and lane.running]
            for ip in free:
                for donor in donors:
                    if donor.ip == ip:
                        continue
                    pieces = relief_pieces(donor.remaining())
                    if not pieces:
                        continue
                    donor.release(pieces)
                    ask = ask_of(ip)
                    log.info("udp: %d pieces from %s, asking %.0f Mbit/s, taken over from %s",
                             len(pieces), ip, ask / 1e6, donor.ip)  # fmt: skip
                    lanes.append(open_lane(ip, far[ip], pieces, ask))
                    return True
            return False

        window = RateWindow()  # TCP's bytes/s, near peers too: whether UDP is worth trying

        def tcp_bytes() -> int:
            by = sink.bytes_by_source
            return by.get("peers", 0) + by.get("s3", 0)

        while not artifact.complete_on_disk() and not artifact.cancel.is_set():
            for lane in [lane for lane in lanes if not lane.running]:
                lanes.remove(lane)
                reap(lane)
            missing = sink.missing()
            if lanes or any(not penalties.skip(ip) for ip in far):  # FIND_HOLDER_SECONDS
                artifact.leave_s3_to_udp(LANE_GAP_SECONDS)
            elif region_held.holds(missing):
                artifact.leave_s3_to_udp(REGION_HOLDS_SECONDS)
            # a lane in its tail makes room: the next session's handshake and ramp (a
            # second or so on a 100 ms path) overlap the tail instead of following it
            busy = {lane.ip for lane in lanes if lane.dealt and not lane.in_tail()}
            for lane in lanes:
                if not lane.dealt and time.monotonic() - lane.opened > OPENED_AHEAD_SECONDS:
                    lane.abandon()
            if len(busy) < MAX_LANES and relieve(busy):
                continue
            now = time.monotonic()
            rates = window.add(now, tcp_bytes())
            tcp_rate = rates[0] if rates else 0.0
            want = choice.session_bytes(now, tcp_rate, len(missing) * manifest.piece_size)
            if (
                not want
                and own_share is not None
                and len(busy) < MAX_LANES
                and now >= choice.next_try_at
            ):
                # TCP would finish soon, but only with what the region holds: the pieces
                # of this node's share that none of it holds come across the WAN, and the
                # others leave them to this node (owners_next)
                claimed = {i for lane in lanes for i in lane.pieces}
                holding = holders_of(handle.get_peer_info(), own_ip)
                nearby = held_nearby(holding, near_ips.__contains__)
                want = len(share_lacking(own_share, missing, claimed, nearby))
                want *= manifest.piece_size
            if not want or len(busy) >= MAX_LANES:
                wait = choice.next_try_at - now if not lanes else 0.25
                # for the running sessions' skips, and without any for the S3 reader
                region_held.look(handle.get_peer_info(), own_ip, kernel_min_rtts())
                if lanes or artifact.seeders:
                    artifact.cancel.wait(min(0.5, max(0.05, wait)))
                elif artifact.seeders_named.wait(min(0.5, max(0.05, wait))):
                    # no holder yet, and the coordinator's first plan named some: look now
                    choice.next_try_at = min(choice.next_try_at, time.monotonic())
                continue
            peers = handle.get_peer_info()  # once a look: a Python object per peer
            connected = holders_of(peers, own_ip)
            # and the seeders the coordinator named: far-region's nodes had them in their
            # first plan half a second before libtorrent's announce and connects
            everyone = with_seeders(connected, artifact.seeders, own_ip)
            holders = [h for h in everyone if not penalties.skip(h.ip) and h.ip not in busy]
            rtts = kernel_min_rtts() if holders else {}
            region_held.look(peers, own_ip, rtts)
            s3_now = artifact.s3_round_trip(rtts or None)  # the table just read, if any
            if s3_now is not None and not udp_wanted(s3_now):
                # S3 looked far at the fetch's start only behind the origin's full queue
                # (slow-uploads at a quarter of its rates: 0-14 ms for most nodes, none
                # under 20 for two, which then pulled UDP from LAN peers with full 5 Mbit
                # uplinks); the kernel's least round trip since says it is in this region
                log.info("udp: S3 is near now (%.2f ms): TCP's, no more UDP for this fetch",
                         s3_now * 1e3)  # fmt: skip
                return
            for h in holders:  # near holders are TCP's, whichever is best
                if rtts.get(h.ip, math.inf) < NEAR_RTT:
                    set_near(h.ip, rtts[h.ip], "kernel's least")
            holder = best_holder(
                holders, missing, penalties.skip, lambda ip: _node_hash(node_id, ip)
            )
            if holder is None:
                wait_for_holders(holders, now)
                continue
            # The kernel's round trip of libtorrent's connection (read afresh: a near
            # peer first timed behind a full queue looks far until the queue drains once),
            # else (no TCP connection) a few connects to the UDP control port, once.
            kernel = rtts.get(holder.ip)
            how = "kernel's least" if kernel is not None else "connect"
            rtt = kernel if kernel is not None else far.get(holder.ip)
            named = rtt is None and holder.ip not in {h.ip for h in connected}
            if named and s3_rtt is not None:
                # a seeder the coordinator named, not connected yet, while S3 is far: it
                # is taken to be where S3 is (its session's own round trip says if it is
                # near: reap), not timed by a connect first, a round trip of each far
                # node's start
                rtt, how = s3_rtt, "S3's round trip"
                unprobed.add(holder.ip)
            elif rtt is None:
                # else one connect times it, not three (the kernel's handshake time, at
                # the fetch's start: queues still empty)
                rtt = connect_rtt(holder.ip, port, tries=1 if named else RTT_PROBES)
            if rtt is None:
                log.info("udp: %s:%d refuses connections", holder.ip, port)
                penalties.add(holder.ip)
                choice.failed(time.monotonic())
                continue
            if rtt < NEAR_RTT:
                set_near(holder.ip, rtt, how)
                choice.all_near(time.monotonic())
                continue
            found = holder.ip not in far
            far[holder.ip] = rtt
            dealt = any(lane.dealt for lane in lanes)
            if found:
                log.info("udp: %s is far (%s %.1f ms)", holder.ip, how, rtt * 1e3)
                first_far = first_far or time.monotonic()
                if not dealt:
                    # the first sessions' handshakes and path probes (two round trips) go
                    # by while this node waits to meet its region (REGION_WAIT): to this
                    # holder and to the other seeders named, taken to be where S3 is
                    ahead = {holder.ip: rtt}
                    if s3_rtt is not None:
                        for ip in artifact.seeders:
                            if ip != own_ip and ip not in near_ips and not penalties.skip(ip):
                                ahead.setdefault(ip, far.get(ip, s3_rtt))
                    for ip, seconds in list(ahead.items())[:MAX_LANES]:
                        if not any(lane.ip == ip for lane in lanes):
                            ask = asks.get(ip, DEFAULT_RATE_BPS)
                            lanes.append(open_lane(ip, seconds, None, ask))
                continue  # libtorrent may have met this node's region meanwhile: look again
            region = near_peers(peers, own_ip, rtts)
            if not region and not dealt and time.monotonic() - first_far < REGION_WAIT:
                # the named seeders come before libtorrent has met the region's peers:
                # a session dealt as if alone pulls pieces the region's others pull too
                artifact.cancel.wait(0.05)
                continue
            claimed = {i for lane in lanes for i in lane.pieces}
            shares = region_shares(tuple(sorted({own_ip, *region})), manifest.layout.count)
            own_share = shares[own_ip]
            limit = max(1, want // manifest.piece_size)
            pieces = batch_pieces(
                [i for i in missing if i not in claimed],
                holder,
                in_flight(),
                limit,
                region_order(own_ip, region, manifest.layout.count),
                held_nearby(everyone, near_ips.__contains__)
                | owners_next(own_ip, shares, everyone, owners),
            )
            # a few pieces left to pull: split between this holder and another one free
            others = any(h.ip != holder.ip and not penalties.skip(h.ip) for h in holders)
            pieces = lane_part(pieces, limit, min(MAX_LANES - len(busy), 1 + others))
            if not pieces:
                wait_for_holders(holders, now)
                continue
            opened = [lane for lane in lanes if lane.ip == holder.ip and not lane.dealt]
            if opened and opened[0].deal(pieces):
                log.info("udp: %d pieces from %s, opened ahead, dealt among %d near",
                         len(pieces), holder.ip, len(region))  # fmt: skip
                continue
            ask = ask_of(holder.ip)
            log.info("udp: %d pieces from %s, asking %.0f Mbit/s, dealt among %d near",
                     len(pieces), holder.ip, ask / 1e6, len(region))  # fmt: skip
            lanes.append(open_lane(holder.ip, rtt, pieces, ask))
    except (KeyError, RuntimeError):
        # libtorrent let go of the torrent (KeyError from our table, RuntimeError from a
        # stale handle): expected as a directly-read file is handed over on completion
        if not (artifact.complete_on_disk() or artifact.cancel.is_set()):
            raise
    finally:
        for lane in lanes:
            lane.stop.set()
            lane.abandon()
        for lane in lanes:
            lane.join()
        scoped.close()
