"""What each of libtorrent's alerts means for a torrent (:class:`AlertDispatch`): a piece
finished or failed its hash, a torrent out of checking or finished (its cache flushed),
resume data to save, a rename done, a peer refused by the ip filter, a tracker's answer.

Separate from :class:`swarm.sources.peers.TorrentSession`, which owns the session and the
thread that pops its alerts: this is the part that runs in that thread, turning alerts
into our own events on each :class:`~swarm.sources.torrentstate.TorrentState` (futures
answered, events set), and it touches the session only through what it is handed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import libtorrent as lt

from swarm.sources import peertrace
from swarm.sources.torrentstate import CHECKING, TorrentState

log = logging.getLogger("swarm.sources.peers")  # the session's log, as before the split


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


class AlertDispatch:
    """Turns one session's alerts into events on its torrents' states (in the alert
    thread). ``torrents`` and ``lock`` are the session's (the lock guards each state's
    ``checking``, ``pending`` and ``deferred``, which the session's ``add_piece_async``
    sets too); the rest is what it asks of the session: whether a refused address is one
    held off, who hears of the others (``on_blocked``), and what it saves and announces."""

    def __init__(
        self,
        torrents: Mapping[str, TorrentState],
        lock: threading.Lock,
        resume_dir: Path,
        *,
        held_off: Callable[[str], bool],
        on_blocked: Callable[[str], object],
        save_resume: Callable[[str], None],
        announce_owed: Callable[[TorrentState], None],
    ) -> None:
        self.torrents = torrents
        self._lock = lock
        self.resume_dir = resume_dir
        self.held_off = held_off
        self.on_blocked = on_blocked
        self.save_resume = save_resume
        self.announce_owed = announce_owed

    def _state_of(self, handle: Any) -> TorrentState | None:
        """The state of the torrent an alert is about; None if it is gone, or if the alert
        is about an earlier handle of the same info-hash (a verified file is handed to a
        new handle in seed mode, :meth:`swarm.agent.completion.Completion._adopt`): an
        error that the old one's last disk job raised is not the new one's."""
        try:
            state = self.torrents.get(str(handle.info_hashes().v1))
        except RuntimeError:  # the handle is gone
            return None
        return state if state is not None and state.handle == handle else None

    def _checked(self, state: TorrentState, now: Any) -> None:
        """The torrent entered the state ``now``: out of checking, the pieces deferred
        meanwhile go to libtorrent (in the alert thread, as ``state_changed_alert``s come,
        in order: a status snapshot may be older than a recheck)."""
        with self._lock:
            state.checking = now in CHECKING
            if state.checking:
                return
            deferred, state.deferred = state.deferred, {}
        for index, data in deferred.items():
            state.handle.add_piece(index, data, lt.add_piece_flags_t.overwrite_existing)

    def _finishing(self, state: TorrentState) -> None:
        """All pieces are in: flush them to the file, then say finished (and save resume
        data). ``save_resume_data``'s own flush flag is not a fence: its alert comes
        before the writes are done."""
        if not state.finishing:
            state.finishing = True
            with state.flushes:
                state.flush_requested += 1
            state.handle.flush_cache()

    def dispatch(self, alert: Any) -> None:
        if isinstance(alert, lt.state_update_alert):
            for status in alert.status:
                state = self._state_of(status.handle)
                if state:
                    state.status = status
                    if len(state.held) < status.num_pieces:
                        state.held.update(i for i, held in enumerate(status.pieces) if held)
                        state.note_arrival()  # pieces from a check, or alerts dropped
                    if status.is_seeding:  # also covers a torrent restored complete
                        self._finishing(state)
            return
        if isinstance(alert, lt.state_changed_alert):
            state = self._state_of(alert.handle)
            if state:
                self._checked(state, alert.state)
            return
        if isinstance(alert, lt.piece_finished_alert | lt.hash_failed_alert):
            state = self._state_of(alert.handle)
            if state:
                if isinstance(alert, lt.piece_finished_alert):
                    state.held.add(alert.piece_index)
                    state.note_arrival()
                    if state.all_held():
                        self._finishing(state)
                with self._lock:
                    future = state.pending.pop(alert.piece_index, None)
                if future and not future.done():
                    future.set_result(isinstance(alert, lt.piece_finished_alert))
            if isinstance(alert, lt.hash_failed_alert):
                if state:
                    state.peer_hash_failures += 1
                log.warning("piece %d failed its hash check", alert.piece_index)
            return
        if isinstance(alert, lt.peer_blocked_alert):
            if alert.reason == lt.reason_t.ip_filter and not self.held_off(alert.ip[0]):
                self.on_blocked(alert.ip[0])  # (address, port), as for every peer alert
            return
        if isinstance(alert, lt.peer_ban_alert):
            state = self._state_of(alert.handle)
            if state:
                state.peers_banned += 1
            log.warning("banned a peer: %s", alert.message())
            return
        if isinstance(alert, lt.torrent_finished_alert):
            state = self._state_of(alert.handle)
            # libtorrent's "finished" is every piece it *wants*: pieces held back from
            # peers while S3 reads them (priority 0, ``TorrentSession.hold_back``) are
            # not, and the file was hashed before they were in it. The last piece's alert
            # finishes.
            if state and state.all_held():
                self._finishing(state)
            return
        if isinstance(alert, lt.cache_flushed_alert):
            state = self._state_of(alert.handle)
            if state:
                with state.flushes:
                    state.flush_done += 1
                    state.flushes.notify_all()
                if state.finishing and not state.finished.is_set():
                    state.status = state.handle.status()  # final counters, not 0.5 s old ones
                    state.finished.set()
                    state.note_arrival()
                    self.save_resume(state.info_hash)
            return
        if isinstance(alert, lt.file_renamed_alert | lt.file_rename_failed_alert):
            state = self._state_of(alert.handle)
            if state and state.renamed is not None and not state.renamed.done():
                failed = isinstance(alert, lt.file_rename_failed_alert)
                state.renamed.set_result(alert.message() if failed else None)
            return
        if isinstance(alert, lt.torrent_paused_alert):
            state = self._state_of(alert.handle)
            if state:
                state.paused.set()
            return
        if isinstance(alert, lt.save_resume_data_alert):
            state = self._state_of(alert.handle)
            if state:
                blob = lt.write_resume_data_buf(alert.params)
                write_atomically(self.resume_dir / f"{state.info_hash}.resume", blob)
                state.resume_saved.set()
            return
        if isinstance(alert, lt.save_resume_data_failed_alert):
            state = self._state_of(alert.handle)
            if state:
                state.resume_saved.set()
            return
        if isinstance(alert, lt.torrent_error_alert | lt.file_error_alert):
            state = self._state_of(alert.handle)
            if state:
                state.error = alert.message()
                state.error_errno = alert.error.value()
            log.error("%s", alert.message())
            return
        if isinstance(alert, lt.tracker_reply_alert | lt.tracker_error_alert):
            state = self._state_of(alert.handle)
            if state and state.announce_owed:
                self.announce_owed(state)
            if isinstance(alert, lt.tracker_error_alert):
                log.info("tracker: %s", alert.message())
            return
        if isinstance(alert, lt.session_stats_alert):  # asked for by the peers trace only
            peertrace.log.info("session: %s", peertrace.describe_waste(alert.values))
            return
        if alert.category() & lt.alert.category_t.error_notification:
            log.warning("%s", alert.message())
