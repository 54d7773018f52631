"""The BitTorrent side: one libtorrent session per daemon, behind one class.

Settings are one dict (``session_settings``, in :mod:`swarm.sources.ltsettings`); one
thread pops alerts and turns them into our own events (a finished piece, a finished
torrent, resume data to save); statuses arrive as ``state_update_alert``
(``post_torrent_updates``), never by polling ``status()`` in a sleep loop. Resume data
is written atomically (temp, fsync, rename). What each alert means is
:mod:`swarm.sources.alerts`; the ip filter (the fleet's members, the seeders held off)
is :mod:`swarm.sources.peerfilter`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import fastbencode
import libtorrent as lt

from swarm.manifest import Manifest
from swarm.sources import peertrace
from swarm.sources.alerts import AlertDispatch
from swarm.sources.ltsettings import DISK_IO, session_settings
from swarm.sources.peerfilter import PeerFilter
from swarm.sources.torrentstate import CHECKING, TorrentState
from swarm.tree import tree_renames

log = logging.getLogger(__name__)

SOURCE = "peers"
ALERT_WAIT_MS = 250
STATUS_INTERVAL = 0.5
"""Seconds between ``post_torrent_updates`` requests (progress and rates for reports)."""

ADD_PIECE_TIMEOUT = 60.0


def strip_web_seeds(torrent: bytes) -> lt.torrent_info:
    """A torrent_info without the ``url-list``: the daemon reads S3 itself (signed, striped),
    so libtorrent must not also pull the same pieces from the web seed."""
    meta = fastbencode.bdecode(torrent)
    meta.pop(b"url-list", None)
    meta.pop(b"httpseeds", None)
    return lt.torrent_info(meta)


FLUSH_TIMEOUT = 30.0
"""Seconds a cache flush may take before the caller asks again (it closes the torrent's
files: milliseconds, even on a busy node)."""


class TorrentSession:
    """One libtorrent session and the thread that drains its alerts."""

    def __init__(
        self,
        listen_ip: str,
        port: int,
        resume_dir: Path,
        upload_limit: int = 0,
        trace_peers: bool = False,
    ) -> None:
        """``trace_peers``: log every torrent's peers once a second
        (:mod:`swarm.sources.peertrace`)."""
        self.listen_ip = listen_ip
        self.trace_peers = trace_peers
        self.resume_dir = resume_dir
        resume_dir.mkdir(parents=True, exist_ok=True)
        params = lt.session_params()
        params.settings = session_settings(listen_ip, port, upload_limit)
        params.disk_io_constructor = DISK_IO
        self.session = lt.session(params)
        self.torrents: dict[str, TorrentState] = {}
        self.on_blocked: Callable[[str], object] = lambda ip: None
        """Called (in the alert thread) with the address of a peer connection the ip
        filter (:meth:`admit_only`) refused: a node this one does not know as a member
        (yet: a new one; or no longer; or never)."""
        self._listen_port = 0
        self._peer_filter = PeerFilter(self.session)
        self._lock = threading.Lock()
        self._tunings: list[Mapping[str, int | bool]] = []  # held by tuned(), oldest first
        self._own_settings: dict[str, int | bool] = {}  # before any tuning, of keys tuned
        self._alerts = AlertDispatch(
            self.torrents,
            self._lock,
            resume_dir,
            held_off=self.held_off,
            on_blocked=lambda ip: self.on_blocked(ip),
            save_resume=self.save_resume,
            announce_owed=self._announce_owed,
        )
        self._running = True
        self._thread = threading.Thread(target=self._alert_loop, name="lt-alerts", daemon=True)
        self._thread.start()

    @property
    def listen_port(self) -> int:
        """The TCP port libtorrent listens on (0 until it does). Asked of libtorrent only
        until known: the daemon reads it for every report, and the deprecated
        ``session.listen_port()`` is a synchronous call into the network thread."""
        if not self._listen_port:
            self._listen_port = self.session.listen_port()
        return self._listen_port

    # -- torrents ---------------------------------------------------------------------------

    def add(
        self,
        manifest: Manifest,
        data_path: Path,
        trackers: list[str],
        *,
        trust_resume: bool = True,
        seed_mode: bool = False,
    ) -> TorrentState:
        """Add (or return) the torrent of ``manifest``, its data in the file ``data_path``
        (whatever the torrent calls it: the daemon keeps data beside DEST).

        ``seed_mode``: the file is known complete and verified (its whole-file SHA-256
        matched): libtorrent seeds it without hashing it first (it checks each piece the
        first time a peer asks for it).

        Resume data saved earlier for this info-hash is used, so a restarted daemon goes
        on seeding without downloading again. After an unclean stop (``trust_resume``
        False) the resume data may claim pieces that never reached the disk, so it is
        ignored and libtorrent hashes what the data file really holds.
        """
        info_hash = manifest.info_hash
        with self._lock:
            if info_hash in self.torrents:
                return self.torrents[info_hash]
        resume_file = self.resume_dir / f"{info_hash}.resume"
        params = lt.add_torrent_params()
        if resume_file.exists() and trust_resume:
            try:
                params = lt.read_resume_data(resume_file.read_bytes())
            except RuntimeError as error:  # corrupt resume data: start over, verify files
                log.warning("ignoring unreadable resume data %s: %s", resume_file, error)
                params = lt.add_torrent_params()
        params.ti = strip_web_seeds(manifest.torrent)
        # Every piece wanted: a priority saved while the S3 reader held pieces back from
        # peers (:meth:`hold_back`) would keep them from peers after a restart.
        params.piece_priorities = []
        params.save_path = str(data_path.parent)
        params.renamed_files = (
            {0: data_path.name}
            if manifest.files is None
            else tree_renames((e.path for e in manifest.files), data_path.name)
        )
        params.trackers = trackers
        params.url_seeds = []
        flags = params.flags & ~lt.torrent_flags.auto_managed & ~lt.torrent_flags.paused
        flags |= lt.torrent_flags.override_trackers | lt.torrent_flags.override_web_seeds
        if seed_mode:
            flags |= lt.torrent_flags.seed_mode
        params.flags = flags
        # Sparse, not reserved: on ext4 the first write into fallocate's unwritten
        # extents cost ~10x the CPU of a write into a hole (0.47 against 0.04 CPU-s per
        # 128 MiB here), a third of a node's CPU for its whole fetch. The daemon checks
        # the free space before it adds the torrent (a full disk still fails at once).
        params.storage_mode = lt.storage_mode_t.storage_mode_sparse
        for attempt in range(40):
            try:
                handle = self.session.add_torrent(params)
                break
            except RuntimeError as error:  # removed a moment ago: libtorrent is not done
                if "already" not in str(error) or attempt == 39:
                    raise
                time.sleep(0.05)
        state = TorrentState(info_hash, handle, count=manifest.layout.count)
        with self._lock:
            self.torrents[info_hash] = state
            # The check may have ended already, its state_changed_alert dropped by the
            # alert loop (no state yet); the later ones wait for the lock, in order.
            state.checking = handle.status().state in CHECKING
        # Its first status now, not at the alert loop's next round (up to STATUS_INTERVAL):
        # the S3 reader of a lone node waits for it before writing the file itself.
        self.session.post_torrent_updates()
        return state

    def add_piece(self, info_hash: str, index: int, data: bytes) -> bool:
        """Hand a piece to libtorrent; True once it is hashed and on its way to disk."""
        return self.add_piece_async(info_hash, index, data).result(ADD_PIECE_TIMEOUT)

    def add_piece_async(self, info_hash: str, index: int, data: bytes) -> Future[bool]:
        """Hand a piece to libtorrent; the future says whether it passed its hash.

        libtorrent hashes it (its own SHA-1 check: the only one for bytes from S3) and
        answers with ``piece_finished_alert`` (kept, and offered to peers at once) or
        ``hash_failed_alert``. Not waiting here lets a reader go on with the next piece
        while libtorrent's disk threads hash and write this one.
        """
        state = self.torrents[info_hash]
        with self._lock:
            if state.has(index):
                done: Future[bool] = Future()
                done.set_result(True)
                return done
            future = state.pending.get(index)
            if future is not None and not future.done():
                return future  # already on its way (another source was as fast)
            future = Future()
            state.pending[index] = future
            if state.checking:
                state.deferred[index] = data
                return future
        state.handle.add_piece(index, data, lt.add_piece_flags_t.overwrite_existing)
        return future

    def flush(self, info_hash: str, timeout: float = FLUSH_TIMEOUT) -> bool:
        """Wait until every piece libtorrent holds now is written to the file (readable by
        another process or thread); False on timeout, with a warning (a fetch that never
        finishes then says so in the log; the caller asks again)."""
        state = self.torrents[info_hash]
        with state.flushes:
            state.flush_requested += 1
            ticket = state.flush_requested
        state.handle.flush_cache()
        with state.flushes:
            if state.flushes.wait_for(lambda: state.flush_done >= ticket, timeout):
                return True
            log.warning(
                "libtorrent did not confirm a flush of %s in %.0fs (%d of %d answered)",
                info_hash,
                timeout,
                state.flush_done,
                state.flush_requested,
            )
            return False

    def rename(self, info_hash: str, name: str, timeout: float = 30.0) -> str | None:
        """Rename the torrent's file within its directory (a fence after every write);
        None on success, else libtorrent's error. libtorrent refuses to overwrite."""
        state = self.torrents[info_hash]
        state.renamed = Future()
        state.handle.rename_file(0, name)
        return state.renamed.result(timeout)

    def peer_endpoints(self) -> set[tuple[str, int]]:
        """The (ip, port) of every peer connected to any torrent of the session."""
        return {
            (peer.ip[0], peer.ip[1])
            for state in list(self.torrents.values())
            for peer in state.handle.get_peer_info()
        }

    # -- which pieces peers may bring (swarm.sources.priorities) -----------------------

    def upload_only(self, info_hash: str, on: bool, finishing: Collection[int] = ()) -> None:
        """:meth:`PiecePriorities.upload_only` of ``info_hash``'s torrent."""
        self.torrents[info_hash].priorities.upload_only(on, finishing)

    def finish_from_peers(self, info_hash: str, pieces: Collection[int]) -> None:
        """:meth:`PiecePriorities.finish_from_peers` of ``info_hash``'s torrent."""
        self.torrents[info_hash].priorities.finish_from_peers(pieces)

    def hold_back(self, info_hash: str, pieces: list[int], on: bool) -> None:
        """:meth:`PiecePriorities.hold_back` of ``info_hash``'s torrent."""
        self.torrents[info_hash].priorities.hold_back(pieces, on)

    def leave_to_owners(self, info_hash: str, pieces: set[int]) -> None:
        """:meth:`PiecePriorities.leave_to_owners` of ``info_hash``'s torrent."""
        self.torrents[info_hash].priorities.leave_to_owners(pieces)

    @contextlib.contextmanager
    def tuned(self, settings: Mapping[str, int | bool]) -> Iterator[None]:
        """libtorrent's ``settings`` while the caller holds this (a fetch that needs them:
        :data:`~swarm.sources.ltsettings.FAR_FETCH_SETTINGS`,
        :data:`~swarm.sources.ltsettings.AMONG_SEEDERS_SETTINGS`); the settings are the
        session's, so fetches at once share them: a key two holders set takes the later
        one's value, and the session's own comes back once no holder sets it."""
        with self._lock:
            # cast: the stubs' settings pack takes literal keys only
            current = cast(dict[str, Any], self.session.get_settings())
            for key in settings:
                self._own_settings.setdefault(key, current[key])
            self._tunings.append(settings)
            self._apply_tunings()
        try:
            yield
        finally:
            with self._lock:
                self._tunings.remove(settings)
                self._apply_tunings()

    def _apply_tunings(self) -> None:
        """The session's own settings, overridden by every tuning held (under the lock)."""
        wanted = dict(self._own_settings)
        for held in self._tunings:
            wanted.update(held)
        self.session.apply_settings(cast(Any, wanted))

    def pause(self, info_hash: str, timeout: float = 30.0) -> bool:
        state = self.torrents[info_hash]
        state.paused.clear()
        state.handle.unset_flags(lt.torrent_flags.auto_managed)
        state.handle.pause()
        return state.paused.wait(timeout)

    def remove(self, info_hash: str) -> None:
        """Stop seeding a torrent (its data is left alone) and forget its resume data."""
        with self._lock:
            state = self.torrents.pop(info_hash, None)
        if state is not None:
            with contextlib.suppress(RuntimeError):
                self.session.remove_torrent(state.handle)
        (self.resume_dir / f"{info_hash}.resume").unlink(missing_ok=True)

    def admit_only(self, addresses: list[str]) -> None:
        """:meth:`PeerFilter.admit_only`: peers to and from ``addresses`` only."""
        self._peer_filter.admit_only(addresses)

    def hold_off(self, info_hash: str, addresses: Iterable[str]) -> None:
        """:meth:`PeerFilter.hold_off`: no peers to and from ``addresses`` meanwhile."""
        self._peer_filter.hold_off(info_hash, addresses)

    def held_off(self, address: str) -> bool:
        return self._peer_filter.held_off(address)

    def dial(self, info_hash: str, addresses: tuple[tuple[str, int], ...]) -> None:
        """Connect ``info_hash``'s torrent to these peers now (libtorrent skips those it
        is connected to, and those the peer filter blocks)."""
        state = self.torrents.get(info_hash)
        if state is None:
            return
        for address in addresses:
            with contextlib.suppress(RuntimeError):  # a handle removed meanwhile
                state.handle.connect_peer(address)

    def reannounce(self) -> None:
        """Announce every torrent now, for a fresh peer list (see ``Membership.take``);
        a torrent whose tracker has an announce unanswered announces once it is
        answered (:meth:`_announce_owed`)."""
        for state in list(self.torrents.values()):
            state.announce_owed = True
            self._announce_owed(state)

    @staticmethod
    def announce_unanswered(handle: Any) -> bool:
        """Whether the torrent of ``handle`` has an announce its tracker has not answered
        (or a tracker's answer libtorrent has not read yet)."""
        return any(
            announce["updating"]
            for tracker in handle.trackers()
            for endpoint in tracker["endpoints"]
            for announce in endpoint["info_hashes"]
        )

    @staticmethod
    def _announce_owed(state: TorrentState) -> None:
        """Send the announce ``state`` owes, unless its tracker has one unanswered:
        libtorrent drops a forced announce meanwhile (``can_announce``: not
        ``updating``), and the answer to that one sets the next a whole interval on
        (seen in CI: a member named while the first announce's answer was on its way).
        Called again at each tracker answer (:mod:`.alerts`)."""
        with contextlib.suppress(RuntimeError):  # a handle removed meanwhile
            if not state.announce_owed or TorrentSession.announce_unanswered(state.handle):
                return
            state.announce_owed = False
            state.handle.force_reannounce(0, -1, lt.reannounce_flags_t.ignore_min_interval)

    def save_resume(self, info_hash: str, flush: bool = False) -> None:
        state = self.torrents[info_hash]
        state.resume_saved.clear()
        flags = lt.torrent_handle.save_info_dict
        if flush:
            flags |= lt.torrent_handle.flush_disk_cache
        state.handle.save_resume_data(flags)

    def close(self, timeout: float = 5.0) -> None:
        """Save resume data for every torrent, then stop the session."""
        states = list(self.torrents.values())
        for state in states:
            with contextlib.suppress(RuntimeError):
                self.save_resume(state.info_hash)
        for state in states:
            state.resume_saved.wait(timeout)
        self._running = False
        self._thread.join(timeout)
        self.session.pause()

    # -- the alert loop -------------------------------------------------------------------

    def _alert_loop(self) -> None:
        last_update = last_trace = 0.0
        while self._running:
            now = time.monotonic()
            if now - last_update >= STATUS_INTERVAL:
                self.session.post_torrent_updates()
                last_update = now
            if self.trace_peers and now - last_trace >= peertrace.TRACE_INTERVAL:
                last_trace = now
                self._trace()
                self.session.post_session_stats()  # its alert: the trace's waste line
            if not self.session.wait_for_alert(ALERT_WAIT_MS):
                continue
            for alert in self.session.pop_alerts():
                try:
                    self._alerts.dispatch(alert)
                except Exception:  # one bad alert must not kill the session's loop
                    log.exception("error handling %s", type(alert).__name__)

    def _trace(self) -> None:
        """A line per torrent on the peers trace's logger (:mod:`.peertrace`)."""
        with self._lock:
            states = list(self.torrents.values())
        for state in states:
            try:
                line = peertrace.describe(state.handle)
            except RuntimeError:  # the handle went meanwhile
                continue
            peertrace.log.info("trace %s: %s", state.info_hash[:8], line)
