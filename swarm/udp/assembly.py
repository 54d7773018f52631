"""The receiver's pieces in the making: which blocks arrived, the buffers blocks are
decrypted into (and reused), and the sink's verdicts on whole pieces. Pure bookkeeping over
a :class:`~swarm.udp.wire.BlockPlan`, by position in the plan's pieces.
"""

from __future__ import annotations

from swarm.udp.wire import BlockPlan, LocalProtocolError

MAX_POOLED_PIECES = 8
"""Piece buffers kept for reuse (:meth:`~swarm.udp.receiver.ClientSession.recycle`)."""
MAX_PIECE_ATTEMPTS = 3
"""Times a piece is received before the receiver gives up on it (its hash failed each time):
a sender with a corrupt piece must not keep us in a loop; another source will provide it."""


class PieceAssembly:
    """Blocks present (:attr:`have`, by ordinal), blocks missing per piece
    (:attr:`remaining`), the buffers of pieces begun (:attr:`views` of :attr:`buffers`),
    pieces awaiting the sink's check and pieces settled (kept, or given up)."""

    def __init__(self, plan: BlockPlan) -> None:
        self.plan = plan
        self.have = bytearray(plan.total)
        self.remaining = [len(plan.ordinals(i)) for i in range(len(plan.pieces))]
        self.buffers: dict[int, bytearray] = {}
        self.views: dict[int, memoryview] = {}
        self.attempts = [0] * len(plan.pieces)
        self.finished: set[int] = set()
        """Positions settled: kept, given up, or skipped."""
        self.checking: set[int] = set()
        self._pool: list[bytearray] = []

    @property
    def all_settled(self) -> bool:
        return len(self.finished) == len(self.plan.pieces)

    def open(self, pos: int) -> memoryview:
        """A buffer for the piece at ``pos``, its first block arriving."""
        buf = self.buffers[pos] = self._new_buffer(self.plan.lengths[pos])
        view = self.views[pos] = memoryview(buf)
        return view

    def complete(self, pos: int) -> bytearray:
        """The piece at ``pos`` has all its blocks: its buffer, for the sink to check."""
        self.checking.add(pos)
        self.views.pop(pos).release()
        return self.buffers.pop(pos)

    def _new_buffer(self, length: int) -> bytearray:
        pool = self._pool
        if pool and length == self.plan.piece_size:
            return pool.pop()  # old bytes: every block of the piece overwrites its part
        return bytearray(length)

    def recycle(self, data: bytes | bytearray) -> None:
        if (
            isinstance(data, bytearray)
            and len(data) == self.plan.piece_size
            and len(self._pool) < MAX_POOLED_PIECES
        ):
            self._pool.append(data)

    def checked(self, index: int, ok: bool) -> range | None:
        """The sink's verdict on piece ``index``: None once it is settled (kept, or its hash
        failed :data:`MAX_PIECE_ATTEMPTS` times), else the ordinals of its blocks, all
        missing again."""
        pos = self.plan.position.get(index)
        if pos is None:
            raise LocalProtocolError(f"piece {index} was not accepted")
        if pos not in self.checking:
            raise LocalProtocolError(f"piece {index} is not awaiting a check")
        self.checking.discard(pos)
        self.attempts[pos] += 1
        if ok or self.attempts[pos] >= MAX_PIECE_ATTEMPTS:
            self.finished.add(pos)
            return None
        ordinals = self.plan.ordinals(pos)
        self.remaining[pos] = len(ordinals)
        for ordinal in ordinals:
            self.have[ordinal] = 0
        return ordinals

    def skip(self, pos: int) -> bool:
        """The piece at ``pos`` is wanted no more (another source brought it): its blocks
        count as present (a late one is a duplicate, none is NAKed) and its buffer goes
        back to the pool. False if it is settled already or whole (awaiting its check)."""
        if pos in self.finished or pos in self.checking:
            return False
        for ordinal in self.plan.ordinals(pos):
            self.have[ordinal] = 1
        self.remaining[pos] = 0
        view = self.views.pop(pos, None)
        if view is not None:
            view.release()
            self.recycle(self.buffers.pop(pos))
        self.finished.add(pos)
        return True
