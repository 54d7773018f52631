"""What the sender owes and what it must hold to pay it: the first pass's cursor, the queue
of NAKed blocks (oldest first), and the cache of pieces both read from.

Pure bookkeeping over a :class:`~swarm.udp.wire.BlockPlan`: the sender
(:class:`~swarm.udp.sender.ServerSession`) asks it which pieces to load
(:meth:`SendSchedule.want`) and which it may drop (:meth:`SendSchedule.evict`).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence

from swarm.udp.wire import BlockPlan, LocalProtocolError


class SendSchedule:
    """The blocks still to send of one accepted request, and the pieces they need.

    The first pass sends ordinals in order from :attr:`next_ordinal`, with ``prefetch``
    pieces ahead loaded; NAKed ordinals wait in :attr:`retx`. Loaded pieces are evicted
    down to ``cache`` (at least ``prefetch + 2``), keeping those either still needs."""

    def __init__(self, plan: BlockPlan, prefetch_pieces: int, cache_pieces: int) -> None:
        self.plan = plan
        self.next_ordinal = 0
        self.retx: deque[int] = deque()
        self.retx_set: set[int] = set()
        self.retx_pieces: dict[int, int] = {}
        """Piece index -> how many of its blocks wait in ``retx`` (oldest NAKed first)."""
        self.loaded: dict[int, memoryview] = {}
        self.loading: set[int] = set()
        self.prefetch = prefetch_pieces
        self.cache = max(cache_pieces, prefetch_pieces + 2)
        self.skipped: set[int] = set()
        """Positions (in the plan's pieces) the receiver asked us to drop (SKIP)."""

    @property
    def done(self) -> bool:
        """Every block was sent once and every NAK received so far was served."""
        return self.first_pass_ordinal() >= self.plan.total and not self.retx

    def nak(self, ordinal: int) -> None:
        """Queue ``ordinal`` (in range) for retransmission, unless it already waits or its
        piece was skipped (a REPORT sent before the SKIP)."""
        if ordinal not in self.retx_set:
            plan = self.plan
            pos = plan.locate(ordinal)[0]
            if pos in self.skipped:
                return
            self.retx_set.add(ordinal)
            self.retx.append(ordinal)
            piece = plan.pieces[pos]
            self.retx_pieces[piece] = self.retx_pieces.get(piece, 0) + 1

    def skip(self, positions: set[int]) -> None:
        """Send nothing more of the pieces at ``positions``: their queued retransmissions
        are dropped, the first pass will jump them (:meth:`first_pass_ordinal`) and they
        leave the cache."""
        plan = self.plan
        new = positions - self.skipped
        if not new:
            return
        self.skipped |= new
        dropped = {plan.pieces[pos] for pos in new}
        if dropped & self.retx_pieces.keys():
            kept = [o for o in self.retx if plan.locate(o)[0] not in new]
            self.retx = deque(kept)
            self.retx_set = set(kept)
            for piece in dropped:
                self.retx_pieces.pop(piece, None)
        for piece in dropped:
            self.loaded.pop(piece, None)
        self.first_pass_ordinal()

    def first_pass_ordinal(self) -> int:
        """:attr:`next_ordinal`, moved past any skipped piece it stands in."""
        if self.skipped:
            plan = self.plan
            while self.next_ordinal < plan.total:
                pos = plan.locate(self.next_ordinal)[0]
                if pos not in self.skipped:
                    break
                self.next_ordinal = plan.ends[pos]
        return self.next_ordinal

    def retransmitted(self, ordinal: int, piece_index: int) -> None:
        """The head of :attr:`retx` (``ordinal``, of piece ``piece_index``) was sent."""
        self.retx.popleft()
        self.retx_set.discard(ordinal)
        left = self.retx_pieces[piece_index] - 1
        if left:
            self.retx_pieces[piece_index] = left
        else:
            del self.retx_pieces[piece_index]

    def add(self, index: int, data: bytes | memoryview) -> None:
        """Piece ``index`` is loaded (as the sender asked with :meth:`want`)."""
        if len(data) != self.plan.piece_length(index):
            raise LocalProtocolError(
                f"piece {index} is {len(data)} bytes, expected {self.plan.piece_length(index)}"
            )
        self.loading.discard(index)
        self.loaded[index] = memoryview(data)

    def _ahead(self) -> Sequence[int]:
        """The first pass's current piece and ``prefetch`` after it (none once it is over),
        skipped pieces left out."""
        plan = self.plan
        ordinal = self.first_pass_ordinal()
        if ordinal < plan.total:
            pos = plan.locate(ordinal)[0]
            ahead = range(pos, min(pos + self.prefetch + 1, len(plan.pieces)))
            return [plan.pieces[i] for i in ahead if i not in self.skipped]
        return ()

    def evict(self) -> None:
        if len(self.loaded) <= self.cache:
            return
        needed = set(self.retx_pieces)
        needed.update(self._ahead())
        for index in list(self.loaded):
            if len(self.loaded) <= self.cache:
                break
            if index not in needed:
                del self.loaded[index]

    def want(self) -> list[int]:
        """Pieces to load now (marked loading): retransmissions' first, then the first
        pass's next ones."""
        want = list(itertools.islice(self.retx_pieces, self.cache))
        want.extend(self._ahead())
        new = []
        for index in want:
            if index not in self.loaded and index not in self.loading:
                self.loading.add(index)
                new.append(index)
        return new

    def short_ahead(self) -> bool:
        """A piece the first pass will soon need is neither loaded nor loading."""
        loaded, loading = self.loaded, self.loading
        return any(i not in loaded and i not in loading for i in self._ahead())
