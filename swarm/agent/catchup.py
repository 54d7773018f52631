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
:data:`BEHIND`, its uploads for that torrent are held to :data:`UPLOAD_SHARE` of their
rate (libtorrent's per-torrent limit, which gates what enters the sockets), until it has
caught up to within :data:`CAUGHT_UP`. The peers ahead of it lose part of one uplink
while they have the most to give each other.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Iterable
from typing import Any, Final

log = logging.getLogger(__name__)

BEHIND: Final = 0.10
"""Share of the artifact by which a node trails its fetching peers' median progress
before it holds its uploads back."""

CAUGHT_UP: Final = 0.04
"""...and the share within which it has caught up (the limit is lifted)."""

UPLOAD_SHARE: Final = 0.5
"""The limit: this share of the torrent's upload rate when the node fell behind."""

MIN_LIMIT: Final = 64 * 1024
"""Bytes/s below which the limit is not set (an upload rate that low queues nothing)."""


def lag(own: float, peers: Iterable[Any]) -> float | None:
    """How far ``own`` progress (0..1) trails the median of the fetching peers' (those
    not holding everything), or None without any."""
    fetching = [p.progress for p in peers if p.progress < 1.0]
    if not fetching:
        return None
    return statistics.median(fetching) - own


class CatchUp:
    """Follows one fetching torrent; :meth:`step` sets or lifts its upload limit."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.limit = 0
        """The upload limit set (bytes/s; 0: none)."""

    def step(self, handle: Any, own: float, upload_rate: float) -> None:
        """Look again: ``own`` is this node's progress (pieces held over the count),
        ``upload_rate`` the torrent's upload payload rate (bytes/s)."""
        behind = lag(own, handle.get_peer_info())
        if not self.limit:
            if behind is not None and behind >= BEHIND:
                limit = int(UPLOAD_SHARE * upload_rate)
                if limit >= MIN_LIMIT:
                    handle.set_upload_limit(limit)
                    self.limit = limit
                    log.info("%s: %.0f%% behind the fleet: uploads held to %.0f kB/s so "
                             "that its requests reach its peers", self.name, behind * 100,
                             limit / 1e3)  # fmt: skip
        elif behind is None or behind < CAUGHT_UP:
            self.lift(handle)

    def lift(self, handle: Any) -> None:
        """Lift the limit (caught up, or the fetch is over)."""
        if self.limit:
            handle.set_upload_limit(-1)
            self.limit = 0
            log.info("%s: caught up with the fleet: uploads unlimited again", self.name)
