"""S3 pieces into the torrent: the hybrid of BitTorrent and the origin.

``TorrentSink`` lets the S3 source write into a libtorrent torrent with ``add_piece``,
so a piece read from S3 is offered to peers the moment libtorrent has checked it.

``origin_pieces`` decides which pieces this node should read from S3 now, without a
coordinator: only pieces that no connected peer has and that are not already on their
way from a peer, starting at an offset derived from the node's id, so nodes that start
together read different parts of the object and the swarm spreads them. A lone node
(or one whose peers hold nothing) reads everything; a node among seeders reads nothing.
With a coordinator, its stripes replace the offset (see ``swarm.coordinator.origin``);
this module is what a node does alone.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future

from swarm.manifest import Manifest
from swarm.policy import MixState, Mode, decide, ema, rate
from swarm.sources.peers import ADD_PIECE_TIMEOUT, TorrentSession

MAX_PENDING_BYTES = 32 << 20
"""Bytes of S3 pieces handed to libtorrent and not yet hashed, per artifact: enough to
keep its hashing and writing busy while the readers go on, small enough for the
daemon's memory bound (a 2 GiB artifact under 250 MiB RSS)."""


class TorrentSink:
    """The :class:`~swarm.sources.PieceSink` of a daemon: the torrent itself."""

    def __init__(self, session: TorrentSession, manifest: Manifest) -> None:
        self.session = session
        self.manifest = manifest
        self.info_hash = manifest.info_hash
        self.state = session.torrents[self.info_hash]
        self.handle = self.state.handle
        self._lock = threading.Lock()
        self._pending: dict[int, Future[bool]] = {}
        self._room = threading.BoundedSemaphore(
            max(1, MAX_PENDING_BYTES // max(1, manifest.piece_size))
        )
        self.bytes_by_source: dict[str, int] = {}
        self.hash_failures = 0

    def have(self, index: int) -> bool:
        return self.state.has(index)

    def complete(self) -> bool:
        # its own state, not the session's entry: a directory swapped into DEST is
        # removed from the session and added again under a new sink meanwhile
        return self.state.finished.is_set()

    def missing(self) -> list[int]:
        """Pieces not held, as of libtorrent's last alert (a status snapshot may be 0.5 s
        old: a reader choosing from it picked pieces it already had, skipped them at once
        and chose again, spinning until the next snapshot)."""
        held = self.state.held
        return [i for i in range(self.manifest.layout.count) if i not in held]

    def offer(
        self,
        index: int,
        data: bytes | memoryview,
        source: str | None,
        counted: Mapping[str, int] | None = None,
    ) -> bool:
        """Hand the piece to libtorrent, which checks its SHA-1 before keeping it (one hash
        per byte: checking here too would double the hashing of every S3 byte). ``source``
        None: the bytes were counted already (a piece the node wrote itself, handed over
        later: :meth:`DirectSink.share <swarm.agent.direct.DirectSink.share>`).
        ``counted``: the bytes to count per source, where the piece came from several
        (:mod:`swarm.agent.topup`); else all of it is ``source``'s.

        Returns at once (True) while libtorrent hashes and writes, up to
        :data:`MAX_PENDING_BYTES` per sink; :meth:`settle` waits for the verdicts."""
        if self.have(index):
            return True  # a duplicate (another source was faster): accepted, not counted
        length = len(data)
        if length != self.manifest.layout.length(index):
            with self._lock:
                self.hash_failures += 1
            return False
        self._room.acquire()  # bounds the bytes queued in libtorrent (the daemon's RSS)
        future = self.session.add_piece_async(self.info_hash, index, bytes(data))

        def verdict(done: Future[bool]) -> None:
            self._room.release()
            kept = not done.cancelled() and done.exception() is None and done.result()
            with self._lock:
                if kept:
                    self._count(counted or ({source: length} if source is not None else {}))
                else:
                    self.hash_failures += 1

        future.add_done_callback(verdict)
        with self._lock:
            self._pending[index] = future
        return True

    def _count(self, counted: Mapping[str, int]) -> None:
        """Add to :attr:`bytes_by_source` (the caller holds the lock)."""
        for source, nbytes in counted.items():
            self.bytes_by_source[source] = self.bytes_by_source.get(source, 0) + nbytes

    def count(self, counted: Mapping[str, int]) -> None:
        """Add to :attr:`bytes_by_source`: bytes of a piece written past libtorrent."""
        with self._lock:
            self._count(counted)

    def settle(self, pieces: Iterable[int], timeout: float = ADD_PIECE_TIMEOUT) -> int:
        """Wait for libtorrent's verdict on ``pieces`` offered earlier; count the failures."""
        bad = 0
        for index in pieces:
            with self._lock:
                future = self._pending.pop(index, None)
            if future is None:
                continue
            try:
                if not future.result(timeout):
                    bad += 1
            except TimeoutError:
                bad += 1
        return bad


def stripe_offset(node_id: str, count: int) -> int:
    """Where this node starts reading the origin: a stable hash of its id, mod piece count."""
    if count == 0:
        return 0
    return int.from_bytes(hashlib.sha1(node_id.encode()).digest()[:8], "big") % count


def origin_pieces(
    missing: Sequence[int],
    availability: Sequence[int],
    in_flight_from_peers: set[int],
    offset: int,
    limit: int,
) -> list[int]:
    """Pieces to read from S3 now (pure).

    Args:
        missing: pieces this node does not hold.
        availability: per piece, how many connected peers hold it.
        in_flight_from_peers: pieces partly downloaded from peers already.
        offset: this node's stripe start (:func:`stripe_offset`).
        limit: at most this many (a batch; the choice is made again after it).
    Returns:
        Up to ``limit`` pieces nobody near us has, in order from ``offset`` round the end.
    """
    count = len(availability)
    candidates = [
        i for i in missing if i not in in_flight_from_peers and (i >= count or availability[i] == 0)
    ]
    candidates.sort(key=lambda i: (i - offset) % max(count, 1))
    return candidates[:limit]


def bitfield(pieces: Sequence[bool]) -> str:
    """Held pieces as a base64 BitTorrent bitfield (piece 0 = high bit of byte 0)."""
    blob = bytearray((len(pieces) + 7) // 8)
    for index, held in enumerate(pieces):
        if held:
            blob[index // 8] |= 0x80 >> (index % 8)
    return base64.b64encode(bytes(blob)).decode()


def wide_pieces(
    missing: Sequence[int],
    availability: Sequence[int],
    in_flight_from_peers: set[int],
    limit: int,
) -> list[int]:
    """WIDE mode: the swarm is too slow, so read every missing piece from S3, from the end
    of the file backwards, in this order: pieces peers hold (they will not come sooner),
    pieces nobody holds yet (waiting for another node's stripe to spread them is what made
    WIDE readers idle half the time in the slow-uploads benchmark), and last the pieces
    already on their way from a peer (otherwise a slow peer holds the fetch's tail;
    libtorrent drops the peer's partial piece once S3's copy passes its hash)."""
    count = len(availability)

    def order(i: int) -> int:
        if i in in_flight_from_peers:
            return 2
        return 0 if i < count and availability[i] > 0 else 1

    return sorted(reversed(missing), key=order)[:limit]


def fill_pieces(
    missing: Sequence[int],
    availability: Sequence[int],
    in_flight_from_peers: set[int],
    offset: int,
    limit: int = 1,
) -> list[int]:
    """Fill reads: the rarest missing pieces that peers hold (a piece nobody holds belongs
    to a stripe). Rarest, because the node can then serve it to others too; ties start at
    the node's ``offset`` so that nodes filling at once pick different pieces. Pieces on
    their way from a peer come last, yet they come: when only those are left, a slow
    peer would otherwise hold the fetch's tail (one read at a time bounds the waste)."""
    count = len(availability)
    candidates = [i for i in missing if i < count and availability[i] > 0]
    candidates.sort(
        key=lambda i: (i in in_flight_from_peers, availability[i], (i - offset) % max(count, 1))
    )
    return candidates[:limit]


class LocalOriginPolicy:
    """A node's own origin choice when no fresh coordinator plan exists.

    STRIPE mode reads :func:`origin_pieces` (nobody near us has them); WIDE mode, decided
    by :func:`swarm.policy.decide` from this node's swarm rate against its own S3 rate,
    reads those first, then the rest of :func:`wide_pieces` (every missing piece).
    """

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.state = MixState()
        self.s3_rate: float | None = None
        self._last: tuple[float, int] | None = None

    def choose(
        self,
        missing: Sequence[int],
        availability: Sequence[int],
        in_flight_from_peers: set[int],
        limit: int,
        *,
        piece_size: int,
        peers_rate: float,
        s3_bytes: int,
        now: float,
    ) -> list[int]:
        if self._last is not None:
            dt = now - self._last[0]
            if dt > 0:
                sample = rate(self._last[1], s3_bytes, dt)
                if sample > 0:  # what S3 gives while we read it; idle time says nothing
                    self.s3_rate = ema(self.s3_rate, sample, dt)
        self._last = (now, s3_bytes)
        count = len(availability)
        backlog = sum(1 for i in missing if i < count and availability[i] > 0) * piece_size
        self.state = decide(self.state, peers_rate, self.s3_rate, backlog, now)
        stripe = origin_pieces(missing, availability, in_flight_from_peers, self.offset, limit)
        if self.state.mode is Mode.WIDE:  # and everything peers are slow to give
            slow = wide_pieces(missing, availability, in_flight_from_peers, len(missing))
            taken = set(stripe)
            return stripe + [p for p in slow if p not in taken]
        return stripe
