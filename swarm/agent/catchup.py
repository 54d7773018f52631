"""A node that falls behind its fleet holds its uploads back so that its requests reach
its peers.

A node's requests to a peer travel on the connection that carries its uploads to that
peer, behind the piece data queued there (libtorrent's writes fill the socket beyond
``TCP_NOTSENT_LOWAT``) and behind its uplink's queue. In the mixed fleet at a quarter
of its rates (25 Mbit uplinks) one node a run got 26-250 KB/s from the five peers it
uploaded 430-1,000 KB/s to, and 400-1,100 KB/s from the two it uploaded little to
(``get_peer_info``, one traced run); libtorrent sizes a connection's request queue by
what that peer gives, so a starved connection stayed starved, and the node finished
3-6 s after the fleet's median, for 10-25 s at a third of what its peers got.

The remedy is local: once the node's progress trails its fetching peers' median by
:data:`BEHIND` (or by :data:`EARLY_BEHIND` and falling further behind), its uploads for
that torrent are held to :data:`UPLOAD_SHARE` of their rate (libtorrent's per-torrent
limit, which gates what enters the sockets), and its request queues are let grow
(:data:`QUEUE_SECONDS`), until it has caught up to within :data:`CAUGHT_UP`. The peers
ahead of it lose part of one uplink while they have the most to give each other.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, ExitStack
from typing import Any, Final

log = logging.getLogger(__name__)

BEHIND: Final = 0.10
"""Share of the artifact by which a node trails its fetching peers' median progress
before it holds its uploads back."""

CAUGHT_UP: Final = 0.04
"""...and the share within which it has caught up (the limit is lifted)."""

EARLY_BEHIND: Final = 0.03
"""A node trailing by this share whose lag grew by :data:`GROWING` over the last
:data:`GROWTH_SECONDS` is falling behind: it holds back at once, and lets go at half the
lag it held back at (or :data:`CAUGHT_UP`, the lesser). Existing seeders at a quarter of
the rates (``bench/timeline.py`` on a kept run): one node received 3.7-5.0 MB/s of its
6.25 for 11 s while the others had 6.0, and was 10% behind only at the end of it; two
others at 2.0-5.4 MB/s for 8 s. Four alternating pairs (toggled within one build,
``bench/fleet.py --systems swarm --scenario existing-seeders --rate-scale 0.25``):
28.71, 27.42, 27.63, 27.86 s (the last node 0.25-1.24 s after the median, mean 0.87)
against 29.16, 29.01, 29.02, 26.44 (0.71-2.78, mean 1.87); the median node 26.62-27.65
against 25.73-27.26 (holding more nodes' uploads costs the others). Mixed at a quarter,
three pairs: 34.95, 35.02, 36.02 s against 35.69, 36.36, 34.91. Session 41 had tried
the same rule at 4% and 2.5% (bench/HISTORY.md) and not kept it: 31.80, 28.63, 27.43,
28.12 s against 32.60, 28.04, 29.27, 27.20. Both sets lean the same way (the all-done
0.3-0.5 s sooner on average, the median node later); neither is beyond the row's noise."""

GROWING: Final = 0.02
"""Share of the artifact the lag must grow by over :data:`GROWTH_SECONDS`: 0.67% a
second, ~0.9 MB/s of 128 MiB, a node getting ~5.1 MB/s while its peers get 6.0 (a
seeders' fleet at a quarter); a steady lag under :data:`BEHIND` never engages."""

GROWTH_SECONDS: Final = 3.0
"""Seconds the lag's growth is judged over: peers' progress moves a piece at a time, and
a jump within a second is no trend."""

UPLOAD_SHARE: Final = 0.5
"""The limit: this share of the torrent's upload rate when the node fell behind.
libtorrent applies a limit set on a transfer under way in bursts: two sessions on
loopback, a 2 MB/s limit set during a 62 MB/s upload, sent nothing for 9 s and then 19 MB
at once (a connection's bandwidth request is about a second of its recent rate, granted
whole). The kernel's pacing of the same connections (as :mod:`.uplink` sets it) held
2.0 MB/s from the next second, but as this hold it measured slower (README, session 48):
far-region 8.45 s mean against 8.03 (four alternating pairs), existing seeders at a
quarter 27.25 against 26.77 (three); and so did no hold at all (the request queues only):
8.12 against 7.82 (four), 26.89 against 26.42 (three)."""

MIN_LIMIT: Final = 64 * 1024
"""Bytes/s below which the limit is not set (an upload rate that low queues nothing)."""

QUEUE_SECONDS: Final = 5
"""While the limit holds, libtorrent's ``request_queue_time`` (a session setting: a node
is one session): each peer connection keeps this many seconds of what the peer gives in
block requests, at least two (libtorrent's floor). Beside seeders it is otherwise one
second (:data:`swarm.sources.ltsettings.AMONG_SEEDERS_SETTINGS`), and a node that fell
behind in existing seeders at a quarter of the rates (the peers trace,
:mod:`swarm.sources.peertrace`) kept two requests at three of its seven peers for 20 s,
each sending it 45-140 KB/s, every peer unchoking it: a queue sized by a slow rate keeps
the rate slow. Ten alternating pairs (toggled within one build, ``bench/fleet.py
--systems swarm --scenario existing-seeders --rate-scale 0.25``): 26.80-30.19 s (mean
28.46, the last node 0.0-3.2 s after the next, mean 0.8) against 27.11-33.28 (29.36,
three runs over 31 s, the last node 0.1-4.8 s after the next, mean 1.7), faster in six;
the typical node unchanged (the runs' median nodes 25.96-26.61 s against 25.68-26.84).
Mixed at a quarter, three pairs: 35.56, 35.45, 35.57 s against 34.92, 36.03, 35.52."""

CATCH_UP_SETTINGS: Final[dict[str, int | bool]] = {"request_queue_time": QUEUE_SECONDS}
"""libtorrent's settings while a fetch is held back (:class:`CatchUp`'s ``tuned``)."""


def lag(own: float, peers: Iterable[Any]) -> float | None:
    """How far ``own`` progress (0..1) trails the median of the fetching peers' (those
    not holding everything), or None without any."""
    fetching = [p.progress for p in peers if p.progress < 1.0]
    if not fetching:
        return None
    return statistics.median(fetching) - own


class CatchUp:
    """Follows one fetching torrent; :meth:`step` sets or lifts its upload limit, and
    holds ``tuned()`` (the session's :data:`CATCH_UP_SETTINGS`, if given) as long as the
    limit."""

    def __init__(
        self, name: str, tuned: Callable[[], AbstractContextManager[object]] | None = None
    ) -> None:
        self.name = name
        self.limit = 0
        """The upload limit set (bytes/s; 0: none)."""
        self._tuned = tuned
        self._tuning = ExitStack()
        self._lock = threading.Lock()  # step (the daemon's watch) against end (a fetch's end)
        self._ended = False
        self._lags: deque[tuple[float, float]] = deque()
        self._release = CAUGHT_UP

    def _falling_behind(self, behind: float | None, now: float) -> bool:
        """The lag is :data:`EARLY_BEHIND` or more and grew by :data:`GROWING` over the
        last :data:`GROWTH_SECONDS`."""
        if behind is None:
            self._lags.clear()
            return False
        self._lags.append((now, behind))
        while len(self._lags) > 1 and now - self._lags[1][0] >= GROWTH_SECONDS:
            self._lags.popleft()
        then, before = self._lags[0]
        return (
            behind >= EARLY_BEHIND and now - then >= GROWTH_SECONDS and behind - before >= GROWING
        )

    def step(self, handle: Any, own: float, upload_rate: float, now: float | None = None) -> None:
        """Look again: ``own`` is this node's progress (pieces held over the count),
        ``upload_rate`` the torrent's upload payload rate (bytes/s)."""
        behind = lag(own, handle.get_peer_info())
        falling = self._falling_behind(behind, time.monotonic() if now is None else now)
        if not self.limit:
            if behind is not None and (behind >= BEHIND or falling):
                limit = int(UPLOAD_SHARE * upload_rate)
                if limit >= MIN_LIMIT:
                    handle.set_upload_limit(limit)
                    self.limit = limit
                    self._release = min(CAUGHT_UP, behind / 2)
                    if self._tuned is not None:
                        with self._lock:
                            if not self._ended:
                                self._tuning.enter_context(self._tuned())
                    log.info("%s: %.0f%% behind the fleet: uploads held to %.0f kB/s%s so "
                             "that its requests reach its peers", self.name, behind * 100,
                             limit / 1e3, "" if self._tuned is None
                             else f", request queues at {QUEUE_SECONDS} s")  # fmt: skip
        elif behind is None or behind < self._release:
            self.lift(handle)

    def lift(self, handle: Any) -> None:
        """Lift the limit (caught up, or the fetch is over)."""
        with self._lock:
            self._tuning.close()
        if self.limit:
            handle.set_upload_limit(-1)
            self.limit = 0
            log.info("%s: caught up with the fleet: uploads unlimited again", self.name)

    def end(self) -> None:
        """Let the session's tuning go for good (the fetch is over, however it ended)."""
        with self._lock:
            self._ended = True
            self._tuning.close()
