"""A downloading node's uploads paced under its uplink, so that its downloads' ACKs pass.

A node whose uplink is much narrower than its downlink (the slow-uploads fleet: 20 Mbit
up, 400 down) fills it with BitTorrent uploads, and the uplink's queue then holds the
ACKs of everything it downloads: a TCP flow is as fast as its ACKs come back. In the
fleet lab (a host of 5 Mbit up and 100 down, origin 250 Mbit) the host's download from
the origin ran at 12.0 MB/s with its uplink idle, 5.0-5.6 with one or four unpaced TCP
uploads filling it (the uplink's queue at 300 KB), and 12.0 again with the same uploads
paced by the kernel (``SO_MAX_PACING_RATE``) at 0.8-0.9 of the uplink in all: the queue
stayed empty. libtorrent's own upload limit releases its quota in bursts (15-155 KB
queued at 85% of the uplink with a 100 ms tick) and did not help.

So while this node fetches, once every sending upload flow has shown a standing queue
(its smoothed round trip well above its least) for :data:`PROOF_SECONDS` on a link that
has received far more than it sends and whose sending rate has stopped growing, each of
libtorrent's peer connections is paced by the kernel at its part of :data:`PACE_SHARE`
of that rate, less what else the uplink carries (the downloads' ACKs), split among the
connections that had bytes to send lately. libtorrent
exposes no pacing of its own, but its sockets are this process's file descriptors: the
pacer finds them by their peers' addresses and sets the option on a duplicate of each
(closed at once: a held duplicate would keep a connection libtorrent closes open). Once
nothing is being fetched, the connections are unpaced: a seeder's uploads are its only
traffic. The interface's counters (:mod:`.linkcount`) measure the link, as libtorrent's
upload counter does not.

In the lab test (``tests/fleet/test_uplink_pacer.py``) that host's download ran at
3.3-3.7 MB/s with its uplink full, 7.9-12.0 with the pacer. The slow-uploads fleet at a
quarter of its rates, sixteen alternating pairs over four versions of this rule
(``bench/fleet.py --scenario slow-uploads --rate-scale 0.25 --systems swarm``): faster
in thirteen, by about a second of 38-40 (that version's six: 39.13 s mean against
39.81). Elsewhere it does not engage (swarm-bound, mixed: no side four times narrower).
Its nodes then paced themselves 4-28 s into their fetch, the fleet's last one last; with
the fleet's download peaks as the measure of a link's asymmetry (:func:`narrow_uplink`)
and each flow's queue over the least round trip of any (:func:`queue_delay`), 1.5-3.5 s
in (with S3's reads under ALL no longer waiting on slow peers, ``swarm.agent.origin``:
36.52 s mean against 38.91, five alternating pairs, faster in five).
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from swarm.agent.linkcount import interface_counter, interface_for

log = logging.getLogger(__name__)

SO_MAX_PACING_RATE: Final = getattr(socket, "SO_MAX_PACING_RATE", 47)
"""Linux's per-socket pacing cap, bytes/s (TCP paces itself once it is set)."""

UNPACED: Final = 0xFFFFFFFF
"""The cap that means none (the kernel's ~0U)."""

TCP_INFO_FIELDS: Final = struct.Struct("=24xI40xI48xQ16xII")
"""``struct tcp_info``: tcpi_unacked (offset 24), tcpi_rtt (68, µs), tcpi_bytes_acked
(120), tcpi_notsent_bytes (144), tcpi_min_rtt (148, µs; Linux >= 4.6)."""

PERIOD: Final = 0.5
"""Seconds between looks."""

RATE_WINDOW: Final = 1.0
"""The interface's rates are over at least this many seconds (a shaper's burst passes a
shorter window at more than the link's rate)."""

QUEUE_DELAY: Final = 0.04
"""Seconds by which every sending upload flow's smoothed round trip exceeds its least
when a queue stands at this node's uplink: the slow-uploads fleet's held 0.1-0.4 s."""

MIN_FLOWS: Final = 2
"""Sending flows needed to tell a queue at this node's uplink from one further on."""

ASYMMETRY: Final = 4.0
"""Only a node that has received at least this multiple of what it sent (the fastest
seconds of each) paces: there the uplink is the narrow side, and the downloads are what
its queue would slow. Where both ways are alike, uploads are what the fleet is short of
and are left whole (the mixed fleet's 75/25 Mbit links show about 3). Not 5: the node
whose full uplink starves its downloads shows less than its link; in slow uploads at a
quarter of the rates (100/5 Mbit) the fleet's last node had received at most 2.7 MB/s
against 0.62 sent (4.3x), never paced, and finished 5-10 s after the others (a debug
log of the peaks). With 4: 36.8-38.4 s in three runs against 38.2-40.5 in two
alternating; mixed and swarm-bound at a quarter never paced (one run each)."""

PACE_SHARE: Final = 0.9
"""Of the uplink's rate, what the paced connections may send in all (the rest is room
for the downloads' ACKs and requests)."""

SENDING_SECONDS: Final = 2.0
"""A connection that had bytes to send this recently gets a share of the budget."""

MIN_UPLOAD_SHARE: Final = 0.25
"""Of the budget, what the uploads keep whatever else the uplink carries."""

PROOF_SECONDS: Final = 2.0
"""A queue must stand this long, with the uplink's rate flat (within :data:`PLATEAU`),
before pacing starts: a link whose uploads are still ramping up shows a queue and a
narrow side that are not its own (a swarm-bound node of 200/200 Mbit, sending 2 MB/s
of its 25 at 1.5 s while S3 gave it 21, with CPU-delayed round trips, paced itself at
1.9 MB/s)."""

PLATEAU: Final = 1.1
"""The uplink's rate has stopped growing while it stays under this multiple of what it
was when the queue was first seen."""


@dataclass(frozen=True)
class FlowInfo:
    """What the kernel knows of one upload connection (``TCP_INFO``)."""

    queued: bool
    """It has bytes in flight or waiting to be sent."""
    rtt: float
    """Smoothed round trip, seconds."""
    min_rtt: float
    """Least round trip seen, seconds (0: unknown)."""
    acked: int = 0
    """Bytes the peer has acknowledged since the connection opened."""


def flow_info(sock: socket.socket) -> FlowInfo | None:
    """``sock``'s TCP_INFO, or None where the kernel gives too little of it."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_FIELDS.size)
    except OSError:
        return None
    if len(raw) < TCP_INFO_FIELDS.size:
        return None
    unacked, rtt, acked, notsent, min_rtt = TCP_INFO_FIELDS.unpack_from(raw)
    return FlowInfo(unacked > 0 or notsent > 0, rtt / 1e6, min_rtt / 1e6, acked)


def queue_delay(flows: list[FlowInfo]) -> float:
    """The standing delay every sending flow sees (the least of theirs): a queue at
    this node's uplink holds them all, one at a receiver's downlink only the flows to
    it. 0 with fewer than :data:`MIN_FLOWS` flows sending (one flow cannot tell).

    Each flow's delay is over the least round trip of any of the node's flows, not its
    own: a connection opened while the queue stood has never seen the link without it
    (slow uploads at a quarter of the rates: new connections at 455-879 ms, their least
    the same, beside older ones at 0.1 ms; each such look read as no queue and
    restarted the proof, and the node paced itself 7-15 s into its fetch)."""
    known = [f.min_rtt for f in flows if f.min_rtt > 0]
    if not known:
        return 0.0
    base = min(known)
    delays = [f.rtt - base for f in flows if f.queued and f.min_rtt > 0]
    return min(delays) if len(delays) >= MIN_FLOWS else 0.0


def peer_sockets(
    peers: set[tuple[str, int]], among: Iterable[int] | None = None
) -> Iterator[tuple[int, socket.socket]]:
    """This process's TCP sockets connected to ``peers`` (ip, port): each one's file
    descriptor and a duplicate of it, closed as the caller asks for the next. ``among``:
    only these descriptors (found by an earlier call; one that was closed and reused
    meanwhile is left out by its peer), not every one of the process's."""
    if among is None:
        try:
            among = (int(name) for name in os.listdir("/proc/self/fd"))
        except OSError:
            return
    for fd in among:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            dup = os.dup(fd)
        except OSError:  # closed meanwhile
            continue
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername()[:2] in peers:
                yield fd, sock
        except OSError:  # not connected, or not an internet socket
            pass
        finally:
            sock.close()


class LinkRates:
    """An interface's byte counters as rates over :data:`RATE_WINDOW`, and the fastest."""

    def __init__(self, interface: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.interface = interface
        self._clock = clock
        self._samples: deque[tuple[float, int, int, int]] = deque()
        self.sent = self.received = self.uploaded = 0.0
        self.sent_peak = self.received_peak = 0.0

    def sample(self, uploads: int) -> bool:
        """Read the counters (``uploads``: what the upload connections have had
        acknowledged, a running total); False if the interface cannot be read."""
        tx = interface_counter(self.interface, "tx_bytes")
        rx = interface_counter(self.interface, "rx_bytes")
        if tx is None or rx is None:
            return False
        self.add(self._clock(), tx, rx, uploads)
        return True

    def add(self, now: float, tx: int, rx: int, uploads: int = 0) -> None:
        samples = self._samples
        samples.append((now, tx, rx, uploads))
        while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW:
            samples.popleft()
        then, tx0, rx0, up0 = samples[0]
        if now - then >= RATE_WINDOW:
            span = now - then
            self.sent, self.received = (tx - tx0) / span, (rx - rx0) / span
            self.uploaded = (uploads - up0) / span
            self.sent_peak = max(self.sent_peak, self.sent)
            self.received_peak = max(self.received_peak, self.received)


def narrow_uplink(rates: LinkRates, fleet_down: float = 0.0) -> bool:
    """The link receives at least :data:`ASYMMETRY` times what it sends (the fastest
    seconds of each): its uplink is the narrow side. What it receives is the most it
    has, or what the fleet's nodes do (``fleet_down``, the coordinator's median of their
    download peaks), if more: an autoscaled fleet's nodes are alike, and a node whose
    full uplink slows its downloads shows less than its link for as long as it is not
    paced (slow uploads at a quarter of the rates: the fleet's last node received at
    most 2.3 MB/s for 20 s while the median node's peak was 7.5-8.7)."""
    received = max(rates.received_peak, fleet_down)
    return rates.sent_peak > 0 and ASYMMETRY * rates.sent_peak <= received


def first_budget(rates: LinkRates, delay: float, fleet_down: float = 0.0) -> float | None:
    """What the upload connections may send in all (bytes/s), if they are to be paced
    from now on: a queue stands at the uplink, and it is the link's narrow side. The
    uplink's rate is what it sends now, its queue full (or the most it ever sent)."""
    if delay < QUEUE_DELAY or not narrow_uplink(rates, fleet_down):
        return None
    return PACE_SHARE * max(rates.sent, rates.sent_peak)


class Pacing:
    """When to pace and at what budget, from one look after another (pure: the pacer
    feeds it what it measured)."""

    def __init__(self) -> None:
        self.budget: float | None = None
        """Bytes/s the upload connections may send in all; None: unpaced."""
        self._streak: tuple[float, float] | None = None
        """(since, the uplink's rate then) of the queue seen look after look."""

    def look(
        self, now: float, rates: LinkRates, delay: float, fleet_down: float = 0.0
    ) -> float | None:
        """The budget after a look while fetching (``delay``: the queue on the upload
        flows, :func:`queue_delay`; ``fleet_down``: see :func:`narrow_uplink`)."""
        if self.budget is not None:
            return self.budget  # the uplink's rate, proven: it stands for the fetch
        budget = first_budget(rates, delay, fleet_down)
        if budget is None:
            self._streak = None
            return None
        if self._streak is None or rates.sent > PLATEAU * self._streak[1]:
            self._streak = (now, rates.sent)  # a new queue, or the uplink still speeding up
            return None
        if now - self._streak[0] < PROOF_SECONDS:
            return None
        self.budget = budget
        return budget

    def done(self) -> None:
        """Nothing is fetched any more: unpaced, and the next fetch proves its queue anew."""
        self.budget = self._streak = None


class UplinkPacer:
    """The daemon's pacer: :meth:`step` every :data:`PERIOD` on a thread of its own."""

    def __init__(
        self,
        interface: str,
        peers: Callable[[], set[tuple[str, int]]],
        fetching: Callable[[], bool],
        fleet_down: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.rates = LinkRates(interface)
        self._peers = peers
        self._fetching = fetching
        self._fleet_down = fleet_down
        """What the fleet's nodes receive, as the coordinator says (:func:`narrow_uplink`)."""
        self.pacing = Pacing()
        self._sending: dict[tuple[str, int], float] = {}
        """Each peer connection's last look with bytes to send."""
        self._acked: dict[tuple[str, int], int] = {}
        """Each peer connection's acknowledged bytes at the last look."""
        self._uploads = 0
        """What the peer connections have had acknowledged, in all, since the start."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="uplink-pacer", daemon=True)

    @classmethod
    def for_address(
        cls,
        listen_ip: str,
        peers: Callable[[], set[tuple[str, int]]],
        fetching: Callable[[], bool],
        fleet_down: Callable[[], float] = lambda: 0.0,
    ) -> UplinkPacer | None:
        """A pacer for the interface holding ``listen_ip`` (for 0.0.0.0, the default
        route's); None where there is none to measure (loopback, no ``/sys``)."""
        interface = interface_for(listen_ip)
        return None if interface is None else cls(interface, peers, fetching, fleet_down)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(PERIOD):
            try:
                self.step()
            except Exception:  # a pacer that fails must not take the daemon with it
                log.exception("uplink pacer failed; uploads are no longer paced")
                return

    @property
    def budget(self) -> float | None:
        """The uplink's pacing budget, bytes/s, while paced."""
        return self.pacing.budget

    def step(self) -> None:
        if not self.rates.sample(self._uploads):
            return
        fetching = self._fetching()
        fleet_down = self._fleet_down() if fetching else 0.0
        if self.budget is None and not (fetching and narrow_uplink(self.rates, fleet_down)):
            self.pacing.done()
            return  # nothing to pace: no socket looked at (the common case, cheaply)
        peers = self._peers()
        if not fetching:
            log.info("uplink: nothing is fetched any more, uploads unpaced")
            self.pacing.done()
            self._cap(peers, UNPACED)
            return
        now = time.monotonic()
        infos = []
        acked: dict[tuple[str, int], int] = {}
        found: list[int] = []  # capped below without a second look at every descriptor
        for fd, sock in peer_sockets(peers):
            found.append(fd)
            info = flow_info(sock)
            if info is not None:
                infos.append(info)
                peer = sock.getpeername()[:2]
                acked[peer] = info.acked
                if info.queued:
                    self._sending[peer] = now
        self._uploads += sum(
            max(0, count - self._acked[peer])
            for peer, count in acked.items()
            if peer in self._acked
        )
        self._acked = acked
        delay = queue_delay(infos)
        # split among the connections that had bytes to send lately, not only now: a
        # connection between two requests, left at the whole budget, overran the uplink
        self._sending = {p: t for p, t in self._sending.items() if now - t <= SENDING_SECONDS}
        sending = len(self._sending)
        was_paced = self.budget is not None
        budget = self.pacing.look(now, self.rates, delay, fleet_down)
        if budget is None:
            return
        if not was_paced:
            log.info(
                "uplink: a %.0f ms queue on the uploads of a link that received %.0f KB/s "
                "(the fleet's nodes %.0f) and sends %.0f: uploads paced, %.0f KB/s in all, "
                "while fetching",
                delay * 1e3, self.rates.received_peak / 1e3, fleet_down / 1e3,
                self.rates.sent / 1e3, budget / 1e3,
            )  # fmt: skip
        # what else leaves by the uplink (the downloads' ACKs and requests: up to a third
        # of a 5 Mbit uplink for a 100 Mbit download) comes out of the uploads' part
        others = max(0.0, self.rates.sent - self.rates.uploaded)
        uploads = max(MIN_UPLOAD_SHARE * budget, budget - others)
        self._cap(peers, max(1, int(uploads / max(1, sending))), found)

    @staticmethod
    def _cap(peers: set[tuple[str, int]], rate: int, among: Iterable[int] | None = None) -> None:
        """Every connection to ``peers`` (among those descriptors) capped at ``rate``
        bytes/s."""
        value = struct.pack("=I", min(rate, UNPACED))  # unsigned: UNPACED is no C int
        for _, sock in peer_sockets(peers, among):
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, value)
            except OSError:
                continue
