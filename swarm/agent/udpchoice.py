"""When and from whom the daemon pulls pieces over UDP: the automatic UDP source's
choices, pure (time and rates are passed in). :mod:`.udpauto` moves the bytes.

- While the fetch would take :data:`WORTH_SECONDS` more at its TCP rate (peers and S3
  together), a node opens a UDP *session* with the best far holder its libtorrent peers
  show (a seed first, else the one holding most of what it lacks), and another with the
  next (:data:`MAX_LANES`), each for pieces that holder has, :data:`SESSION_SECONDS` of
  UDP's last rate at a time. A session is long because each costs a few round trips
  (handshake, tail); batches of 4 MiB measured a fifth of UDP's rate on a 100 ms path.
- After :data:`PROBE_SECONDS`, a session goes on while it delivers :data:`UDP_BETTER`
  times what TCP brings from the same holder over the last :data:`RATE_WINDOW`, or while
  it is in its tail (:data:`TAIL_SHARE`); when it loses (TCP caught up, or the holder is
  slow) it stops, and its holder waits twice as long as the last (:data:`PROBE_BACKOFF`
  to :data:`PROBE_BACKOFF_CAP`).
- A session takes missing pieces that the holder has in the region's order
  (:func:`region_order`): first those no near peer holds and libtorrent is not
  downloading, this node's share of them before the others', so the nodes of one region
  pull different pieces and each tends to cross the WAN once.
- A holder whose least round trip is under :data:`NEAR_RTT` is near: TCP's
  (:mod:`.rtt` measures). So is S3: with S3 near, UDP stays off for the fetch
  (:func:`udp_wanted`).
"""

from __future__ import annotations

import functools
import hashlib
import math
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

START_AFTER: Final = 0.1
"""Seconds into a fetch before the first look for a far holder. Not longer: whether a
holder is far is a round trip, known as soon as libtorrent has connected to it, and a far
region's TCP is slow from its first second (at 3 s, far nodes were a third done before
UDP's first datagram). A near holder is found near at once and costs nothing more.
Looks then come every :data:`HOLDER_WAIT` until a holder shows: at 0.5 s and 0.25 s,
far-region's first sessions started up to half a second after the holders' bitfields
came (seven alternating runs: 10.0 s mean against 10.5)."""

HOLDER_WAIT: Final = 0.1
"""Seconds before looking again when libtorrent has no holder connected yet (the fetch's
first second; a look is one ``get_peer_info``): not a failed try, so no backoff. Also
the first wait when every holder is near, doubling from there to
:data:`PROBE_BACKOFF_CAP` (a far holder may connect later: far nodes meet their own
region's peers first)."""

REGION_WAIT: Final = 0.25
"""Seconds a fetch's first session waits, once a far holder is found, for libtorrent to
meet a peer of this node's own region (a near one): sessions are dealt among the region
(:func:`region_order`), and the seeders the coordinator names come before libtorrent's
connects. far-region's four nodes started their first sessions dealt as if alone, 0.1 s
before they met each other, and pulled overlapping pieces across the WAN. A node alone
in its region waits this long once. (Waiting until every peer the coordinator named had
connected dealt no better and started later: 0.66-0.83 s from listening to the first
datagram against 0.59-0.77.)"""

OWNER_NEXT: Final = 32
"""Pieces of a region member's share counted as its next UDP pulls (two sessions of 16 MiB
of 1 MiB pieces): :func:`owners_next`. far-region's shares are about 32 pieces; a
helper took the last few of each from its far end, the very pieces their owner's second
session pulled then, and half of the second sessions' pieces came twice."""

OWNER_STALL: Final = 3.0
"""Seconds without a new piece of its share after which a member is helped with all of it
(a session of 16 pieces at a quarter of a far seeder's uplink takes about 3 s)."""

OWNER_HORIZON: Final = 3.0
"""Seconds of a member's pulls, at the rate its share has grown since it was first seen,
left to it (at most :data:`OWNER_NEXT` pieces; all of them for :data:`OWNER_STALL`
seconds after it was first seen, while its first sessions are on their way, and none
once its share has not grown for as long): a helper takes the rest from the far end.
With OWNER_NEXT for any member that made progress, a late or slow one (a node that
started a second after the others, its sessions at 1.5 MB/s) held its region's last
pieces alone: far-region's four nodes each had 116-117 of 128 pieces 9 s in, and took
14.5 s."""

WORTH_SECONDS: Final = 5.0
"""Try UDP only while TCP would take at least this long for what is missing: a fast
fleet finishes first, and never sends a UDP datagram."""

SESSION_BYTES: Final = 16 << 20
"""Least bytes asked of a session."""

SESSION_SECONDS: Final = 8.0
"""A session asks for this many seconds of UDP's last rate (if more than
:data:`SESSION_BYTES`), then the next one asks again from what is missing by then."""

MAX_SESSION_BYTES: Final = 1 << 30

PROBE_SECONDS: Final = 2.0
"""A session is not judged before this plus :data:`PROBE_RTTS` round trips: its handshake
takes a few round trips, and its rate doubles per round trip from an eighth of the
target (:mod:`swarm.udp.rate`)."""

PROBE_RTTS: Final = 10
"""Round trips of the holder's path added to :data:`PROBE_SECONDS` (3 s at 100 ms). At
2 s flat, the far fleet's first sessions (eight starting at once on two seeders) had
brought 0-2 MB/s while TCP from afar, still in its slow start before the first loss,
showed 3-4 MB/s: they stopped, and their holders waited 5 s while that TCP collapsed."""

RATE_WINDOW: Final = 1.5
"""Seconds over which UDP's and TCP's rates are compared while a session runs."""

UDP_BETTER: Final = 2.0
"""A UDP session goes on while it delivers at least this multiple of TCP's rate. Not 1:
a byte over UDP costs both daemons more CPU than one over libtorrent (Python against
C++), so on a near path where both fill the link TCP keeps it."""

PROBE_BACKOFF: Final = 5.0
PROBE_BACKOFF_CAP: Final = 60.0

TAIL_SHARE: Final = 0.75
"""A session with this share of its pieces in is in its tail: let finish whatever its
rate, and no longer counted against :data:`MAX_LANES`, so the next session (with the
same holder, maybe) starts while it ends."""

MAX_LANES: Final = 2
"""UDP sessions at once, each with another far holder. Not one: far nodes that chose the
same seeder by chance (three of four, half the time with two seeders) shared its uplink
while the other idled, and a session that got a third of it lost to TCP and waited 5 s;
with a session on each, every seeder serves every far node."""

RELIEF_MIN_PIECES: Final = 12
"""A running session with at least this many pieces still to come gives the back half
of them to a far seeder whose own session is done or in its tail (:func:`relief_pieces`;
fewer are not worth a new session's connect, handshake and ramp, a few round trips). A
node's two first sessions, one per seeder, are dealt equal halves of its share, but the
seeders' uplinks are not equally loaded: far-region's sessions from one seeder took
2.9-3.4 s, from the other 3.5-3.9 s, and the region's last pieces came over the second
while the first seeder's uplink idled (the WAN carried 10-26 MB/s of its 50 for the last
second of the sessions). Not fewer: at 4, reliefs of two or three pieces followed one
another, each a new session that split its seeder's budget once more and started at
half its share, and far-region took 9.65 s against 7.96 (13 pairs, faster in one). At 12
rather than 8 (a relief of at least six pieces), 26 alternating pairs: 7.91 s mean
against 8.20 (medians 7.90 and 8.03, faster in 15; 23 of 26 runs at most 8.05 s against
13, the slowest 8.59 s against 11.76)."""

HOLDER_PENALTY: Final = 30.0
"""Seconds a holder that failed (unreachable, no UDP server, wrong secret) is skipped."""

NEAR_RTT: Final = 0.02
"""A holder whose round trip is below this is near: TCP fills such a path (its rate goes
as 1/RTT), so UDP would only add CPU. It is not asked again during this fetch; when every
holder is near, the next look waits longer each time (:meth:`UdpChoice.all_near`). A
near fleet whose TCP is slow for another reason (CPU) tried UDP again and again before
this: 5-17% of its bytes, for nothing. The round trip is the kernel's least of
libtorrent's connection to the holder (:func:`kernel_min_rtts`), else of a few TCP
handshakes with its UDP control port (:func:`connect_rtt`); a session's own least RTT
catches a near holder whose path was queueing then."""


@dataclass
class UdpChoice:
    """When to pull over UDP, from the rates a node measures. Pure: ``now`` is passed in."""

    started_at: float
    next_try_at: float = 0.0
    backoff: float = PROBE_BACKOFF
    udp_rate: float = 0.0
    """The last session's rate, bytes/s (sizes the next one)."""
    near_wait: float = HOLDER_WAIT

    def __post_init__(self) -> None:
        self.next_try_at = self.started_at + START_AFTER

    def session_bytes(self, now: float, tcp_rate: float, missing_bytes: int) -> int:
        """Bytes to ask of a UDP session now; 0 to wait."""
        if missing_bytes <= 0 or now < self.next_try_at:
            return 0
        if tcp_rate > 0 and missing_bytes / tcp_rate < WORTH_SECONDS:
            return 0  # TCP finishes soon enough
        want = max(SESSION_BYTES, int(self.udp_rate * SESSION_SECONDS))
        return min(missing_bytes, MAX_SESSION_BYTES, want)

    def keep(self, running_for: float, udp_rate: float, tcp_rate: float, rtt: float = 0.0) -> bool:
        """Whether a running session goes on (rates over the last :data:`RATE_WINDOW`;
        ``rtt``: the holder's round trip, s)."""
        probing = running_for < PROBE_SECONDS + PROBE_RTTS * rtt
        return probing or udp_rate >= UDP_BETTER * tcp_rate

    def ended(self, now: float, udp_rate: float, paid: bool) -> None:
        """A session ended: it ran its course at ``udp_rate`` (``paid``: try again at
        once), or lost to TCP or failed (try again later, less often)."""
        self.udp_rate = udp_rate
        if paid:
            self.next_try_at, self.backoff = now, PROBE_BACKOFF
            return
        self.next_try_at = now + self.backoff
        self.backoff = min(PROBE_BACKOFF_CAP, self.backoff * 2)

    def no_holder(self, now: float) -> None:
        """No holder connected yet (or none holds a missing piece): look again soon,
        without counting a try."""
        self.next_try_at = now + HOLDER_WAIT

    def all_near(self, now: float) -> None:
        """Every holder is near: look again later, each time twice as late."""
        self.next_try_at = now + self.near_wait
        self.near_wait = min(PROBE_BACKOFF_CAP, self.near_wait * 2)

    def failed(self, now: float) -> None:
        """A session failed on its holder (refused, closed, timed out): that says nothing
        of UDP against TCP, so another holder may be tried at once (the caller has put
        this one aside); the backoff and the last rate stand."""
        self.next_try_at = now


@dataclass(frozen=True)
class Holder:
    ip: str
    seed: bool
    pieces: Sequence[bool]


def with_seeders(holders: Sequence[Holder], seeders: Iterable[str], own_ip: str) -> list[Holder]:
    """``holders`` (libtorrent's connected peers) and the seeders the coordinator named
    (``Artifact.seeders``) that are not among them yet, as seeds."""
    known = {h.ip for h in holders} | {own_ip}
    named = [Holder(ip, True, ()) for ip in dict.fromkeys(seeders) if ip not in known]
    return [*holders, *named]


def best_holder(
    holders: Sequence[Holder],
    missing: Sequence[int],
    skip: Callable[[str], bool],
    tie: Callable[[str], int] = lambda ip: 0,
) -> Holder | None:
    """A seed first, else the holder with most of ``missing``; ``skip``: penalized ips;
    ``tie`` orders equals (a hash with this node's id: far nodes spread over the seeds
    instead of all pulling from the first)."""

    def useful(h: Holder) -> int:
        return sum(1 for i in missing if i < len(h.pieces) and h.pieces[i])

    ranked = sorted(
        (h for h in holders if not skip(h.ip)),
        key=lambda h: (not h.seed, -useful(h), tie(h.ip), h.ip),
    )
    return next((h for h in ranked if h.seed or useful(h)), None)


def batch_pieces(
    missing: Sequence[int],
    holder: Holder,
    in_flight: set[int],
    count: int,
    order: Callable[[int], Any],
    nearby: frozenset[int] = frozenset(),
) -> list[int]:
    """Up to ``count`` of ``missing`` that ``holder`` has and no near peer holds
    (``nearby``), in ``order`` (a piece's sort key, :func:`region_order`): first those
    libtorrent is not downloading, then those in flight. Pieces in flight come, last: on
    a long path libtorrent's request queue holds nearly every missing piece (a deep
    queue for the bandwidth-delay product), and what arrives second is dropped.

    What a near peer holds is left to the region's exchange: far-region's nodes held
    every piece among them 4-5 s before the last was done, while sessions still pulled
    such pieces across the WAN, on the downlink the exchange needs (measured only
    together with :func:`region_order`)."""
    held = [
        i
        for i in sorted(missing, key=order)
        if holder.seed or (i < len(holder.pieces) and holder.pieces[i])
    ]
    wanted = [i for i in held if i not in nearby]
    fresh = [i for i in wanted if i not in in_flight]
    busy = [i for i in wanted if i in in_flight]
    return (fresh + busy)[:count]


def lane_part(pieces: list[int], limit: int, lanes: int) -> list[int]:
    """What one session takes of ``pieces`` (dealt for it, at most ``limit``) when
    ``lanes`` sessions, each from another holder, could start now: all of them when the
    candidates filled ``limit`` (the next session finds its own), else an even part, the
    next session the rest. A session's rate is its holder's share of the path, whatever
    its size: far-region's region lacked 14 pieces 3 s in, one session brought them in
    2.9 s, and every node waited on them at the end."""
    if lanes <= 1 or len(pieces) >= limit:
        return pieces
    return pieces[: -(-len(pieces) // lanes)]


def s3_far(s3_rtt: float | None) -> bool:
    """Whether S3's round trip (None: not measured, or S3 refused) says it is in another
    region: :data:`NEAR_RTT` or more. Such a node takes no ALL plan (the coordinator's
    "S3 fills every link", measured by the nodes near it: see ``read_origin``)."""
    return s3_rtt is not None and s3_rtt >= NEAR_RTT


def udp_wanted(s3_rtt: float | None) -> bool:
    """Whether a fetch may use UDP at all, from S3's round trip (None: no connection to S3,
    refused or never asked). With S3 near, TCP from S3 fills the link in the same region,
    and a peer's round trip is no proof of distance while this node's own queues fill:
    behind a full 100 ms queue, LAN peers in the s3-fast fleet measured 22-71 ms, took
    UDP sessions, and UDP carried 12-13% of that fleet's bytes for nothing."""
    return s3_rtt is None or s3_far(s3_rtt)


@functools.lru_cache(maxsize=64)
def piece_ranks(ip: str, count: int) -> array[int]:
    """A node's rank of each of ``count`` pieces: a hash of its address and the piece
    (8 bytes a piece: 64 members of 10,000-piece artifacts cost 5 MB). Cached: every
    batch deals the same region twice (:func:`region_order`, :func:`region_shares`), and
    hashed its members' ranks afresh each time."""
    return array(
        "Q",
        (
            int.from_bytes(hashlib.blake2b(f"{ip} {i}".encode(), digest_size=8).digest())
            for i in range(count)
        ),
    )


def region_order(own_ip: str, near_ips: Iterable[str], count: int) -> Callable[[int], Any]:
    """The order (a sort key per piece) in which this node pulls pieces over UDP, dealing
    them among its region: this node and the peers it found near.

    Each piece ranks the members by a hash of member and piece (rendezvous hashing: every
    node that sees the same region deals the same way, and one that sees a member fewer
    only takes a share more). The first member is the piece's owner, the second its first
    helper, and so on. A node takes its own share first, highest rank first, then the
    pieces it is first helper of, then second, ..., each from the far end of its owner's
    rank, where the owner gets last: a slow or late owner is helped without two nodes
    pulling the same piece at once. Highest first, because a node's first sessions are
    dealt before it has met its whole region: of the pieces it owns among those it knows,
    the ones it ranks highest are the likeliest to be its own among all: lowest first,
    a node that knew none of its three peers took none of its own 16 first pieces, one
    that knew one of them 2-4 (highest first: 10-16). With an order of its own alone,
    each far node pulled a random 40% of the pieces, and the region's sessions carried
    1.6 copies of the artifact across the WAN where one would do: the rest is the
    region's own exchange. With one helper order
    for all (the far end of each owner's share), every helper took the same pieces: the
    four far-region nodes' second sessions pulled the same 16 pieces from the seeders."""
    region = sorted({own_ip, *near_ips})
    ranks = [piece_ranks(ip, count) for ip in region]
    me = region.index(own_ip)

    def key(index: int) -> tuple[int, int]:
        mine = ranks[me][index]
        above = [r[index] for r in ranks if r[index] > mine]
        if not above:
            return (0, -mine)  # owner
        return (len(above), max(above))  # helper: from the far end of the owner's rank

    return key


@functools.lru_cache(maxsize=8)
def region_shares(members: tuple[str, ...], count: int) -> dict[str, tuple[int, ...]]:
    """Each member's share of the region's pieces, as :func:`region_order` deals them (a
    piece is the member's that ranks it highest), in the order its owner pulls it. One
    pass over the pieces (a C-level max per piece), kept for the region: owners' shares
    were a :func:`region_order` key per piece per owner, 40 million steps for 64 members
    of a 10,000-piece artifact."""
    ranks = [piece_ranks(ip, count) for ip in members]
    shares: list[list[int]] = [[] for _ in members]
    for index, column in enumerate(zip(*ranks, strict=True)):
        shares[column.index(max(column))].append(index)
    return {
        ip: tuple(sorted(share, key=ranks[m].__getitem__, reverse=True))
        for m, (ip, share) in enumerate(zip(members, shares, strict=True))
    }


def owners_next(
    own_ip: str,
    shares: dict[str, tuple[int, ...]],
    holders: Sequence[Holder],
    reserve: Callable[[str, int], int],
) -> frozenset[int]:
    """Pieces the region's other members are about to pull over UDP themselves: of each
    one's share (:func:`region_shares`), the first it does not hold, as many as
    ``reserve(ip, held)`` says (held pieces of its share, from its bitfield:
    :class:`OwnerProgress`). A helper leaves them to their owner."""
    held_by = {h.ip: h.pieces for h in holders}
    next_pulls: set[int] = set()
    for owner, share in shares.items():
        if owner == own_ip:
            continue
        pieces = held_by.get(owner, ())
        lacks = [i for i in share if not (i < len(pieces) and pieces[i])]
        next_pulls.update(lacks[: reserve(owner, len(share) - len(lacks))])
    return frozenset(next_pulls)


def share_lacking(
    share: Sequence[int], missing: Iterable[int], claimed: set[int], nearby: frozenset[int]
) -> list[int]:
    """Of this node's ``share`` (:func:`region_shares`), the missing pieces that no session
    of its own brings (``claimed``) and no near peer holds (``nearby``): nobody else in
    the region pulls them (:func:`owners_next`)."""
    lacking = set(missing) - claimed - nearby
    return [i for i in share if i in lacking]


class OwnerProgress:
    """How many of a region member's next pieces to leave it (:func:`owners_next`): what
    it brings in :data:`OWNER_HORIZON` at the rate its held share has grown since it was
    first seen (:data:`OWNER_NEXT` for :data:`OWNER_STALL` seconds from then, and at most
    that), none once it has not grown for :data:`OWNER_STALL` seconds. A share that
    shrinks (the region grew, or the member's bitfield was briefly not seen) starts the
    count afresh."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._first: dict[str, tuple[int, float]] = {}  # ip -> (held, when first seen)
        self._grew: dict[str, tuple[int, float]] = {}  # ip -> (held, when it last grew)

    def __call__(self, ip: str, held: int) -> int:
        now = self._clock()
        first = self._first.get(ip)
        if first is None or held < first[0]:
            self._first[ip] = first = (held, now)
            self._grew[ip] = (held, now)
        last = self._grew[ip]
        if held > last[0]:
            self._grew[ip] = last = (held, now)
        if now - last[1] >= OWNER_STALL:
            return 0
        seen_for = now - first[1]
        if seen_for < OWNER_STALL:
            return OWNER_NEXT
        rate = (held - first[0]) / seen_for  # pieces a second, at least 0
        return min(OWNER_NEXT, math.ceil(rate * OWNER_HORIZON))


def held_nearby(holders: Sequence[Holder], near: Callable[[str], bool]) -> frozenset[int]:
    """Pieces some near holder has."""
    return frozenset(i for h in holders if near(h.ip) for i, has in enumerate(h.pieces) if has)


class RateWindow:
    """Rates of cumulative byte counters over the last :data:`RATE_WINDOW` seconds."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, tuple[int, ...]]] = deque()

    def add(self, now: float, *counters: int) -> tuple[float, ...] | None:
        """Record the counters at ``now``; their rates (bytes/s), or None while the
        window spans under half a second."""
        self._samples.append((now, counters))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW:
            self._samples.popleft()
        then, before = self._samples[0]
        if now - then < 0.5:
            return None
        return tuple((c - b) / (now - then) for b, c in zip(before, counters, strict=True))


def relief_pieces(remaining: Sequence[int], least: int = RELIEF_MIN_PIECES) -> list[int]:
    """The pieces a running session gives a free far seeder: the back half of those it
    still has to get (``remaining``, in its order: the last it would get), none while
    fewer than ``least`` remain (see :data:`RELIEF_MIN_PIECES`)."""
    if len(remaining) < least:
        return []
    return list(remaining[len(remaining) - len(remaining) // 2 :])
