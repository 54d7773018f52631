"""Which addresses a node's peer connections may use in an authenticated fleet, and what
a change of that list sets off.

With a fleet secret, libtorrent's peer filter lets through only the coordinator's
members (learnt from report replies) and the peers known otherwise (``--peers-from-asg``).
Nodes of a scale-out announce before the coordinator names them members, so a member
list that grows must reach them: an announce soon, and a dial of the newcomers now. An
address the filter refuses is most likely a node that joined since the last report: the
reporter is woken for a fresh list. Split from the daemon (:mod:`.daemon`), which hands
the coordinator's lists here and libtorrent's refusals (``TorrentSession.on_blocked``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

from swarm.sources.peers import TorrentSession

log = logging.getLogger(__name__)

REANNOUNCE_GAP = 2.0
"""Least seconds between announces forced by new fleet members: a scale-out of a
thousand nodes changes the membership at every report, and each change must not cost
the tracker an announce per node (at most one per node every two seconds)."""

BLOCKED_WAKE_GAP = 1.0
"""Least seconds between reports sent early because the peer filter refused an address
it had not refused before (:meth:`Membership.refused`); never less than the report
interval the coordinator asks for (it stretches it as the fleet grows)."""

MAX_DIALS = 32
"""Newly admitted members one reply's admission dials at once (those refused before they
were known first); the announce it triggers finds the rest."""

MAX_REFUSED = 4096
"""Addresses remembered as refused (each wakes the reporter once); forgotten past this."""


class Membership:
    """The peer filter of one node's session, kept to the fleet's members.

    ``others`` gives the addresses admitted besides the members (peers known without the
    coordinator), ``wake_reporter`` asks for a report now, ``report_interval`` gives the
    interval the coordinator asked for last: all read when used, since the daemon's
    reporter sets them once it runs."""

    def __init__(
        self,
        session: TorrentSession,
        listen_ip: str,
        others: Callable[[], Iterable[str]],
        wake_reporter: Callable[[], object],
        report_interval: Callable[[], float],
    ):
        self.session = session
        self.listen_ip = listen_ip
        self._others = others
        self._wake_reporter = wake_reporter
        self._report_interval = report_interval
        self._lock = threading.Lock()
        self._admitted: set[str] = set()
        """Addresses the peer filter lets through (:meth:`take`)."""
        self._reannounce: threading.Timer | None = None
        self._reannounced_at = -math.inf
        self._blocked_wake_at = -math.inf
        self._refused: set[str] = set()
        session.admit_only([])  # nobody, until the coordinator names the members

    def take(self, members: Iterable[str]) -> None:
        """The coordinator's authenticated members (plus peers known otherwise) become the
        only addresses a peer connection may use."""
        allowed = {str(m) for m in members} | set(self._others())
        allowed.add(self.listen_ip)
        self.session.admit_only(sorted(allowed))
        # libtorrent drops a peer its filter blocked (from the tracker's list, or
        # dialling in) and tries it again only after the next announce, 30 s on: nodes
        # of a scale-out announce before the coordinator names them members, and the
        # mixed fleet ran as a star around its last node for those 30 s (every other
        # node had one peer). Newly admitted members are asked for again: an announce
        # now, or REANNOUNCE_GAP seconds after the last one.
        added = allowed - self._admitted
        self._admitted = allowed
        if added:
            self._announce_soon()
        # Newly admitted members are dialled now too, for the torrents still downloading:
        # the announce is no sooner than the next whole second (libtorrent's
        # force_reannounce), 0.01-0.8 s after a member list in existing seeders' runs,
        # and a member that dialled in before this node knew it (a node that started
        # later) retries only after its own next announce. First those refused, then the
        # rest. At this node's own port: the fleet's (as the UDP port), since members are
        # addresses only. A few at most: the announce finds the rest.
        added.discard(self.listen_ip)
        refused = added & self._refused
        self._refused -= refused
        dial = [*sorted(refused), *sorted(added - refused)][:MAX_DIALS]
        if dial:
            port = self.session.listen_port
            for info_hash, state in list(self.session.torrents.items()):
                if not state.finished.is_set():
                    self.session.dial(info_hash, tuple((ip, port) for ip in dial))

    def refused(self, ip: str) -> None:
        """The peer filter refused ``ip``: most likely a node that joined since this
        node's last report (members are learnt from report replies, one a second or
        slower). Report now for the new list, at most every :data:`BLOCKED_WAKE_GAP`: a
        member learnt is dialled at once (:meth:`take`).
        far-region's seeders refused the four new nodes for up to a second after they
        joined, until the seeders' next report, and the nodes' first UDP sessions (which
        need a libtorrent connection to see a holder) waited on it. An address refused
        before (a host that is no member, dialling again) wakes nothing: at a report a
        second per node a fleet of thousands would exceed the coordinator's budget. That
        includes one first refused within the gap, which woke nothing then (remembering
        only the addresses that woke a report measured no faster: README)."""
        now = time.monotonic()
        if ip in self._refused:
            return
        if len(self._refused) >= MAX_REFUSED:
            self._refused.clear()
        self._refused.add(ip)
        if now - self._blocked_wake_at < max(BLOCKED_WAKE_GAP, self._report_interval()):
            return  # (a race of two alerts costs one more report: no lock)
        self._blocked_wake_at = now
        log.debug("peer filter refused %s: reporting for a fresh member list", ip)
        self._wake_reporter()

    def close(self) -> None:
        with self._lock:
            if self._reannounce is not None:
                self._reannounce.cancel()

    def _announce_soon(self) -> None:
        with self._lock:
            if self._reannounce is not None:
                return  # one is due already: it will see the newest members
            if not self.session.torrents:
                # Nothing to announce: a torrent added later announces itself under the
                # filter already set. Counted, such an admission held the next members'
                # announce back for REANNOUNCE_GAP (a daemon learns its first members
                # before its fetch request; the s3-fast fleet's peers met 1.7 s after
                # their torrents were added). Decided here, not when the timer fires: a
                # timer late on a loaded host (CI) found the torrent added since.
                return
            wait = max(0.0, REANNOUNCE_GAP - (time.monotonic() - self._reannounced_at))
            self._reannounce = threading.Timer(wait, self._announce_now)
            self._reannounce.daemon = True
            self._reannounce.start()

    def _announce_now(self) -> None:
        with self._lock:
            self._reannounce = None
            if not self.session.torrents:
                return  # dropped since it was asked for: not counted (see _announce_soon)
            self._reannounced_at = time.monotonic()
        self.session.reannounce()
