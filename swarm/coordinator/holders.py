"""Whom a coordinator names to a node that holds nothing of an artifact yet, with its
plan: the artifact's seeders (``holders``: its UDP source may start from them before
libtorrent has announced and connected) and the nodes that reported fetching it just
before (``peers``: its libtorrent dials them before its tracker announce returns).
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from typing import Final

from swarm.coordinator.fleet import PeerStore, host_of
from swarm.coordinator.reports import NodeReport

MAX_PLAN_HOLDERS: Final = 8
"""Seeders named in a plan (:func:`seeders_for`)."""

SEEDERS_TTL: Final = 1.0
"""Seconds an artifact's list of seeders is reused (:class:`SeederCache`)."""

MAX_SEEDER_LISTS: Final = 1024
"""Artifacts whose seeders are kept at once (the cache starts afresh past it)."""

MAX_PLAN_PEERS: Final = 16
"""Fetching nodes named in a plan (:class:`RecentFetchers`)."""

FETCHERS_TTL: Final = 10.0
"""Seconds a node's report of an incomplete artifact keeps it named as fetching it (a
node reports every second or so while it fetches; one that left is named no longer)."""

MAX_FETCHER_LISTS: Final = 1024
"""Artifacts whose fetchers are kept at once (the least recently reported goes first)."""


class SeederCache:
    """Each artifact's seeders' addresses, read from the store at most once a
    :data:`SEEDERS_TTL`: at a scale-out every new node asks in each report until it holds
    a piece, and one read is the whole swarm (thousands of records; a Redis round trip).
    Worker threads share it: a race costs one read more."""

    def __init__(self) -> None:
        self._lists: dict[str, tuple[float, list[str]]] = {}

    def seeders(self, store: PeerStore, info_hash: str, now: float) -> list[str]:
        known = self._lists.get(info_hash)
        if known is not None and 0 <= now - known[0] < SEEDERS_TTL:
            return known[1]
        try:
            records = store.peers(bytes.fromhex(info_hash), now)
        except ValueError:  # not hex: no such swarm
            records = []
        ips = sorted({r.ip for r in records if r.seeder})
        if len(self._lists) >= MAX_SEEDER_LISTS:
            self._lists = {}
        self._lists[info_hash] = (now, ips)
        return ips


def seeders_for(
    cache: SeederCache, store: PeerStore, info_hash: str, report: NodeReport, now: float
) -> list[str]:
    """Addresses of up to :data:`MAX_PLAN_HOLDERS` nodes that hold all of ``info_hash``
    (announced seeders other than the reporting node): all of them, or a few drawn for
    this node (the same few each time, other few for other nodes)."""
    own = host_of(report.addr)
    ips = [ip for ip in cache.seeders(store, info_hash, now) if ip != own]
    if len(ips) <= MAX_PLAN_HOLDERS:
        return ips
    return random.Random(report.node).sample(ips, MAX_PLAN_HOLDERS)


class RecentFetchers:
    """Each artifact's :data:`MAX_PLAN_PEERS` nodes that most recently reported it
    incomplete, by their BitTorrent address, newest last. A new node's first report
    reaches the coordinator before its tracker announce (that one opens a connection of
    its own), and nodes of a scale-out start within a fraction of a second: the tracker's
    first replies named none of the others. far-region's far nodes met their region's
    peers 0.3-0.6 s after their first plan, and dealt their first UDP sessions as if
    alone. Only this coordinator's reports: a fleet sharing a store learns the rest
    through the tracker, as before. Worker threads share it (a lock: lists change)."""

    def __init__(self) -> None:
        # info-hash -> {addr: when it last reported the artifact incomplete}, both in
        # the order of their last report
        self._by_artifact: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, report: NodeReport, now: float) -> None:
        """Take the artifacts ``report`` lists: incomplete ones as fetched by its node,
        complete ones no longer (a seeder is named as one)."""
        with self._lock:
            for item in report.artifacts:
                fetchers = self._by_artifact.get(item.info_hash)
                if item.complete:
                    if fetchers is not None:
                        fetchers.pop(report.addr, None)
                    continue
                if fetchers is None:
                    fetchers = self._by_artifact[item.info_hash] = OrderedDict()
                    if len(self._by_artifact) > MAX_FETCHER_LISTS:
                        self._by_artifact.popitem(last=False)
                self._by_artifact.move_to_end(item.info_hash)
                fetchers[report.addr] = now
                fetchers.move_to_end(report.addr)
                if len(fetchers) > MAX_PLAN_PEERS:
                    fetchers.popitem(last=False)

    def others(self, info_hash: str, addr: str, now: float) -> list[str]:
        """The nodes that reported ``info_hash`` incomplete in the last
        :data:`FETCHERS_TTL` seconds, newest first, but those on ``addr``'s host."""
        host = host_of(addr)
        with self._lock:
            fetchers = list((self._by_artifact.get(info_hash) or {}).items())
        return [
            a
            for a, when in reversed(fetchers)
            if 0 <= now - when < FETCHERS_TTL and host_of(a) != host
        ]
