"""The sender's batches: sealed datagrams back to back in one buffer, for one ``sendmsg``
with ``UDP_SEGMENT`` (GSO), and the pool of buffers the edge gives back.

:class:`BatchWriter` seals into the open batch, closing it when the next datagram does not
fit (a larger one, or ``capacity`` of them) and after a short one (only the last segment of
a GSO send may be shorter); :class:`BatchPool` keeps sent buffers for the next batches.
Pure: no socket, clock or RNG.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarm.udp.crypto import Sealer
from swarm.udp.wire import DGRAM, DGRAM_DATA, DGRAM_HEADER_LEN, DGRAM_OVERHEAD

MAX_FREE_BUFFERS = 16


@dataclass(slots=True)
class Batch:
    """``count`` sealed datagrams back to back in ``data``: each ``segment`` bytes but the
    last, which may be shorter (what ``UDP_SEGMENT`` sends as ``count`` datagrams).
    ``data`` is a view of ``buffer``, which :meth:`~swarm.udp.sender.ServerSession.recycle` takes
    back."""

    data: memoryview
    segment: int
    count: int
    buffer: bytearray

    def datagrams(self) -> list[memoryview]:
        view = self.data
        seg = self.segment
        return [view[i : i + seg] for i in range(0, len(view), seg)]


def buffer_size(block_size: int, max_segments: int, max_bytes: int) -> int:
    """Bytes of one batch buffer: as many wire blocks as the edge's GSO limits allow."""
    wire_block = block_size + DGRAM_OVERHEAD
    return max(1, min(max_segments, max_bytes // wire_block)) * wire_block


class BatchPool:
    """Batch buffers sent and given back (:meth:`recycle`): no allocation per batch."""

    def __init__(self) -> None:
        self.free: list[bytearray] = []

    def recycle(self, batch: Batch, size: int | None) -> None:
        """Release ``batch``'s view and keep its buffer if it is ``size`` bytes (the
        current batch buffer size; None before there is one)."""
        batch.data.release()
        if size is not None and len(self.free) < MAX_FREE_BUFFERS and len(batch.buffer) == size:
            self.free.append(batch.buffer)

    def writer(self, capacity: int, wire_block: int, max_batches: int) -> BatchWriter:
        return BatchWriter(self.free, capacity, wire_block, max_batches)


class BatchWriter:
    """Fills batches of at most ``capacity`` datagrams (buffers of ``capacity`` wire
    blocks, taken from ``free`` or allocated), at most ``max_batches`` of them."""

    def __init__(
        self, free: list[bytearray], capacity: int, wire_block: int, max_batches: int
    ) -> None:
        self.batches: list[Batch] = []
        self.capacity = capacity
        self._free = free
        self._wire_block = wire_block
        self._max_batches = max_batches
        self._buf: bytearray | None = None
        self._view = memoryview(b"")
        self.segment = self.used = self.count = 0

    @property
    def done(self) -> bool:
        """``max_batches`` are closed: nothing more may be sealed."""
        return len(self.batches) >= self._max_batches

    def make_room(self, size: int) -> bool:
        """Open a batch that takes a datagram of ``size`` bytes, closing the open one if it
        cannot; False if that closed the last batch allowed (nothing is opened)."""
        if self._buf is not None and (size > self.segment or self.count >= self.capacity):
            self.close()
            if self.done:
                return False
        if self._buf is None:
            free = self._free
            self._buf = free.pop() if free else bytearray(self.capacity * self._wire_block)
            self._view = memoryview(self._buf)
            self.segment, self.used, self.count = size, 0, 0
        return True

    def close(self) -> None:
        """Close the open batch (a short datagram can only end a GSO batch)."""
        assert self._buf is not None
        self.batches.append(Batch(self._view[: self.used], self.segment, self.count, self._buf))
        self._buf = None

    def seal(
        self, sealer: Sealer, flags: int, sid: bytes, ordinal: int, payload: memoryview
    ) -> None:
        """One datagram: a retransmission, or a piece's short last block."""
        self.used += sealer.seal_datagram_into(
            self._view[self.used :], DGRAM_DATA, flags, sid, ordinal, payload
        )
        self.count += 1

    def seal_run(
        self,
        sealer: Sealer,
        sid: bytes,
        ordinal: int,
        piece: memoryview,
        offset: int,
        block: int,
        run: int,
    ) -> None:
        """``run`` first-pass full blocks of one piece from ``ordinal`` (at ``offset``),
        sealed straight into the buffer: per datagram, one header ``pack_into`` and one
        AEAD call."""
        view = self._view
        used = self.used
        wire_block = self._wire_block
        pack_into = DGRAM.pack_into
        encrypt_into = sealer.aead.encrypt_into
        seq = sealer.counter
        for _ in range(run):
            pack_into(view, used, DGRAM_DATA, 0, sid, seq, ordinal)
            header_end = used + DGRAM_HEADER_LEN
            used = header_end + wire_block - DGRAM_HEADER_LEN
            encrypt_into(
                seq.to_bytes(12, "big"),
                piece[offset : offset + block],
                view[header_end - DGRAM_HEADER_LEN : header_end],
                view[header_end:used],
            )
            seq += 1
            ordinal += 1
            offset += block
        sealer.counter = seq
        self.used = used
        self.count += run

    def finish(self) -> list[Batch]:
        """The batches sealed; an opened buffer left empty goes back to the pool."""
        if self._buf is not None:
            if self.count:
                self.close()
            else:
                self._free.append(self._buf)
        return self.batches
