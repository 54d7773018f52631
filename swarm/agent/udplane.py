"""One automatic UDP session (:mod:`.udpauto`'s lanes): a thread that pulls a holder's
pieces and a thread that watches it against TCP from the same holder.

A session may be opened ahead of its pieces (:meth:`Lane.deal`): it connects,
authenticates and proves its UDP path while its node still deals.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

from swarm.agent.registry import Artifact
from swarm.agent.udpchoice import TAIL_SHARE, RateWindow, UdpChoice
from swarm.agent.udpsource import SOURCE, pull_pieces
from swarm.udp.api import CONNECT_TIMEOUT, FetchStats, UdpAuthError, UdpError

log = logging.getLogger("swarm.agent.udpauto")  # one log for the UDP source's choices


def tcp_rate_from(handle: Any, ip: str) -> float:
    """Bytes/s libtorrent receives from the holder at ``ip`` (every connection to it): the
    rate a UDP session from that holder competes with. Not S3's nor other holders': those
    are other paths, and what they bring adds to a session's instead of replacing it (at a
    quarter of far-region's rates, S3's eight flows across the WAN made 2-3 MB/s, twice a
    session's share of a seeder's uplink; sessions judged against them stopped, their
    holders waited 5-10 s, and UDP carried 16-20% of the bytes against 30-34%)."""
    return float(sum(p.payload_down_speed for p in handle.get_peer_info() if p.ip[0] == ip))


class Lane:
    """One UDP session with one holder, in a thread of its own that also watches it: it
    stops when it loses to TCP from the same holder (:meth:`UdpChoice.keep` against
    :func:`tcp_rate_from`: the path got better) or the artifact is cancelled. Its rate,
    judged, logged and sizing the next session, is what it brought that was new (a piece
    another source brought first is not counted)."""

    def __init__(
        self,
        artifact: Artifact,
        ip: str,
        port: int,
        secret: bytes,
        pieces: list[int] | None,
        handle: Any,
        choice: UdpChoice,
        rtt: float,
        rate_bps: int,
        connect_timeout: float = CONNECT_TIMEOUT,
        skip: Callable[[int], bool] | None = None,
    ) -> None:
        self.artifact, self.ip, self.port, self.secret = artifact, ip, port, secret
        self.connect_timeout = connect_timeout
        self.skip = skip
        """Pieces to leave to another source (:class:`RegionHeld`)."""
        self.released: set[int] = set()
        """Pieces given to another session (:meth:`release`): skipped like ``skip``'s."""
        self.rate_bps = rate_bps
        self.rtt = rtt
        self.pieces: list[int] = pieces or []
        self.dealt = pieces is not None
        """False while the session is opened ahead of its pieces (:meth:`deal`)."""
        self._dealing: Future[Sequence[int]] | None = None if self.dealt else Future()
        self.opened = time.monotonic()
        self.handle = handle
        self.choice = choice
        self.stop = threading.Event()
        self.error: Exception | None = None
        self.stats: FetchStats | None = None
        self.new_bytes = 0
        self.rate = 0.0
        self.tcp_rate = 0.0
        self.paid = False
        self._started = time.monotonic()
        self._fetcher = threading.Thread(target=self._fetch, name="udp-auto-fetch", daemon=True)
        self._watcher = threading.Thread(target=self._watch, name="udp-auto-watch", daemon=True)
        self._fetcher.start()
        self._watcher.start()

    @property
    def running(self) -> bool:
        return self._watcher.is_alive()

    def deal(self, pieces: list[int]) -> bool:
        """Give a session opened ahead its pieces; False if it has ended meanwhile."""
        dealing = self._dealing
        if dealing is None or not self.running:
            return False
        self.pieces, self.dealt, self._started = pieces, True, time.monotonic()
        with contextlib.suppress(InvalidStateError):  # cancelled as it ended
            dealing.set_result(pieces)
            return True
        return False

    def abandon(self) -> None:
        """End a session opened ahead that is dealt nothing."""
        if self._dealing is not None and not self.dealt:
            with contextlib.suppress(InvalidStateError):
                self._dealing.set_result([])

    def delivered_bps(self) -> float | None:
        """What the path delivered to this session (bit/s): every payload byte received
        once it ended, the new bytes while it runs; None over its first half second."""
        seconds = time.monotonic() - self._started
        if self.stats is not None and self.stats.seconds >= 0.5:
            return self.stats.bytes * 8 / self.stats.seconds
        return self.new_bytes * 8 / seconds if seconds >= 0.5 else None

    def join(self) -> None:
        self._watcher.join()

    def _offer(self, index: int, data: bytes | memoryview) -> bool:
        sink = self.artifact.sink
        new = not sink.have(index)
        kept = sink.offer(index, data, SOURCE)
        if kept and new:
            self.new_bytes += len(data)
        return kept

    def _fetch(self) -> None:
        try:
            self.stats = pull_pieces(
                self.artifact, self.ip, self.port, self.secret, self._dealing or self.pieces,
                self.stop,
                offer=self._offer, rate_bps=self.rate_bps, connect_timeout=self.connect_timeout,
                skip=self._leaves,
            )  # fmt: skip
        except (UdpError, UdpAuthError) as error:  # UdpAuthError: a fleet misconfigured
            self.error = error

    def _watch(self) -> None:
        window = RateWindow()  # this session's new bytes/s
        window.add(self._started, 0)
        lost = False
        while self._fetcher.is_alive():
            self._fetcher.join(0.25)
            if self.artifact.cancel.is_set():
                self.stop.set()
                continue
            now = time.monotonic()
            rates = window.add(now, self.new_bytes)
            self.tcp_rate = tcp_rate_from(self.handle, self.ip)
            if not self.dealt:
                window = RateWindow()  # judged from its pieces' request on
                window.add(now, 0)
                continue
            if rates is None or self.stop.is_set() or self.in_tail():
                continue
            if not self.choice.keep(now - self._started, rates[0], self.tcp_rate, self.rtt):
                lost = True
                self.stop.set()
        self.rate = self.new_bytes / max(time.monotonic() - self._started, 1e-3)
        self.paid = not lost and self.error is None

    def _leaves(self, index: int) -> bool:
        """Whether the session leaves piece ``index`` to another source."""
        return index in self.released or (self.skip is not None and self.skip(index))

    def remaining(self) -> list[int]:
        """The pieces this session has still to get, in its order (none while undealt)."""
        have = self.artifact.sink.have
        return [i for i in self.pieces if not have(i) and not self._leaves(i)]

    def release(self, pieces: Sequence[int]) -> None:
        """Give ``pieces`` to another session: the sender is told to skip them (blocks
        already on their way still come)."""
        self.released.update(pieces)

    def in_tail(self) -> bool:
        """Whether most of this lane's pieces are in: the rest are NAKed blocks coming a
        round trip at a time, a rate that says nothing of the path (sessions judged then
        were stopped as losing, and their holder waited out a backoff)."""
        if not self.dealt:
            return False
        have = self.artifact.sink.have
        done = sum(1 for i in self.pieces if have(i) or self._leaves(i))
        return done >= TAIL_SHARE * len(self.pieces)

    def log_outcome(self) -> None:
        if self.error is not None:
            log.info("udp from %s:%d failed: %s", self.ip, self.port, self.error)
            return
        if self.paid:
            given = f" ({len(self.released)} given to another session)" if self.released else ""
            log.info("udp from %s: %d pieces%s at %.1f MB/s", self.ip, len(self.pieces), given,
                     self.rate / 1e6)  # fmt: skip
        else:
            log.info("udp from %s off: %.1f MB/s against TCP's %.1f MB/s from it", self.ip,
                     self.rate / 1e6, self.tcp_rate / 1e6)  # fmt: skip
        st = self.stats
        if st is not None:
            log.info(
                "udp session: %.2fs, asked %.0f Mbit/s, sender %.0f Mbit/s, srtt %s, "
                "min rtt %s, naks %d, dup %d, skipped %d, block %d",
                st.seconds, self.rate_bps / 1e6, st.sender_rate_bps / 1e6, st.srtt,
                st.min_rtt, st.naks, st.duplicates, st.skipped, st.block_size,
            )  # fmt: skip
