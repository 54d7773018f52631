"""The client's machine (the receiver), sans-IO: authenticates the server, requests pieces,
reassembles blocks, reports loss and NAKs, and hands over whole pieces.

The edge sends :meth:`ClientSession.data_to_send` on the control connection and the PROBE
datagrams of :meth:`~ClientSession.handle_timer` from its data socket, feeds what the data
socket receives to :meth:`~ClientSession.receive_batch` (one UDP GRO receive: datagrams of
one size back to back) or :meth:`~ClientSession.receive_datagram`, and answers each
:class:`PieceReceived` with :meth:`~ClientSession.piece_checked`.

A bad *datagram* never raises: UDP sources are spoofable, so raising would let anyone kill a
session; it is dropped and counted. The one exception is an *authentic* block that does not
fit the plan: only the server holds the key to seal one, so it is a protocol error.

Loss detection: first-pass blocks arrive in ordinal order, so a missing ordinal well below
the highest first-pass one seen was lost (Tsunami's retransmit requests); it is NAKed in the
next REPORT, and NAKed again if its retransmission is lost too.
"""

from __future__ import annotations

import enum
import hmac
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from swarm.udp.control import ControlChannel
from swarm.udp.crypto import AESGCM, FleetKey, InvalidTag, Sealer
from swarm.udp.events import (
    Accepted,
    Authenticated,
    Event,
    PeerError,
    PieceReceived,
    Progress,
    Refused,
    TransferDone,
)
from swarm.udp.rate import MIN_RATE_BPS
from swarm.udp.wire import (
    ACCEPT,
    DEFAULT_BLOCK_SIZE,
    DGRAM,
    DGRAM_DATA,
    DGRAM_HEADER_LEN,
    DGRAM_OVERHEAD,
    DGRAM_PROBE,
    FLAG_RETRANSMIT,
    HASH_LEN,
    MAX_BLOCK_SIZE,
    MAX_CONTROL_FRAME,
    MAX_NAKS_PER_REPORT,
    MAX_PIECE_SIZE,
    MAX_PIECES_PER_REQUEST,
    MIN_BLOCK_SIZE,
    NONCE_LEN,
    PROGRESS,
    REPORT,
    REQUEST,
    TAG_LEN,
    VERSION_MAGIC,
    AuthenticationError,
    BlockPlan,
    LocalProtocolError,
    Msg,
    RemoteProtocolError,
    pack_u32s,
    piece_count_for,
    u32s,
    validate_block_size,
)

REPORT_INTERVAL = 0.05
"""Seconds between receiver REPORTs: the rate's control period. Short enough to react to a
queue filling within a few intervals, long enough for ~2,000 datagrams per sample at 1434 B
and 500 Mbit/s, so a loss fraction of a few tenths of a percent is measurable."""
PROBE_INTERVAL = 0.1
"""Seconds between PROBE datagrams until the server confirms the UDP path (PATH_OK)."""
REORDER_SLACK = 16
"""First-pass ordinals a block may arrive late by before it is NAKed: reordering is rare on
one path, and a spurious NAK costs one duplicate block."""
END_GRACE = 0.02
"""After the sender's first pass ends, seconds before NAKing the tail (datagrams sent just
before PASS_DONE may still be in flight)."""
RENAK_TIMEOUT = 1.0
"""Seconds after which a NAKed block that did not arrive is NAKed again regardless. Lost
retransmissions are found sooner and without a timer: the sender serves NAKs in order, so
a retransmission arriving for a later NAK reveals the loss of an earlier one, and the
sender's PROGRESS says when every NAK it was sent has been served. This timeout is only a
backstop: a timer tight enough to matter would fire while a retransmission waits in a
bottleneck's queue and send every such block twice."""
MAX_POOLED_PIECES = 8
"""Piece buffers kept for reuse (:meth:`ClientSession.recycle`)."""
MAX_PIECE_ATTEMPTS = 3
"""Times a piece is received before the receiver gives up on it (its hash failed each time):
a sender with a corrupt piece must not keep us in a loop; another source will provide it."""


class ClientState(enum.Enum):
    AWAIT_CHALLENGE = "await challenge"
    AWAIT_ACCEPT = "await accept"
    PROBING = "probing"
    RECEIVING = "receiving"
    DONE = "done"


@dataclass
class ReceiverStats:
    datagrams: int = 0
    bytes: int = 0
    """Payload bytes of authentic data datagrams, duplicates included."""
    duplicates: int = 0
    forged: int = 0
    naks: int = 0
    reports: int = 0
    hash_failures: int = 0
    sender_rate_bps: int = 0
    srtt: float | None = None
    min_rtt: float | None = None
    """The least round trip seen: the path's own, without the queues a blast builds."""
    batches: int = 0


class ClientSession:
    """The receiving side: authenticates, requests pieces, reassembles and NAKs blocks."""

    def __init__(
        self,
        key: FleetKey,
        client_nonce: bytes,
        info_hash_hex: str,
        pieces: Sequence[int],
        rate_bps: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        piece_size: int | None = None,
        piece_count: int | None = None,
    ) -> None:
        if len(client_nonce) != NONCE_LEN:
            raise LocalProtocolError(f"client nonce must be {NONCE_LEN} bytes")
        try:
            info_hash = bytes.fromhex(info_hash_hex)
        except ValueError:
            info_hash = b""
        if len(info_hash) != HASH_LEN:
            raise LocalProtocolError(f"info_hash must be 40 hex digits, got {info_hash_hex!r}")
        validate_block_size(block_size)
        if not pieces or len(pieces) > MAX_PIECES_PER_REQUEST or len(set(pieces)) != len(pieces):
            raise LocalProtocolError(
                f"pieces must be 1..{MAX_PIECES_PER_REQUEST} distinct indices, got {len(pieces)}"
            )
        if min(pieces) < 0 or (piece_count is not None and max(pieces) >= piece_count):
            raise LocalProtocolError(f"piece index out of range 0..{piece_count}")
        if rate_bps < MIN_RATE_BPS:
            raise LocalProtocolError(f"rate_bps must be >= {MIN_RATE_BPS}, got {rate_bps}")
        self._side = ControlChannel()
        self._key = key
        self._hello = VERSION_MAGIC + client_nonce
        self._client_nonce = client_nonce
        self._info_hash = info_hash
        self._requested = list(pieces)
        self._rate = rate_bps
        self._block_size = block_size
        self._expect_piece_size = piece_size
        self._expect_piece_count = piece_count
        self.state = ClientState.AWAIT_CHALLENGE
        self.stats = ReceiverStats()
        self.session_id = b""
        self.plan: BlockPlan | None = None
        self.unavailable: tuple[int, ...] = ()
        self.kept: list[int] = []
        self.failed: list[int] = []
        self._data_aead: AESGCM | None = None
        self._probe: Sealer | None = None
        self._next_probe = 0.0
        self._have = bytearray()
        self._remaining: list[int] = []
        self._buffers: dict[int, bytearray] = {}
        self._pool: list[bytearray] = []
        self._views: dict[int, memoryview] = {}
        self._attempts: list[int] = []
        self._settled = 0
        self._checking: set[int] = set()
        self._pos: dict[int, int] = {}
        self._scan = 0
        self._first_high = -1
        self._outstanding: dict[int, float] = {}
        """Missing ordinals to NAK -> when (0.0: at the next report)."""
        self._nak_order: deque[tuple[int, int]] = deque()
        self._nak_id: dict[int, int] = {}
        """Outstanding ordinal -> the id of its latest NAK."""
        self._nak_first: dict[int, int] = {}
        """Outstanding ordinal -> the id of its first NAK: a retransmission that arrives
        answers that one at least (if the ordinal was NAKed again, maybe not the latest)."""
        self._nak_at: dict[int, int] = {}
        """Outstanding ordinal -> the stamp (``echo``) of the report that last NAKed it."""
        self._next_nak_id = 0
        self._pass_done = False
        self._pass_done_at: float | None = None
        self._seq_high = -1
        self._seq_high_reported = -1
        self._received_interval = 0
        self._next_report = 0.0
        self._side.send_plain(Msg.HELLO, self._hello)

    def events(self) -> list[Event]:
        return self._side.events()

    def data_to_send(self) -> bytes:
        return self._side.data_to_send()

    def send_error(self, reason: str) -> None:
        self._side.send_error(reason)
        self.state = ClientState.DONE

    @property
    def done(self) -> bool:
        return self.state is ClientState.DONE

    # control channel
    def receive_control(self, data: bytes, now: float) -> None:
        if self.state is ClientState.DONE:
            return
        for kind, body in self._side.frames.feed(data):
            self._handle(kind, body, now)
            if self.state is ClientState.DONE:
                return

    def _handle(self, kind: int, body: bytes, now: float) -> None:
        side = self._side
        if kind == Msg.ERROR:
            awaiting_accept = self.state is ClientState.AWAIT_ACCEPT
            self.state = ClientState.DONE
            try:
                reason = side.error_frame(body)
            except RemoteProtocolError:
                if not awaiting_accept:
                    raise
                # A server that rejects our AUTH has no session keys, so it answers in
                # plaintext; a plaintext ERROR is accepted only in this one state.
                plain = body.decode("utf-8", "replace")
                raise AuthenticationError(
                    f"the server refused our fleet secret ({plain})"
                ) from None
            side.pending.append(PeerError(reason))
            return
        if self.state is ClientState.AWAIT_CHALLENGE:
            if kind != Msg.CHALLENGE or len(body) != NONCE_LEN + 32:
                raise RemoteProtocolError("expected CHALLENGE")
            server_nonce, proof = body[:NONCE_LEN], body[NONCE_LEN:]
            transcript = self._hello + server_nonce
            if not hmac.compare_digest(proof, self._key.proof(b"server", transcript)):
                raise AuthenticationError("the server failed to prove the fleet secret")
            keys = self._key.session_keys(self._client_nonce, server_nonce)
            side.send_ctl = Sealer(keys.control_c2s)
            side.recv_ctl = Sealer(keys.control_s2c)
            side.frames.limit = MAX_CONTROL_FRAME
            self._data_aead = AESGCM(keys.data_s2c)
            self._probe = Sealer(keys.data_c2s)
            self.session_id = keys.session_id
            side.send_plain(Msg.AUTH, self._key.proof(b"client", transcript))
            req = REQUEST.pack(self._info_hash, self._rate, self._block_size, len(self._requested))
            side.send_sealed(Msg.REQUEST, req + pack_u32s(self._requested))
            self.state = ClientState.AWAIT_ACCEPT
            side.pending.append(Authenticated(self.session_id))
            return
        body = side.open(kind, body)
        if self.state is ClientState.AWAIT_ACCEPT:
            if kind == Msg.REFUSE:
                if not body:
                    raise RemoteProtocolError("empty REFUSE")
                side.pending.append(Refused(body[0], body[1:].decode("utf-8", "replace")))
                self.unavailable = tuple(self._requested)
                self.state = ClientState.DONE
                return
            if kind != Msg.ACCEPT or len(body) < ACCEPT.size:
                raise RemoteProtocolError("expected ACCEPT")
            self._on_accept(body)
        elif kind == Msg.PATH_OK:
            if self.state is ClientState.PROBING:
                self.state = ClientState.RECEIVING
                self._next_report = now + REPORT_INTERVAL
        elif kind == Msg.PROGRESS:
            if len(body) != PROGRESS.size:
                raise RemoteProtocolError("bad PROGRESS")
            echo, served, rate, datagrams, sent, pass_done = PROGRESS.unpack(body)
            if echo:
                sample = max(0.0, now - echo / 1e6)
                srtt, least = self.stats.srtt, self.stats.min_rtt
                self.stats.srtt = sample if srtt is None else 0.875 * srtt + 0.125 * sample
                self.stats.min_rtt = sample if least is None else min(least, sample)
            self.stats.sender_rate_bps = rate
            side.pending.append(Progress(rate, datagrams, sent))
            if pass_done:
                if not self._pass_done:
                    self._pass_done = True
                    self._pass_done_at = now + END_GRACE
                # NAKs up to report `served` were all sent: what is still missing of them
                # was lost again (after a grace for datagrams in flight).
                due = now + END_GRACE
                for ordinal, at in self._nak_at.items():
                    if at <= served and self._outstanding.get(ordinal, 0.0) > due:
                        self._outstanding[ordinal] = due
        elif kind == Msg.BYE:
            self.state = ClientState.DONE
        else:
            raise RemoteProtocolError(f"unexpected message type {kind} in {self.state.value}")

    def _on_accept(self, body: bytes) -> None:
        piece_size, piece_count, total, block, rate, n = ACCEPT.unpack_from(body)
        missing = u32s(body[ACCEPT.size :], n, "ACCEPT unavailable")
        if not 1 <= piece_size <= MAX_PIECE_SIZE or total < 1:
            raise RemoteProtocolError(f"piece size {piece_size} / size {total} out of range")
        if piece_count != piece_count_for(total, piece_size):
            raise RemoteProtocolError(f"{piece_count} pieces cannot make {total} bytes")
        if self._expect_piece_size not in (None, piece_size) or self._expect_piece_count not in (
            None,
            piece_count,
        ):
            raise RemoteProtocolError(
                f"the server's artifact has {piece_count} pieces of {piece_size} bytes, "
                f"ours {self._expect_piece_count} of {self._expect_piece_size}"
            )
        if not MIN_BLOCK_SIZE <= block <= min(self._block_size, MAX_BLOCK_SIZE):
            # The server may lower our block size (its path MTU), never raise it (ours).
            raise RemoteProtocolError(
                f"ACCEPT names block size {block}, not in {MIN_BLOCK_SIZE}..{self._block_size}"
            )
        if max(self._requested) >= piece_count:
            raise RemoteProtocolError(f"the artifact has only {piece_count} pieces")
        if not set(missing) <= set(self._requested):
            raise RemoteProtocolError("ACCEPT lists a piece we did not ask for")
        self.unavailable = missing
        gone = set(missing)
        pieces = [p for p in self._requested if p not in gone]
        self.plan = BlockPlan(pieces, piece_size, total, block)
        self._have = bytearray(self.plan.total)
        self._remaining = [len(self.plan.ordinals(i)) for i in range(len(pieces))]
        self._attempts = [0] * len(pieces)
        self._pos = {piece: pos for pos, piece in enumerate(pieces)}
        self._side.pending.append(Accepted(piece_size, piece_count, total, block, rate, missing))
        if not pieces:
            self._finish()
            return
        self.state = ClientState.PROBING

    # data channel
    def receive_batch(self, data: memoryview, size: int, segment: int) -> None:
        """One receive of ``size`` bytes from the data socket: datagrams of ``segment``
        bytes back to back, the last one possibly shorter (a UDP GRO batch; ``segment ==
        size`` for a single datagram). ``data`` may be reused once this returns.

        New authentic blocks take a fast path (one header unpack and one AEAD call each);
        anything else (duplicates, forgeries, blocks that do not fit) goes through
        :meth:`receive_datagram`'s checks."""
        if segment <= 0:
            segment = size
        stats = self.stats
        stats.batches += 1
        plan = self.plan
        aead = self._data_aead
        if (
            plan is None
            or aead is None
            or self.state not in (ClientState.PROBING, ClientState.RECEIVING)
        ):
            for start in range(0, size, segment):
                self._receive(data[start : min(start + segment, size)])
            return
        sid = self.session_id
        have = self._have
        total = plan.total
        first, ends, lengths, block = plan.first, plan.ends, plan.lengths, plan.block_size
        unpack_from = DGRAM.unpack_from
        decrypt_into = aead.decrypt_into
        views = self._views
        remaining = self._remaining
        outstanding = self._outstanding
        pending = self._side.pending
        datagrams = payload = forged = 0
        seq_high = self._seq_high
        first_high = self._first_high
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
                self._seq_high, self._first_high = seq_high, first_high
                stats.datagrams += datagrams
                stats.bytes += payload
                stats.forged += forged
                self._received_interval += datagrams
                datagrams = payload = forged = 0
                self._receive(data[start:end])
                seq_high, first_high = self._seq_high, self._first_high
                continue
            view = views.get(pos)
            if view is None:
                buf = self._buffers[pos] = self._new_buffer(lengths[pos])
                view = views[pos] = memoryview(buf)
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
            if self.state is ClientState.PROBING:
                # Data may overtake PATH_OK (UDP vs TCP); an authentic block proves the path.
                self.state = ClientState.RECEIVING
                self._next_report = 0.0
            if outstanding and outstanding.pop(ordinal, None) is not None:
                self._nak_at.pop(ordinal, None)
                self._nak_id.pop(ordinal, None)
                nak_id = self._nak_first.pop(ordinal, None)
                if nak_id is not None and flags & FLAG_RETRANSMIT:
                    self._lost_before(nak_id - REORDER_SLACK)
            if not flags & FLAG_RETRANSMIT and ordinal > first_high:
                first_high = ordinal
            remaining[pos] -= 1
            if remaining[pos] == 0:
                self._checking.add(pos)
                views.pop(pos).release()
                pending.append(PieceReceived(plan.pieces[pos], self._buffers.pop(pos)))
        self._seq_high, self._first_high = seq_high, first_high
        stats.datagrams += datagrams
        stats.bytes += payload
        stats.forged += forged
        self._received_interval += datagrams

    def receive_datagram(self, data: bytes | memoryview) -> None:
        """A datagram from the data socket. Forged ones are counted in ``stats.forged``."""
        self._receive(memoryview(data))

    def _receive(self, data: memoryview) -> None:
        plan = self.plan
        aead = self._data_aead
        stats = self.stats
        if (
            plan is None
            or aead is None
            or len(data) < DGRAM_OVERHEAD
            or data[0] != DGRAM_DATA
            or data[2:10] != self.session_id
        ):
            stats.forged += 1
            return
        _, flags, _, seq, ordinal = DGRAM.unpack_from(data)
        header = data[:DGRAM_HEADER_LEN]
        nonce = seq.to_bytes(12, "big")
        body = data[DGRAM_HEADER_LEN:]
        state = self.state
        if state is ClientState.PROBING:
            # Data may overtake PATH_OK (UDP vs TCP); an authentic datagram proves the path.
            state = ClientState.RECEIVING
        if ordinal >= plan.total or self._have[ordinal] or state is not ClientState.RECEIVING:
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
        view = self._views.get(pos)
        if view is None:
            buf = self._buffers[pos] = self._new_buffer(plan.lengths[pos])
            view = self._views[pos] = memoryview(buf)
        try:
            # Decrypts in place; on a bad tag the bytes written are garbage, but the block
            # stays missing, so the authentic copy overwrites them.
            aead.decrypt_into(nonce, body, header, view[offset : offset + length])
        except InvalidTag:
            stats.forged += 1
            return
        self._count(seq, length)
        if self.state is ClientState.PROBING:
            self.state = ClientState.RECEIVING
            self._next_report = 0.0
        self._have[ordinal] = 1
        if self._outstanding.pop(ordinal, None) is not None:
            self._nak_at.pop(ordinal, None)
            self._nak_id.pop(ordinal, None)
            nak_id = self._nak_first.pop(ordinal, None)
            if nak_id is not None and flags & FLAG_RETRANSMIT:
                self._lost_before(nak_id - REORDER_SLACK)
        if not flags & FLAG_RETRANSMIT and ordinal > self._first_high:
            self._first_high = ordinal
        self._remaining[pos] -= 1
        if self._remaining[pos] == 0:
            self._checking.add(pos)
            self._views.pop(pos).release()
            self._side.pending.append(PieceReceived(plan.pieces[pos], self._buffers.pop(pos)))

    def _new_buffer(self, length: int) -> bytearray:
        pool = self._pool
        if pool and self.plan is not None and length == self.plan.piece_size:
            return pool.pop()  # old bytes: every block of the piece overwrites its part
        return bytearray(length)

    def recycle(self, data: bytes | bytearray) -> None:
        """The edge is done with a :class:`PieceReceived`'s buffer (checked, and copied or
        written where it goes): it may hold the next piece. A fresh 4 MiB buffer per piece
        costs its zeroing and page faults, as much as decrypting into it."""
        if (
            isinstance(data, bytearray)
            and self.plan is not None
            and len(data) == self.plan.piece_size
            and len(self._pool) < MAX_POOLED_PIECES
        ):
            self._pool.append(data)

    def _lost_before(self, nak_id: int) -> None:
        """NAKs are served in order: those before ``nak_id`` still missing were lost again
        (unless NAKed again since: the later NAK's retransmission may still come)."""
        order = self._nak_order
        while order and order[0][0] < nak_id:
            old_id, ordinal = order.popleft()
            if self._nak_id.get(ordinal) == old_id:
                self._outstanding[ordinal] = 0.0

    def _count(self, seq: int, payload: int) -> None:
        stats = self.stats
        stats.datagrams += 1
        stats.bytes += payload
        self._received_interval += 1
        if seq > self._seq_high:
            self._seq_high = seq

    def piece_checked(self, index: int, ok: bool) -> None:
        """The sink's verdict on a :class:`PieceReceived`; False re-requests the piece."""
        plan = self.plan
        if plan is None:
            raise LocalProtocolError("piece_checked() before ACCEPT")
        pos = self._pos.get(index)
        if pos is None:
            raise LocalProtocolError(f"piece {index} was not accepted")
        if pos not in self._checking:
            raise LocalProtocolError(f"piece {index} is not awaiting a check")
        self._checking.discard(pos)
        self._attempts[pos] += 1
        if ok:
            self.kept.append(index)
            self._settled += 1
        elif self._attempts[pos] >= MAX_PIECE_ATTEMPTS:
            self.stats.hash_failures += 1
            self.failed.append(index)
            self._settled += 1
        else:
            self.stats.hash_failures += 1
            ordinals = plan.ordinals(pos)
            self._remaining[pos] = len(ordinals)
            for ordinal in ordinals:
                self._have[ordinal] = 0
                if ordinal < self._scan:
                    self._outstanding[ordinal] = 0.0
        if self._settled == len(plan.pieces) and self.state is not ClientState.DONE:
            self._finish()

    def cancel(self) -> None:
        """Stop the transfer (deadline, shutdown): tells the server DONE."""
        if self.state in (ClientState.PROBING, ClientState.RECEIVING):
            self._finish()

    def _finish(self) -> None:
        self._side.send_sealed(Msg.DONE, b"")
        self.state = ClientState.DONE
        self._side.pending.append(TransferDone())

    def next_timer(self) -> float | None:
        if self.state is ClientState.PROBING:
            return self._next_probe
        if self.state is ClientState.RECEIVING:
            return self._next_report
        return None

    def handle_timer(self, now: float, caught_up: bool = True) -> list[bytes]:
        """Sends REPORTs (control) when due; returns PROBE datagrams for the data socket.

        ``caught_up``: the edge has fed every datagram its socket holds. When it has not
        (it is behind), a REPORT NAKs only blocks known lost from what it has seen (gaps,
        and retransmissions overtaken), not those merely late (the tail after the first
        pass, or a retransmission not seen yet): they may be waiting in the socket."""
        if self.state is ClientState.PROBING:
            if now < self._next_probe:
                return []
            self._next_probe = now + PROBE_INTERVAL
            return [self._seal_probe()]
        if self.state is not ClientState.RECEIVING or now < self._next_report:
            return []
        self._next_report = now + REPORT_INTERVAL
        self._report(now, caught_up)
        return []

    def _seal_probe(self) -> bytes:
        assert self._probe is not None
        return bytes(self._probe.seal_datagram(DGRAM_PROBE, 0, self.session_id, 0, b""))

    def _report(self, now: float, caught_up: bool = True) -> None:
        plan = self.plan
        assert plan is not None
        # Gap detection: first-pass blocks arrive in ordinal order, so a missing ordinal well
        # below the highest first-pass one seen was lost (Tsunami's retransmit requests).
        horizon = self._first_high - REORDER_SLACK
        pass_over = self._pass_done_at is not None and now >= self._pass_done_at
        if self._pass_done and pass_over and caught_up:
            horizon = plan.total
        if horizon > self._scan:
            have = self._have
            for ordinal in range(self._scan, min(horizon, plan.total)):
                if not have[ordinal]:
                    self._outstanding[ordinal] = 0.0
            self._scan = min(horizon, plan.total)
        echo = max(1, int(now * 1e6))
        naks: list[int] = []
        for ordinal, due in self._outstanding.items():
            # due 0.0: known lost; later: NAKed before and not seen since (maybe late)
            if due <= now and (caught_up or due == 0.0):
                naks.append(ordinal)
                if len(naks) >= MAX_NAKS_PER_REPORT:
                    break
        for ordinal in naks:
            self._outstanding[ordinal] = now + RENAK_TIMEOUT
            self._nak_id[ordinal] = self._next_nak_id
            self._nak_first.setdefault(ordinal, self._next_nak_id)
            self._nak_order.append((self._next_nak_id, ordinal))
            self._nak_at[ordinal] = echo
            self._next_nak_id += 1
        # u32 on the wire: only a server sealing absurd seqs (a compromised member) gets
        # near it, and it then reads ~100% loss and slows down.
        expected = min(0xFFFFFFFF, max(0, self._seq_high - self._seq_high_reported))
        received = min(self._received_interval, expected)
        self._seq_high_reported = self._seq_high
        self._received_interval = 0
        body = REPORT.pack(echo, max(0, self._seq_high), expected, received, len(naks))
        self._side.send_sealed(Msg.REPORT, body + pack_u32s(naks))
        self.stats.naks += len(naks)
        self.stats.reports += 1
