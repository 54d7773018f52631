"""The sender's blast: which blocks go out now, sealed into GSO batches, sans-IO.

:func:`fill_batches` spends the pacer's tokens: NAKed blocks first (oldest first), then the
first pass in ordinal order, each read from a loaded piece of the
:class:`~swarm.udp.schedule.SendSchedule` and sealed into a
:class:`~swarm.udp.batch.BatchWriter`. Apart from the session (:mod:`swarm.udp.sender`:
handshake, REQUEST and ACCEPT, REPORTs, path validation) because it is the hot loop, tuned
per datagram, and needs none of the protocol: it says what it sent and why it stopped, and
the session keeps the counters and tells the receiver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from swarm.udp.batch import BatchWriter
from swarm.udp.crypto import Sealer
from swarm.udp.schedule import SendSchedule
from swarm.udp.wire import DGRAM_OVERHEAD, FLAG_RETRANSMIT


@dataclass(slots=True)
class Fill:
    """What one :func:`fill_batches` sent, and why it stopped."""

    tokens: float
    """Tokens (bytes) left over, for the next call."""
    sent: int = 0
    sent_bytes: int = 0
    """Wire bytes of the datagrams sent."""
    retransmits: int = 0
    blocked: bool = False
    """Stopped to wait for a piece to load (``piece_loaded``)."""
    drained: bool = False
    """Stopped with nothing left to send: the first pass is over and no NAK waits."""


def fill_batches(
    schedule: SendSchedule,
    sealer: Sealer,
    session_id: bytes,
    tokens: float,
    out: BatchWriter,
    limit: int,
    want_pieces: Callable[[], None],
) -> Fill:
    """Seal into ``out`` the datagrams ``tokens`` bytes pay for (at most ``limit``), from
    the pieces ``schedule`` has loaded; ``want_pieces`` is called when one it needs is not.

    The first pass is sealed in runs of one piece's full-size blocks straight into the
    batch buffer: per datagram, one header ``pack_into`` and one AEAD call."""
    plan = schedule.plan
    sid = session_id
    loaded = schedule.loaded
    retx = schedule.retx
    pieces = plan.pieces
    block = plan.block_size
    wire_block = block + DGRAM_OVERHEAD
    capacity = out.capacity
    fill = Fill(tokens)
    sent = retransmits = sent_bytes = 0
    retx_waits = False
    while sent < limit:
        if retx and not retx_waits:
            ordinal, flags = retx[0], FLAG_RETRANSMIT
        elif schedule.first_pass_ordinal() < plan.total:
            ordinal, flags = schedule.next_ordinal, 0
        else:
            if retx_waits:
                fill.blocked = True
            else:
                fill.drained = True
            break
        pos, offset, length = plan.locate(ordinal)
        piece = loaded.get(pieces[pos])
        if piece is None:
            want_pieces()
            if flags:
                # The piece of the next retransmission is loading (it left the cache):
                # meanwhile the first pass goes on, rather than the link going idle.
                retx_waits = True
                continue
            # Wait for piece_loaded() (next_timer is None meanwhile: no busy loop).
            fill.blocked = True
            break
        size = length + DGRAM_OVERHEAD
        if tokens < size - 1:  # 1 byte of slack for float rounding
            break
        if not out.make_room(size):
            break
        if flags or length != block:
            # One datagram: a retransmission, or a piece's short last block.
            tokens -= size
            if flags:
                schedule.retransmitted(ordinal, pieces[pos])
                retransmits += 1
            else:
                schedule.next_ordinal += 1
            out.seal(sealer, flags, sid, ordinal, piece[offset : offset + length])
            sent += 1
            sent_bytes += size
            if length != block:
                # A short datagram can only end a GSO batch.
                out.close()
                if out.done:
                    break
            continue
        # A run of first-pass full blocks of this piece, as many as tokens, the batch
        # and the piece allow (a piece's last block may be short: not in the run).
        full_end = plan.ends[pos] - (1 if plan.lengths[pos] % block else 0)
        run = min(
            full_end - ordinal,
            int((tokens + 1) // wire_block),
            capacity - out.count,
            limit - sent,
        )
        out.seal_run(sealer, sid, ordinal, piece, offset, block, run)
        schedule.next_ordinal = ordinal + run
        tokens -= run * wire_block
        sent += run
        sent_bytes += run * wire_block
    fill.tokens = tokens
    fill.sent, fill.sent_bytes, fill.retransmits = sent, sent_bytes, retransmits
    return fill
