"""The server's machine (the sender), sans-IO: authenticates a client, then sends the pieces
it asked for as paced, sealed datagrams and serves its NAKs.

The edge feeds control bytes to :meth:`ServerSession.receive_control`, this session's
datagrams to :meth:`~ServerSession.receive_datagram`, and asks
:meth:`~ServerSession.handle_timer_batches` for what is due at the paced rate: batches of
equal-size datagrams sealed back to back in one buffer, which one ``sendmsg`` with
``UDP_SEGMENT`` turns into MTU-sized datagrams in the kernel. Nothing here runs once per
datagram but the sealing itself.

The handshake and the PROBE check: :mod:`swarm.udp.handshake`; which blocks go out and their
sealing: :mod:`swarm.udp.blast`; what is left to send: :mod:`swarm.udp.schedule`; batch
buffers: :mod:`swarm.udp.batch`.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from swarm.udp.batch import Batch, BatchPool, buffer_size
from swarm.udp.blast import fill_batches
from swarm.udp.control import ControlChannel
from swarm.udp.crypto import AESGCM, FleetKey, Sealer
from swarm.udp.events import (
    Authenticated,
    Event,
    NeedPieces,
    PathValidated,
    PeerError,
    TransferDone,
)
from swarm.udp.handshake import Probe, ProbeCheck, ServerHandshake
from swarm.udp.rate import MIN_RATE_BPS, Pacer, RateFeedback, start_rate
from swarm.udp.request import pack_accept, parse_request
from swarm.udp.schedule import SendSchedule
from swarm.udp.wire import (
    BYE,
    DGRAM_OVERHEAD,
    MAX_NAKS_PER_REPORT,
    MIN_BLOCK_SIZE,
    PROGRESS,
    REPORT,
    BlockPlan,
    LocalProtocolError,
    Msg,
    RefuseCode,
    RemoteProtocolError,
    u32s,
)


class ServerState(enum.Enum):
    AWAIT_HELLO = "await hello"
    AWAIT_AUTH = "await auth"
    AWAIT_REQUEST = "await request"
    DECIDING = "deciding"
    AWAIT_PATH = "await path"
    SENDING = "sending"
    DONE = "done"


@dataclass
class SenderStats:
    datagrams: int = 0
    bytes: int = 0
    """Wire bytes of data datagrams (UDP payload, header and tag included)."""
    retransmits: int = 0
    naks: int = 0
    forged: int = 0
    reports: int = 0
    batches: int = 0
    skipped: int = 0
    """Pieces the client skipped (SKIP)."""
    rate_changes: list[tuple[float, float]] = field(default_factory=list)


class ServerSession:
    """One control connection on the server: authenticates, then sends what was asked.

    Until a PROBE sealed with this session's key arrives from the control connection's IP,
    nothing at all is sent by UDP (:attr:`data_addr` is None), so an unauthenticated
    address receives 0 bytes, well inside the 3x anti-amplification budget of RFC 9000
    section 8.

    ``max_batch_segments``/``max_batch_bytes`` bound a :class:`Batch` (the edge's GSO
    limits; 1 segment without GSO). :meth:`next_timer` wakes the edge once ``wake_bytes``
    of tokens are there (or the pacer's 4 ms bucket is full, at low rates), not once per
    datagram; 0 means one datagram.
    """

    def __init__(
        self,
        key: FleetKey,
        server_nonce: bytes,
        peer_ip: str,
        rate_cap_bps: int,
        prefetch_pieces: int = 2,
        cache_pieces: int = 8,
        max_batch_segments: int = 1,
        max_batch_bytes: int = 65000,
        wake_bytes: int = 0,
    ) -> None:
        self._handshake = ServerHandshake(key, server_nonce)
        if rate_cap_bps < MIN_RATE_BPS:
            raise LocalProtocolError(f"rate_cap_bps must be >= {MIN_RATE_BPS}, got {rate_cap_bps}")
        if max_batch_segments < 1:
            raise LocalProtocolError(f"max_batch_segments must be >= 1, got {max_batch_segments}")
        self._side = ControlChannel()
        self.peer_ip = peer_ip
        self.rate_cap = float(rate_cap_bps)
        self.state = ServerState.AWAIT_HELLO
        self.session_id = b""
        self.data_addr: tuple[str, int] | None = None
        self.stats = SenderStats()
        self.max_batch_segments = max_batch_segments
        self.max_batch_bytes = max_batch_bytes
        self.wake_bytes = wake_bytes
        self._data: Sealer | None = None
        self._probes: ProbeCheck | None = None
        self._early_path: tuple[str, int] | None = None
        """Where an authentic PROBE came from before accept() (see ``FIRST_PROBE_AFTER``)."""
        self._plan: BlockPlan | None = None
        self._requested_rate = 0.0
        self._target = 0.0
        self._pacer = Pacer(0.0, 2 * (MIN_BLOCK_SIZE + DGRAM_OVERHEAD))
        self._blocked = False
        self._feedback = RateFeedback()
        self._prefetch_pieces = prefetch_pieces
        self._cache_pieces = cache_pieces
        self._schedule: SendSchedule | None = None
        """What is left to send and the pieces it needs; set by :meth:`accept`."""
        self._pass_done_sent = False
        self._last_echo = 0
        self._pool = BatchPool()

    # public surface shared with the client
    def events(self) -> list[Event]:
        return self._side.events()

    def data_to_send(self) -> bytes:
        return self._side.data_to_send()

    def send_error(self, reason: str) -> None:
        self._side.send_error(reason)
        self.state = ServerState.DONE

    @property
    def closed(self) -> bool:
        return self._side.closed or self.state is ServerState.DONE

    @property
    def rate(self) -> float:
        """The current sending rate, bit/s."""
        return self._pacer.rate

    @rate.setter
    def rate(self, value: float) -> None:
        self._pacer.rate = value

    @property
    def block_size(self) -> int | None:
        return self._plan.block_size if self._plan is not None else None

    # control channel
    def receive_control(self, data: bytes, now: float) -> None:
        if self.state is ServerState.DONE:
            return
        for kind, body in self._side.frames.feed(data):
            self._handle(kind, body, now)

    def _handle(self, kind: int, body: bytes, now: float) -> None:
        side = self._side
        if kind == Msg.ERROR:
            side.pending.append(PeerError(side.error_frame(body)))
            self.state = ServerState.DONE
            return
        if self.state is ServerState.AWAIT_HELLO:
            side.send_plain(Msg.CHALLENGE, self._handshake.challenge(kind, body))
            self.state = ServerState.AWAIT_AUTH
        elif self.state is ServerState.AWAIT_AUTH:
            keys = self._handshake.check_auth(kind, body)
            side.use_keys(keys.control_s2c, keys.control_c2s)
            self._data = Sealer(keys.data_s2c)
            self._probes = ProbeCheck(AESGCM(keys.data_c2s), keys.session_id, self.peer_ip)
            self.session_id = keys.session_id
            self.state = ServerState.AWAIT_REQUEST
            side.pending.append(Authenticated(self.session_id))
        elif self.state is ServerState.AWAIT_REQUEST:
            if kind != Msg.REQUEST:
                raise RemoteProtocolError("expected REQUEST")
            request = parse_request(side.open(kind, body))
            self.state = ServerState.DECIDING
            side.pending.append(request)
        elif self.state is ServerState.SENDING or self.state is ServerState.AWAIT_PATH:
            body = side.open(kind, body)
            if kind == Msg.REPORT:
                self._on_report(body, now)
            elif kind == Msg.SKIP:
                self._on_skip(body)
            elif kind == Msg.DONE:
                side.send_sealed(Msg.BYE, BYE.pack(self.stats.datagrams, self.stats.bytes))
                side.pending.append(TransferDone())
                self.state = ServerState.DONE
            else:
                raise RemoteProtocolError(f"unexpected message type {kind}")
        else:
            raise RemoteProtocolError(f"unexpected message type {kind} in {self.state.value}")

    def accept(
        self,
        piece_size: int,
        total_size: int,
        pieces: Sequence[int],
        unavailable: Iterable[int],
        rate_bps: int,
        block_size: int,
        path_rtt: float | None = None,
    ) -> None:
        """Answer the request: send ``pieces`` (those we have, in request order) in blocks
        of ``block_size`` (at most what the client asked for, at most what our path MTU
        allows: the edge decides), starting at :func:`~swarm.udp.rate.start_rate` for the
        control connection's round trip ``path_rtt`` (seconds, if the edge knows it)."""
        if self.state is not ServerState.DECIDING:
            raise LocalProtocolError(f"accept() in state {self.state.value}")
        missing = tuple(unavailable)
        self._plan = BlockPlan(pieces, piece_size, total_size, block_size)
        self._schedule = SendSchedule(self._plan, self._prefetch_pieces, self._cache_pieces)
        self._requested_rate = float(max(MIN_RATE_BPS, rate_bps))
        self._target = min(self._requested_rate, self.rate_cap)
        wire = block_size + DGRAM_OVERHEAD
        capped = self.rate_cap < self._requested_rate
        self._pacer = Pacer(start_rate(self._target, path_rtt, capped), 2 * wire)
        self._feedback = RateFeedback()
        body = pack_accept(piece_size, total_size, block_size, int(self._target), missing)
        self._side.send_sealed(Msg.ACCEPT, body)
        self.state = ServerState.AWAIT_PATH
        self._want_pieces()
        if self._early_path is not None:
            self._path(self._early_path)

    def refuse(self, code: RefuseCode, reason: str) -> None:
        if self.state is not ServerState.DECIDING:
            raise LocalProtocolError(f"refuse() in state {self.state.value}")
        self._side.send_sealed(Msg.REFUSE, bytes([code]) + reason.encode()[:200])
        self.state = ServerState.DONE

    def set_rate_cap(self, rate_cap_bps: float) -> None:
        """Lower (or raise) this session's cap: the server divides its cap among sessions."""
        self.rate_cap = max(float(MIN_RATE_BPS), rate_cap_bps)
        if self._plan is not None:
            self._target = min(self._requested_rate, self.rate_cap)
            self.rate = min(self.rate, self._target)

    def _on_report(self, body: bytes, now: float) -> None:
        if len(body) < REPORT.size:
            raise RemoteProtocolError("short REPORT")
        echo, seq_high, expected, received, count = REPORT.unpack_from(body)
        if count > MAX_NAKS_PER_REPORT:
            raise RemoteProtocolError(f"REPORT with {count} NAKs")
        naks = u32s(body[REPORT.size :], count, "REPORT naks")
        schedule = self._schedule
        assert schedule is not None
        self.stats.reports += 1
        self._last_echo = echo
        total = schedule.plan.total
        for ordinal in naks:
            if ordinal >= total:
                raise RemoteProtocolError(f"NAK for block {ordinal} of {total}")
            schedule.nak(ordinal)
        self.stats.naks += len(naks)
        if naks:
            self._pass_done_sent = False
        if self.state is ServerState.SENDING:
            next_seq = self._data.counter if self._data is not None else 0
            new = self._feedback.on_report(
                self.rate, self._target, seq_high, expected, received, next_seq
            )
            if new is not None:
                if new != self.rate:
                    self.stats.rate_changes.append((now, new))
                self.rate = new
        self._send_progress(echo)
        self._want_pieces()

    def _on_skip(self, body: bytes) -> None:
        schedule = self._schedule
        if schedule is None or len(body) < 4:
            raise RemoteProtocolError("bad SKIP")
        (count,) = struct.unpack_from("!I", body)
        if count > len(schedule.plan.pieces):
            raise RemoteProtocolError(f"SKIP of {count} pieces")
        positions = set()
        for piece in u32s(body[4:], count, "SKIP"):
            pos = schedule.plan.position.get(piece)
            if pos is None:
                raise RemoteProtocolError(f"SKIP of piece {piece}, not accepted")
            positions.add(pos)
        schedule.skip(positions)
        self.stats.skipped = len(schedule.skipped)
        self._blocked = False  # it may have waited for a skipped piece to load

    def _send_progress(self, echo: int) -> None:
        # pass_done: every block was sent once and every NAK received so far (up to the
        # report stamped `served`) was served; the receiver NAKs what is still missing.
        done = self._schedule is not None and self._schedule.done
        served = self._last_echo if done else 0
        stats = self.stats
        body = PROGRESS.pack(echo, served, int(self.rate), stats.datagrams, stats.bytes, done)
        self._side.send_sealed(Msg.PROGRESS, body)
        self._pass_done_sent = done

    # data channel
    def receive_datagram(self, data: bytes | memoryview, addr: tuple[str, int]) -> bool:
        """A datagram whose session id is ours. False (and counted) if it is not authentic
        (:class:`~swarm.udp.handshake.ProbeCheck`)."""
        probes = self._probes
        verdict = Probe.FORGED if probes is None else probes.check(data, addr)
        if verdict is Probe.FORGED:
            self.stats.forged += 1
            return False
        if verdict is Probe.STALE:
            return True
        if self.state in (ServerState.AWAIT_REQUEST, ServerState.DECIDING):
            self._early_path = addr  # sent with AUTH: the path is validated on accept()
        elif self.data_addr != addr and self.state in (
            ServerState.AWAIT_PATH,
            ServerState.SENDING,
        ):
            self._path(addr)
        return True

    def _path(self, addr: tuple[str, int]) -> None:
        """``addr`` proved it receives for this session: data goes there (from now on)."""
        first = self.data_addr is None
        self.data_addr = addr
        if first:
            self._side.send_sealed(Msg.PATH_OK, b"")
            self.state = ServerState.SENDING
            self._side.pending.append(PathValidated(addr))

    def piece_loaded(self, index: int, data: bytes | memoryview) -> None:
        schedule = self._schedule
        if schedule is None:
            raise LocalProtocolError("piece_loaded() before accept()")
        schedule.add(index, data)
        self._blocked = False
        schedule.evict()

    def _want_pieces(self) -> None:
        schedule = self._schedule
        if schedule is None or self.state is ServerState.DONE:
            return
        new = schedule.want()
        if new:
            self._side.pending.append(NeedPieces(tuple(new)))

    def recycle(self, batch: Batch) -> None:
        """The edge has sent ``batch`` and keeps no view of it: its buffer may carry the
        next batch (allocating and zeroing 64 KiB per batch cost more than sealing it)."""
        plan = self._plan
        self._pool.recycle(batch, self._buffer_size(plan) if plan is not None else None)

    def _buffer_size(self, plan: BlockPlan) -> int:
        return buffer_size(plan.block_size, self.max_batch_segments, self.max_batch_bytes)

    def next_timer(self, now: float) -> float | None:
        """When :meth:`handle_timer_batches` has a batch to send (a batch's worth of tokens,
        or a full bucket); None while idle or blocked."""
        schedule = self._schedule
        if self.state is not ServerState.SENDING or schedule is None or self.rate <= 0:
            return None
        if self._blocked or schedule.done:
            return None
        self._pacer.refill(now)
        wire_block = schedule.plan.block_size + DGRAM_OVERHEAD
        return self._pacer.when(now, max(wire_block, self.wake_bytes))

    def handle_timer(self, now: float, limit: int = 64) -> list[memoryview]:
        """Datagrams due by ``now`` (at most ``limit``), one by one: a convenience over
        :meth:`handle_timer_batches` for edges without GSO, and for tests."""
        out: list[memoryview] = []
        for batch in self.handle_timer_batches(now, limit):
            out.extend(batch.datagrams())
        return out

    def handle_timer_batches(
        self, now: float, limit: int = 1 << 16, max_batches: int = 1 << 16
    ) -> list[Batch]:
        """Datagrams due by ``now`` at the paced rate (at most ``limit`` datagrams in
        ``max_batches`` batches), for :attr:`data_addr`, as :class:`Batch` es. Empty until
        the UDP path is validated. Tokens left over stay for the next call.

        The datagrams are chosen and sealed by :func:`~swarm.udp.blast.fill_batches`."""
        schedule = self._schedule
        sealer = self._data
        if self.state is not ServerState.SENDING or schedule is None or sealer is None:
            return []
        plan = schedule.plan
        pacer = self._pacer
        tokens = pacer.refill(now)
        wire_block = plan.block_size + DGRAM_OVERHEAD
        capacity = self._buffer_size(plan) // wire_block
        out = self._pool.writer(capacity, wire_block, max_batches)
        fill = fill_batches(
            schedule, sealer, self.session_id, tokens, out, limit, self._want_pieces
        )
        if fill.blocked:
            self._blocked = True
        elif fill.drained and not self._pass_done_sent:
            self._send_progress(0)
        batches = out.finish()
        pacer.tokens = fill.tokens
        stats = self.stats
        stats.datagrams += fill.sent
        stats.bytes += fill.sent_bytes
        stats.retransmits += fill.retransmits
        stats.batches += len(batches)
        if fill.sent and schedule.short_ahead():
            self._want_pieces()
            schedule.evict()
        return batches
