"""The receiver's data path: datagrams from the data socket, authenticated and decrypted
into their piece's buffer, sans-IO.

Apart from the session (:mod:`swarm.udp.receiver`: the protocol's states and control
messages) because it is the per-datagram hot path, tuned for it, and needs none of the
protocol: made on ACCEPT, it is handed the plan, the data key, the pieces in the making
(:mod:`swarm.udp.assembly`) and the loss bookkeeping (:mod:`swarm.udp.loss`), and tells
the session only when data first proves the UDP path.

A bad *datagram* never raises (it is dropped and counted); an *authentic* block that does
not fit the plan does (see :mod:`swarm.udp.receiver`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import TYPE_CHECKING

from swarm.udp.assembly import PieceAssembly
from swarm.udp.control import ControlChannel
from swarm.udp.crypto import AESGCM, InvalidTag
from swarm.udp.events import PieceReceived
from swarm.udp.loss import LossTracker
from swarm.udp.wire import (
    DGRAM,
    DGRAM_DATA,
    DGRAM_HEADER_LEN,
    DGRAM_OVERHEAD,
    FLAG_RETRANSMIT,
    TAG_LEN,
    BlockPlan,
    RemoteProtocolError,
)

if TYPE_CHECKING:
    from swarm.udp.receiver import ReceiverStats


class BlockIntake:
    """The accepted plan's blocks as they arrive: new authentic ones are decrypted into
    their piece's buffer, whole pieces go to ``side``'s events as :class:`PieceReceived`,
    the rest is counted in ``stats`` (duplicates, forgeries).

    ``on_path_proven`` is called on the first authentic new block: data may overtake
    PATH_OK (UDP vs TCP), and an authentic block proves the path."""

    def __init__(
        self,
        plan: BlockPlan,
        aead: AESGCM,
        session_id: bytes,
        assembly: PieceAssembly,
        loss: LossTracker,
        stats: ReceiverStats,
        side: ControlChannel,
        on_path_proven: Callable[[], None],
    ) -> None:
        self.plan = plan
        self._aead = aead
        self._session_id = session_id
        self._assembly = assembly
        self._loss = loss
        self._stats = stats
        self._side = side
        self._on_path_proven = on_path_proven
        self._proven = False

    def receive_batch(self, data: memoryview, size: int, segment: int, live: bool) -> None:
        """Datagrams of ``segment`` bytes back to back in ``data[:size]`` (see
        :meth:`~swarm.udp.receiver.ClientSession.receive_batch`). ``live``: the session
        takes blocks (probing or receiving); if not, each datagram is only counted.

        New authentic blocks take a fast path (one header unpack and one AEAD call each);
        anything else (duplicates, forgeries, blocks that do not fit) goes through
        :meth:`receive`'s checks."""
        if not live:
            for start in range(0, size, segment):
                self.receive(data[start : min(start + segment, size)], live)
            return
        stats = self._stats
        plan = self.plan
        aead = self._aead
        assembly = self._assembly
        sid = self._session_id
        have = assembly.have
        total = plan.total
        first, ends, lengths, block = plan.first, plan.ends, plan.lengths, plan.block_size
        unpack_from = DGRAM.unpack_from
        decrypt_into = aead.decrypt_into
        views = assembly.views
        remaining = assembly.remaining
        loss = self._loss
        outstanding = loss.outstanding
        pending = self._side.pending
        datagrams = payload = forged = 0
        seq_high = loss.seq_high
        first_high = loss.first_high
        proven = self._proven
        for start in range(0, size, segment):
            end = start + segment
            if end > size:
                end = size
            if end - start < DGRAM_OVERHEAD:
                forged += 1
                continue
            kind, flags, session, seq, ordinal = unpack_from(data, start)
            length = end - start - DGRAM_OVERHEAD
            if kind != DGRAM_DATA or session != sid or ordinal >= total or have[ordinal]:
                pos = -1
            else:
                pos = bisect_right(first, ordinal) - 1
                offset = (ordinal - first[pos]) * block
                if length != (block if ordinal < ends[pos] - 1 else lengths[pos] - offset):
                    pos = -1
            if pos < 0:
                # Not a new block that fits: the careful path (it may raise).
                loss.seq_high, loss.first_high = seq_high, first_high
                stats.datagrams += datagrams
                stats.bytes += payload
                stats.forged += forged
                loss.received_interval += datagrams
                datagrams = payload = forged = 0
                self.receive(data[start:end], live)
                seq_high, first_high = loss.seq_high, loss.first_high
                proven = self._proven
                continue
            view = views.get(pos)
            if view is None:
                view = assembly.open(pos)
            header_end = start + DGRAM_HEADER_LEN
            try:
                # Decrypts in place; on a bad tag the bytes written are garbage, but the
                # block stays missing, so the authentic copy overwrites them.
                decrypt_into(
                    seq.to_bytes(12, "big"),
                    data[header_end:end],
                    data[start:header_end],
                    view[offset : offset + length],
                )
            except InvalidTag:
                forged += 1
                continue
            datagrams += 1
            payload += length
            if seq > seq_high:
                seq_high = seq
            have[ordinal] = 1
            if not proven:
                # Data may overtake PATH_OK (UDP vs TCP); an authentic block proves the path.
                proven = self._proven = True
                self._on_path_proven()
            if outstanding and outstanding.pop(ordinal, None) is not None:
                loss.answered(ordinal, flags)
            if not flags & FLAG_RETRANSMIT and ordinal > first_high:
                first_high = ordinal
            remaining[pos] -= 1
            if remaining[pos] == 0:
                pending.append(PieceReceived(plan.pieces[pos], assembly.complete(pos)))
        loss.seq_high, loss.first_high = seq_high, first_high
        stats.datagrams += datagrams
        stats.bytes += payload
        stats.forged += forged
        loss.received_interval += datagrams

    def receive(self, data: memoryview, live: bool) -> None:
        """One datagram, checked with care: forged ones are counted in ``stats.forged``; an
        authentic block that does not fit the plan raises :class:`RemoteProtocolError`."""
        plan = self.plan
        aead = self._aead
        assembly = self._assembly
        stats = self._stats
        if len(data) < DGRAM_OVERHEAD or data[0] != DGRAM_DATA or data[2:10] != self._session_id:
            stats.forged += 1
            return
        _, flags, _, seq, ordinal = DGRAM.unpack_from(data)
        header = data[:DGRAM_HEADER_LEN]
        nonce = seq.to_bytes(12, "big")
        body = data[DGRAM_HEADER_LEN:]
        if ordinal >= plan.total or assembly.have[ordinal] or not live:
            # Not a block we want: authenticate it (to count forgeries) but keep nothing.
            try:
                aead.decrypt(nonce, body, header)
            except InvalidTag:
                stats.forged += 1
                return
            if ordinal >= plan.total:
                raise RemoteProtocolError(f"block {ordinal} of {plan.total}")
            self._count(seq, len(body) - TAG_LEN)
            stats.duplicates += 1
            return
        pos, offset, length = plan.locate(ordinal)
        if len(body) - TAG_LEN != length:
            try:
                aead.decrypt(nonce, body, header)
            except InvalidTag:
                stats.forged += 1
                return
            raise RemoteProtocolError(
                f"block {ordinal} is {len(body) - TAG_LEN} bytes, not {length}"
            )
        view = assembly.views.get(pos)
        if view is None:
            view = assembly.open(pos)
        try:
            # Decrypts in place; on a bad tag the bytes written are garbage, but the block
            # stays missing, so the authentic copy overwrites them.
            aead.decrypt_into(nonce, body, header, view[offset : offset + length])
        except InvalidTag:
            stats.forged += 1
            return
        self._count(seq, length)
        if not self._proven:
            # Data may overtake PATH_OK (UDP vs TCP); an authentic datagram proves the path.
            self._proven = True
            self._on_path_proven()
        assembly.have[ordinal] = 1
        self._loss.arrived(ordinal, flags)
        assembly.remaining[pos] -= 1
        if assembly.remaining[pos] == 0:
            self._side.pending.append(PieceReceived(plan.pieces[pos], assembly.complete(pos)))

    def _count(self, seq: int, payload: int) -> None:
        stats = self._stats
        stats.datagrams += 1
        stats.bytes += payload
        self._loss.counted(seq)
