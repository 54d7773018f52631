"""The daemon's automatic UDP source: pull missing pieces over UDP when TCP is slow.

Where a node's TCP sources are far away (another region: 100 ms of RTT and a fraction of
a percent of loss hold one CUBIC flow to a few Mbit/s), a holder's UDP server (every
daemon with the fleet secret runs one, :mod:`swarm.udp`) carries the pieces at link
rate. Nothing tells a node that it is far: it measures.

- While the fetch would take :data:`WORTH_SECONDS` more at its TCP rate (peers and S3
  together), it opens a UDP *session* with the best holder its libtorrent peers show (a
  seed first, else the one holding most of what it lacks) for the pieces that holder
  has, :data:`SESSION_SECONDS` of UDP's last rate at a time. A session is long because
  each costs a few round trips (handshake, tail); batches of 4 MiB measured a fifth of
  UDP's rate on a 100 ms path.
- After :data:`PROBE_SECONDS`, a session goes on while UDP delivers :data:`UDP_BETTER`
  times what TCP brings from far (far peers and S3, :class:`FarTcp`: not the region's
  own exchange) over the last :data:`RATE_WINDOW`; when it does not (TCP caught up, or
  the holder is slow) it stops, and the next try waits twice as long as the last
  (:data:`PROBE_BACKOFF` to :data:`PROBE_BACKOFF_CAP`).
- A session takes missing pieces that the holder has, those libtorrent is not already
  downloading first, downwards from just below the node's stripe offset (S3 stripes go
  upwards from it, libtorrent rarest first), so the sources meet late (a duplicate costs
  one piece, which the sink drops) and the nodes of one region pull different pieces.
- A holder whose least round trip is under :data:`NEAR_RTT` is near: TCP's. The least is
  the kernel's, of this node's TCP connections to it (:func:`kernel_min_rtt`), else of a
  few connects (:func:`connect_rtt`).

The choice (:class:`UdpChoice`) is pure; :func:`auto_udp` moves the bytes. The holder's
UDP port is taken to be this node's own (a fleet-wide setting, ``--udp-port``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import logging
import math
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import libtorrent as lt

from swarm.agent.hybrid import stripe_offset
from swarm.agent.origin import InFlight
from swarm.agent.registry import Artifact
from swarm.agent.udpsource import SOURCE, pull_pieces
from swarm.sources.peers import TorrentSession
from swarm.udp import FetchStats, UdpAuthError, UdpError

log = logging.getLogger(__name__)

START_AFTER: Final = 0.5
"""Seconds into a fetch before the first look for a far holder. Not longer: whether a
holder is far is a round trip, known as soon as libtorrent has connected to it, and a far
region's TCP is slow from its first second (at 3 s, far nodes were a third done before
UDP's first datagram). A near holder is found near at once and costs nothing more."""

HOLDER_WAIT: Final = 0.25
"""Seconds before looking again when libtorrent has no holder connected yet (the fetch's
first second): not a failed try, so no backoff. Also the first wait when every holder
is near, doubling from there to :data:`PROBE_BACKOFF_CAP` (a far holder may connect
later: far nodes meet their own region's peers first)."""

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
"""A session is not judged before this: its handshake takes a few round trips, and its
rate doubles per report from an eighth of the target (:mod:`swarm.udp.rate`)."""

RATE_WINDOW: Final = 1.5
"""Seconds over which UDP's and TCP's rates are compared while a session runs."""

UDP_BETTER: Final = 2.0
"""A UDP session goes on while it delivers at least this multiple of TCP's rate. Not 1:
a byte over UDP costs both daemons more CPU than one over libtorrent (Python against
C++), so on a near path where both fill the link TCP keeps it."""

PROBE_BACKOFF: Final = 5.0
PROBE_BACKOFF_CAP: Final = 60.0

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

RTT_PROBES: Final = 3
"""TCP connects timed before a session (their least is the holder's round trip)."""

SS = shutil.which("ss") or "/usr/bin/ss"

RTT_REFRESH: Final = 1.0
"""Seconds between two reads of the kernel's round trips while a session runs (new peers
are classed near or far by them)."""
"""iproute2's socket statistics: the kernel's own view of this node's TCP connections."""


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

    def keep(self, running_for: float, udp_rate: float, tcp_rate: float) -> bool:
        """Whether a running session goes on (rates over the last :data:`RATE_WINDOW`)."""
        return running_for < PROBE_SECONDS or udp_rate >= UDP_BETTER * tcp_rate

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


TCP_INFO_RTT_OFFSET: Final = 68
"""Offset of ``tcpi_rtt`` (microseconds, u32) in Linux's ``struct tcp_info``."""


def kernel_min_rtts() -> dict[str, float]:
    """The least round trip the kernel has measured on this node's TCP connections, per
    peer address, in seconds (empty if there is no ``ss``). Linux keeps each connection's
    minimum over a window of minutes (``tcp_min_rtt_wlen``), so a moment with the queues
    drained is enough: on a near path under load, three connects in a row all waited
    behind full tbf queues (40-120 ms in the s3-fast fleet at a quarter of its rates), and
    every node ran two UDP sessions on its LAN, each flooding a 62.5 Mbit uplink for three
    seconds for under 1 MB/s."""
    try:
        done = subprocess.run(
            [SS, "-H", "-t", "-i", "-n"], capture_output=True, text=True, timeout=2.0, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[str, float] = {}
    peer: str | None = None
    for line in done.stdout.splitlines():
        if line[:1] not in (" ", "\t"):  # a connection: "STATE RECV-Q SEND-Q LOCAL PEER"
            fields = line.split()
            peer = _address(fields[-1]) if len(fields) >= 2 else None
            continue
        match = re.search(r"\bminrtt:([0-9.]+)", line)
        if peer is not None and match:
            found[peer] = min(found.get(peer, math.inf), float(match[1]) / 1e3)
    return found


def _address(endpoint: str) -> str:
    """``ss``'s ``ADDR:PORT`` as libtorrent names the address (no brackets, no IPv4-mapped
    prefix)."""
    ip = endpoint.rsplit(":", 1)[0].strip("[]").split("%")[0]
    return ip.removeprefix("::ffff:") if "." in ip else ip


def kernel_min_rtt(ip: str) -> float | None:
    """The kernel's least round trip of this node's TCP connections to ``ip`` (libtorrent's
    peer connection among them), seconds; None if there is none (:func:`kernel_min_rtts`)."""
    return kernel_min_rtts().get(ip)


def handshake_rtt(sock: socket.socket) -> float | None:
    """The kernel's round-trip estimate of a just-connected TCP socket (seconds): its
    SYN to SYN-ACK time, stamped by the kernel, so a busy node's late wake-up is not in
    it. None where the platform has no ``TCP_INFO``."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        (micros,) = struct.unpack_from("I", info, TCP_INFO_RTT_OFFSET)
    except (AttributeError, OSError, struct.error):
        return None
    return micros / 1e6 if micros > 0 else None


def connect_rtt(
    host: str, port: int, tries: int = RTT_PROBES, timeout: float = 1.0
) -> float | None:
    """The least round trip of ``tries`` TCP connects to ``host:port``, or None if none
    connected. Each is the kernel's handshake time (:func:`handshake_rtt`), else the
    connect's wall time (the path's round trip plus this node's wake-up: a near fleet on
    two saturated cores timed its neighbours at 23-103 ms and ran UDP sessions on its
    LAN, sending up to 461 Mbit/s into 100 Mbit uplinks). Each connection is closed at
    once: the server sees a control connection end before its hello."""
    best: float | None = None
    for _ in range(tries):
        started = time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=timeout) as sock:
                took = time.monotonic() - started
                kernel = handshake_rtt(sock)
        except OSError:
            continue
        took = kernel if kernel is not None else took
        best = took if best is None else min(best, took)
    return best


@dataclass(frozen=True)
class Holder:
    ip: str
    seed: bool
    pieces: Sequence[bool]


def holders_of(handle: Any, own_ip: str) -> list[Holder]:
    """The torrent's connected peers that hold pieces, from libtorrent. Peers on this
    node's address or on loopback are left out: daemons sharing an address (tests, one
    host) serve UDP on ports of their own, and ``port`` would be this node's server."""
    found = []
    for peer in handle.get_peer_info():
        ip = peer.ip[0]
        if ip == own_ip or ipaddress.ip_address(ip).is_loopback:
            continue
        seed = bool(peer.flags & lt.peer_info.seed)
        if seed or any(peer.pieces):
            found.append(Holder(ip, seed, peer.pieces))
    return found


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
    missing: Sequence[int], holder: Holder, in_flight: set[int], count: int, start: int
) -> list[int]:
    """Up to ``count`` of ``missing`` that ``holder`` has, downwards from ``start`` (and
    round from the top), those libtorrent is not downloading first. Nodes of one far
    region start at different places (their stripe offsets), so each piece tends to
    cross the WAN once and the rest travels between them. Pieces libtorrent is
    downloading come last, yet they come: on a long path its request queue holds
    nearly every missing piece (a deep queue for the bandwidth-delay product), and what
    arrives second is dropped."""
    below = [i for i in missing if i <= start]
    above = [i for i in missing if i > start]
    held = [
        i
        for i in itertools.chain(reversed(below), reversed(above))
        if holder.seed or (i < len(holder.pieces) and holder.pieces[i])
    ]
    free = [i for i in held if i not in in_flight]
    busy = [i for i in held if i in in_flight]
    return (free + busy)[:count]


class _RateWindow:
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


class FarTcp:
    """The rate UDP competes with: what TCP brings from far away, that is from peers whose
    kernel round trip is :data:`NEAR_RTT` or more (libtorrent's rate of each), plus S3.
    Not what near peers bring: in a far region those are the other far nodes, passing
    on what crossed the WAN (UDP's pieces among it); counting them, a session delivering
    far more than the holders' TCP lost to the region's own exchange and stopped."""

    def __init__(self, handle: Any, s3_bytes: Callable[[], int]) -> None:
        self.handle, self.s3_bytes = handle, s3_bytes
        self._s3 = _RateWindow()
        self._rtts: dict[str, float] = {}
        self._rtts_at = -math.inf

    def rate(self, now: float) -> float:
        """Bytes/s from far peers and S3 now (a peer the kernel has no round trip for,
        uTP or just gone, counts as far: when in doubt UDP has to win by more)."""
        if now - self._rtts_at >= RTT_REFRESH:
            self._rtts, self._rtts_at = kernel_min_rtts(), now
        peers = sum(
            p.payload_down_speed
            for p in self.handle.get_peer_info()
            if self._rtts.get(p.ip[0], math.inf) >= NEAR_RTT
        )
        s3 = self._s3.add(now, self.s3_bytes())
        return peers + (s3[0] if s3 else 0.0)


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
    """Pull pieces over UDP while it beats TCP (see the module docstring). Returns when
    the artifact is complete or cancelled."""
    try:
        manifest, sink = artifact.manifest, artifact.sink
        state = session.torrents[manifest.info_hash]
        handle = state.handle
        in_flight = InFlight(handle)
        choice = UdpChoice(time.monotonic())
        count = manifest.layout.count
        start = (stripe_offset(node_id, count) - 1) % count if count else 0
        penalties = _Penalties()
        far: dict[str, float] = {}  # holders whose connects showed them far (ms): probed once

        def set_near(ip: str, seconds: float, how: str) -> None:
            log.info("udp: %s is near (%s %.1f ms): TCP's", ip, how, seconds * 1e3)
            penalties.add(ip, math.inf)

        window = _RateWindow()  # TCP's bytes/s, near peers too: whether UDP is worth trying
        far_tcp = FarTcp(handle, lambda: sink.bytes_by_source.get("s3", 0))

        def tcp_bytes() -> int:
            by = sink.bytes_by_source
            return by.get("peers", 0) + by.get("s3", 0)

        while not artifact.complete_on_disk() and not artifact.cancel.is_set():
            now = time.monotonic()
            rates = window.add(now, tcp_bytes())
            tcp_rate = rates[0] if rates else 0.0
            missing = sink.missing()
            want = choice.session_bytes(now, tcp_rate, len(missing) * manifest.piece_size)
            if not want:
                artifact.cancel.wait(min(0.5, max(0.05, choice.next_try_at - now)))
                continue
            holders = [h for h in holders_of(handle, own_ip) if not penalties.skip(h.ip)]
            rtts = kernel_min_rtts() if holders else {}
            for h in holders:  # near holders are TCP's, whichever is best
                if rtts.get(h.ip, math.inf) < NEAR_RTT:
                    set_near(h.ip, rtts[h.ip], "kernel's least")
            holder = best_holder(
                holders, missing, penalties.skip, lambda ip: _node_hash(node_id, ip)
            )
            pieces = (
                batch_pieces(
                    missing, holder, in_flight(), max(1, want // manifest.piece_size), start
                )
                if holder is not None
                else []
            )
            if holder is None or not pieces:
                if holders and not any(not penalties.skip(h.ip) for h in holders):
                    choice.all_near(now)
                else:
                    choice.no_holder(now)  # none yet (libtorrent still connecting)
                continue
            kernel = rtts.get(holder.ip)
            if holder.ip not in far:
                # The kernel's round trip of libtorrent's connection, else (uTP, or just
                # gone) a few connects to the holder's UDP control port, timed.
                how = "kernel's least" if kernel is not None else "connect"
                rtt = kernel if kernel is not None else connect_rtt(holder.ip, port)
                if rtt is None:
                    log.info("udp: %s:%d refuses connections", holder.ip, port)
                    penalties.add(holder.ip)
                    choice.failed(time.monotonic())
                    continue
                if rtt < NEAR_RTT:
                    set_near(holder.ip, rtt, how)
                    choice.all_near(time.monotonic())
                    continue
                log.info("udp: %s is far (%s %.1f ms)", holder.ip, how, rtt * 1e3)
                far[holder.ip] = rtt
            pull = _Session(artifact, holder.ip, port, secret, pieces, far_tcp)
            udp_rate, paid = pull.run(choice)
            if pull.error is not None:
                log.info("udp from %s:%d failed: %s", holder.ip, port, pull.error)
                penalties.add(holder.ip)
                choice.failed(time.monotonic())
                continue
            if not paid:
                log.info(
                    "udp from %s off: %.1f MB/s against TCP's %.1f MB/s",
                    holder.ip,
                    udp_rate / 1e6,
                    pull.tcp_rate / 1e6,
                )
            else:
                log.info(
                    "udp from %s: %d pieces at %.1f MB/s", holder.ip, len(pieces), udp_rate / 1e6
                )
            if pull.stats is not None:
                st = pull.stats
                log.info(
                    "udp session: %.2fs, sender %.0f Mbit/s, srtt %s, min rtt %s, naks %d, "
                    "dup %d, block %d",
                    st.seconds, st.sender_rate_bps / 1e6, st.srtt, st.min_rtt, st.naks,
                    st.duplicates, st.block_size,
                )  # fmt: skip
                if st.min_rtt is not None and st.min_rtt < NEAR_RTT:
                    set_near(holder.ip, st.min_rtt, "rtt")
                    paid = False
            choice.ended(time.monotonic(), udp_rate, paid)
    except (KeyError, RuntimeError):
        # libtorrent let go of the torrent (KeyError from our table, RuntimeError from a
        # stale handle): expected as a directly-read file is handed over on completion
        if not (artifact.complete_on_disk() or artifact.cancel.is_set()):
            raise


class _Session:
    """One UDP fetch in a thread of its own, watched from the caller's: stopped when it
    loses to TCP (:meth:`UdpChoice.keep`) or the artifact is cancelled."""

    def __init__(
        self,
        artifact: Artifact,
        ip: str,
        port: int,
        secret: bytes,
        pieces: list[int],
        far_tcp: FarTcp,
    ) -> None:
        self.artifact, self.ip, self.port, self.secret = artifact, ip, port, secret
        self.pieces = pieces
        self.far_tcp = far_tcp
        self.stop = threading.Event()
        self.error: Exception | None = None
        self.tcp_rate = 0.0
        self.stats: FetchStats | None = None

    def _fetch(self) -> None:
        try:
            self.stats = pull_pieces(
                self.artifact, self.ip, self.port, self.secret, self.pieces, self.stop
            )
        except (UdpError, UdpAuthError) as error:  # UdpAuthError: a fleet misconfigured
            self.error = error

    def run(self, choice: UdpChoice) -> tuple[float, bool]:
        """Run it; (its UDP rate, whether it ran its course)."""
        by = self.artifact.sink.bytes_by_source
        started = time.monotonic()
        udp_at_start = by.get(SOURCE, 0)
        window = _RateWindow()  # UDP's bytes/s
        window.add(started, udp_at_start)
        worker = threading.Thread(target=self._fetch, name="udp-auto-fetch", daemon=True)
        worker.start()
        lost = False
        while worker.is_alive():
            worker.join(0.25)
            if self.artifact.cancel.is_set():
                self.stop.set()
                continue
            now = time.monotonic()
            rates = window.add(now, by.get(SOURCE, 0))
            self.tcp_rate = self.far_tcp.rate(now)
            if rates is None or self.stop.is_set():
                continue
            (udp_rate,) = rates
            if not choice.keep(now - started, udp_rate, self.tcp_rate):
                lost = True
                self.stop.set()
        took = max(time.monotonic() - started, 1e-3)
        rate = (by.get(SOURCE, 0) - udp_at_start) / took
        return rate, not lost and self.error is None
