"""Which of a torrent's missing pieces libtorrent may bring from peers
(:class:`PiecePriorities`, one per torrent, ``TorrentState.priorities``).

Three reasons keep a piece from peers, each set and ended by its own part of the daemon:
the S3 reader brings it (``hold_back``), an owner other new nodes take it from brings it
(``leave_to_owners``, :mod:`swarm.agent.seedershare`), or the node is upload-only (a
coordinator's ALL plan: S3 brings every piece but those libtorrent is finishing,
``upload_only`` and ``finish_from_peers``). A piece kept from peers is still served to
them once held. libtorrent hears of them as piece priorities: 0 kept, else its default.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable
from typing import Any

import libtorrent as lt

DEFAULT_PIECE_PRIORITY = 4
"""libtorrent's ``default_priority`` (the binding exports no name for it)."""


class PiecePriorities:
    """The pieces kept from peers, and why; ``handle`` is the torrent's, ``count`` its
    pieces. The reasons are kept apart (under one lock), and each may end alone."""

    def __init__(self, handle: Any, count: int) -> None:
        self.handle = handle
        self.count = count
        self.held_for_s3: set[int] = set()
        """Pieces kept from peers while the S3 reader brings them (:meth:`hold_back`)."""
        self.left_to_owners: set[int] = set()
        """Pieces kept from peers until another new node holds them
        (:meth:`leave_to_owners`)."""
        self.peers_finish: set[int] | None = None
        """Under upload-only (:meth:`upload_only`), the only pieces libtorrent may still
        complete from peers; None: not upload-only."""
        self._lock = threading.Lock()

    def upload_only(self, on: bool, finishing: Collection[int] = ()) -> None:
        """Stop (or resume) downloading from peers while still serving them: the S3
        reader takes every missing piece itself (a coordinator's ALL plan), and a peer's
        copy of a piece S3 is already bringing would only take the node's downlink.

        ``finishing``: pieces partly received from peers, which libtorrent still completes
        (every other piece gets priority 0). Upload mode cancels every request in flight,
        and libtorrent asks again for the rest of these pieces only once it is off;
        without this, the blocks peers had sent of them came again with the whole pieces
        from S3 (s3-fast at a quarter, one run each: 135.9-138.3 MB a node received for
        134.2, against 136.5-142.0)."""
        with self._lock:
            self.peers_finish = set(finishing) if on else None
            self._apply(range(self.count))
        if on:
            self.handle.set_flags(lt.torrent_flags.upload_mode)
        if not on or finishing:  # in order on libtorrent's thread: after the cancels
            self.handle.unset_flags(lt.torrent_flags.upload_mode)

    def finish_from_peers(self, pieces: Collection[int]) -> None:
        """Under upload-only, let libtorrent complete ``pieces`` too (as ``finishing`` in
        :meth:`upload_only`): blocks of them landed after its cancels. Upload mode ends
        if it was on (nothing was partly sent at the switch): libtorrent asks for the
        rest of these, and every other missing piece stays at priority 0."""
        with self._lock:
            if self.peers_finish is None:
                return  # upload-only has ended: every piece is wanted again
            self.peers_finish.update(pieces)
            self._apply(pieces)
        self.handle.unset_flags(lt.torrent_flags.upload_mode)  # after the priorities

    def hold_back(self, pieces: list[int], on: bool) -> None:
        """Keep peers from bringing ``pieces`` (libtorrent's priority 0) while S3 reads
        them, or let them again (its default priority). In the swarm-bound fleet
        libtorrent counted 9-31 MB of redundant payload per node (of 134 MB): peers'
        blocks of pieces that the S3 reader then brought first; 0.3-1.7 MB where S3
        reads stripes nobody else has."""
        if pieces:
            with self._lock:
                if on:
                    self.held_for_s3.update(pieces)
                else:
                    self.held_for_s3.difference_update(pieces)
                self._apply(pieces)

    def leave_to_owners(self, pieces: set[int]) -> None:
        """Keep peers from bringing ``pieces`` (priority 0) and let every piece kept so
        before and not in ``pieces`` come again: the pieces only seeders hold that other
        new nodes take from them (:mod:`swarm.agent.seedershare`)."""
        with self._lock:
            changed = self.left_to_owners ^ pieces
            self.left_to_owners = set(pieces)
            self._apply(changed)

    def _apply(self, pieces: Iterable[int]) -> None:
        """Give ``pieces`` priority 0 when S3 or an owner brings them, or under
        upload-only when libtorrent is not finishing them, else the default (under the
        lock)."""
        kept = self.held_for_s3 | self.left_to_owners
        finish = self.peers_finish

        def wanted(i: int) -> bool:
            return i not in kept and (finish is None or i in finish)

        priorities = [(i, DEFAULT_PIECE_PRIORITY if wanted(i) else 0) for i in pieces]
        if priorities:
            self.handle.prioritize_pieces(priorities)
