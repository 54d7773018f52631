"""What the daemon's libtorrent session knows of one torrent (:class:`TorrentState`),
kept by its alert thread (:class:`swarm.sources.peers.TorrentSession`) and read by the
sources and the completion: the pieces held, the last status, the pieces kept from
peers (:mod:`swarm.sources.priorities`), and the events a fetch waits on."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import libtorrent as lt

from swarm.sources.priorities import PiecePriorities

CHECKING = frozenset(
    {lt.torrent_status.states.checking_files, lt.torrent_status.states.checking_resume_data}
)
"""The states in which libtorrent looks at the file: it drops every piece handed to it
meanwhile (``torrent::add_piece`` returns at once, no alert)."""


@dataclass
class TorrentState:
    """What the session knows about one torrent, updated by the alert thread."""

    info_hash: str
    handle: Any
    count: int = 0
    """The torrent's pieces."""
    finished: threading.Event = field(default_factory=threading.Event)
    """Set once every piece is held *and* flushed to disk (so another process may read it)."""
    finishing: bool = False
    status: Any = None
    error: str | None = None
    error_errno: int | None = None
    """The OS error number behind ``error`` (ENOSPC: the disk is full), if any."""
    pending: dict[int, Future[bool]] = field(default_factory=dict)
    checking: bool = True
    """libtorrent is checking the file: its state when the torrent was added, then its
    ``state_changed_alert``s."""
    deferred: dict[int, bytes] = field(default_factory=dict)
    """Pieces handed over while ``checking``, for libtorrent once it is done: it would
    drop them, and their futures would wait out their timeout (a loaded CI machine still
    checked a new torrent when the S3 reader's first pieces came)."""
    peer_hash_failures: int = 0
    """Pieces from peers that failed their hash check (libtorrent refetches them)."""
    peers_banned: int = 0
    """Peers banned for sending bad data (libtorrent's smart_ban finds the culprit)."""
    resume_saved: threading.Event = field(default_factory=threading.Event)
    flushes: threading.Condition = field(default_factory=threading.Condition)
    flush_requested: int = 0
    flush_done: int = 0
    """Flush tickets (``TorrentSession.flush``): libtorrent's disk threads write
    pieces after they pass their hash, so a piece it holds may not be in the file yet;
    ``flush_cache`` is a fence that completes once every earlier write has."""
    renamed: Future[str | None] | None = None
    """The pending ``rename_file`` (None: success, else libtorrent's error)."""
    paused: threading.Event = field(default_factory=threading.Event)
    announce_owed: bool = False
    """A forced announce was asked for while the tracker had one unanswered: it is sent
    once that one is answered (``TorrentSession.reannounce``)."""
    priorities: PiecePriorities = field(init=False)
    """Which missing pieces libtorrent may bring from peers, and why not the others."""
    held: set[int] = field(default_factory=set)
    """Pieces libtorrent holds, from its alerts (``piece_finished_alert``, and each status
    update): asking the handle (``have_piece``) is a round trip to libtorrent's network
    thread, and the S3 and UDP sources ask it for every piece they consider."""

    arrivals: int = 0
    """Times pieces were stored (by libtorrent, or by the S3 reader writing the file
    itself) or the torrent finished (:meth:`note_arrival`): what the hasher and the end
    of a fetch wait on (polling cost the end of every fetch 0.15 s on average). A cancel
    does not count: waiters see it at their timeout."""
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self.priorities = PiecePriorities(self.handle, self.count)

    def has(self, index: int) -> bool:
        return index in self.held

    def all_held(self) -> bool:
        return self.count > 0 and len(self.held) >= self.count

    def note_arrival(self) -> None:
        """A piece was stored (or the torrent finished): wake whoever waits on it."""
        with self.arrived:
            self.arrivals += 1
            self.arrived.notify_all()

    def wait_arrival(self, seen: int, timeout: float) -> None:
        """Return once more than ``seen`` arrivals were noted, or after ``timeout``."""
        with self.arrived:
            self.arrived.wait_for(lambda: self.arrivals != seen, timeout)
