"""Which peers libtorrent may connect to and from (:class:`PeerFilter`): the session's
ip filter, built from the fleet's members (``admit_only``, :mod:`swarm.agent.membership`)
and the seeders a fetch holds off (``hold_off``, :mod:`swarm.agent.seedershare`).

Separate from :class:`swarm.sources.peers.TorrentSession` because the filter is the
session's, every torrent's, set by two parts of the daemon for their own reasons; its
state is its own (changed under its own lock), and libtorrent hears of it as one ip filter.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import libtorrent as lt


class PeerFilter:
    """The addresses admitted and held off, and the ip filter of ``session`` made of
    them (libtorrent's ``session``)."""

    def __init__(self, session: lt.session) -> None:
        self.session = session
        self._admitted: list[str] | None = None  # admit_only's addresses (None: everyone)
        self._held_off: dict[str, frozenset[str]] = {}  # hold_off's, by torrent
        self._lock = threading.Lock()

    def admit_only(self, addresses: list[str]) -> None:
        """Let peer connections (both ways) only to and from ``addresses``: the fleet's
        authenticated members. Trackers are exempt (``apply_ip_filter_to_trackers`` off):
        the coordinator authenticates those requests itself."""
        with self._lock:
            self._admitted = list(addresses)
            self._apply()

    def hold_off(self, info_hash: str, addresses: Iterable[str]) -> None:
        """Close the peer connections to and from ``addresses`` and refuse new ones, until
        ``info_hash``'s fetch calls again without them (the seeders, once this node's share
        of the pieces only they hold is in: :mod:`swarm.agent.seedershare`). The filter is
        the session's, every torrent's: addresses a fetch holds off are held off for all."""
        held = frozenset(addresses)
        with self._lock:
            if held == self._held_off.get(info_hash, frozenset()):
                return
            if held:
                self._held_off[info_hash] = held
            else:
                self._held_off.pop(info_hash, None)
            self._apply()

    def held_off(self, address: str) -> bool:
        # Read without the lock (the alert thread asks, for every refused peer): a list of
        # the values is a snapshot, and a frozenset is never changed in place.
        return any(address in held for held in list(self._held_off.values()))

    def _apply(self) -> None:
        """libtorrent's ip filter from :meth:`admit_only`'s and :meth:`hold_off`'s
        addresses (under the lock)."""
        rules = lt.ip_filter()
        if self._admitted is not None:
            rules.add_rule("0.0.0.0", "255.255.255.255", 1)  # 1 = blocked
            rules.add_rule("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1)
            for address in self._admitted:
                rules.add_rule(address, address, 0)
        for address in set().union(*self._held_off.values()):
            rules.add_rule(address, address, 1)
        self.session.set_ip_filter(rules)
