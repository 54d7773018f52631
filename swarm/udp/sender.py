"""The server's machine (the sender), sans-IO: authenticates a client, then sends the pieces
it asked for as paced, sealed datagrams and serves its NAKs.

The edge feeds control bytes to :meth:`ServerSession.receive_control`, this session's
datagrams to :meth:`~ServerSession.receive_datagram`, and asks
:meth:`~ServerSession.handle_timer_batches` for what is due at the paced rate: batches of
equal-size datagrams sealed back to back in one buffer, which one ``sendmsg`` with
``UDP_SEGMENT`` turns into MTU-sized datagrams in the kernel. Nothing here runs once per
datagram but the sealing itself.
"""

from __future__ import annotations

import enum
import hmac
import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from swarm.udp.control import ControlChannel
from swarm.udp.crypto import AESGCM, FleetKey, InvalidTag, Sealer, SessionKeys, nonce
from swarm.udp.events import (
    Authenticated,
    Event,
    NeedPieces,
    PathValidated,
    PeerError,
    RequestReceived,
    TransferDone,
)
from swarm.udp.rate import MIN_LOSS_SAMPLE, MIN_RATE_BPS, Pacer, adapt_rate, start_rate
from swarm.udp.wire import (
    ACCEPT,
    BYE,
    DGRAM,
    DGRAM_DATA,
    DGRAM_HEADER_LEN,
    DGRAM_OVERHEAD,
    DGRAM_PROBE,
    FLAG_RETRANSMIT,
    MAX_BLOCK_SIZE,
    MAX_CONTROL_FRAME,
    MAX_NAKS_PER_REPORT,
    MAX_PIECES_PER_REQUEST,
    MIN_BLOCK_SIZE,
    NONCE_LEN,
    PROGRESS,
    REPORT,
    REQUEST,
    VERSION_MAGIC,
    AuthenticationError,
    BlockPlan,
    LocalProtocolError,
    Msg,
    RefuseCode,
    RemoteProtocolError,
    pack_u32s,
    piece_count_for,
    u32s,
)

MAX_FREE_BUFFERS = 16


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
    rate_changes: list[tuple[float, float]] = field(default_factory=list)


@dataclass(slots=True)
class Batch:
    """``count`` sealed datagrams back to back in ``data``: each ``segment`` bytes but the
    last, which may be shorter (what ``UDP_SEGMENT`` sends as ``count`` datagrams).
    ``data`` is a view of ``buffer``, which :meth:`ServerSession.recycle` takes back."""

    data: memoryview
    segment: int
    count: int
    buffer: bytearray

    def datagrams(self) -> list[memoryview]:
        view = self.data
        seg = self.segment
        return [view[i : i + seg] for i in range(0, len(view), seg)]


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
        if len(server_nonce) != NONCE_LEN:
            raise LocalProtocolError(f"server nonce must be {NONCE_LEN} bytes")
        if rate_cap_bps < MIN_RATE_BPS:
            raise LocalProtocolError(f"rate_cap_bps must be >= {MIN_RATE_BPS}, got {rate_cap_bps}")
        if max_batch_segments < 1:
            raise LocalProtocolError(f"max_batch_segments must be >= 1, got {max_batch_segments}")
        self._side = ControlChannel()
        self._key = key
        self._nonce = server_nonce
        self.peer_ip = peer_ip
        self.rate_cap = float(rate_cap_bps)
        self.state = ServerState.AWAIT_HELLO
        self.session_id = b""
        self.data_addr: tuple[str, int] | None = None
        self.stats = SenderStats()
        self.max_batch_segments = max_batch_segments
        self.max_batch_bytes = max_batch_bytes
        self.wake_bytes = wake_bytes
        self._transcript = b""
        self._keys: SessionKeys | None = None
        self._data: Sealer | None = None
        self._probe_aead: AESGCM | None = None
        self._probe_seq = -1
        self._plan: BlockPlan | None = None
        self._requested_rate = 0.0
        self._target = 0.0
        self._pacer = Pacer(0.0, 2 * (MIN_BLOCK_SIZE + DGRAM_OVERHEAD))
        self._blocked = False
        self._cut_seq = 0
        self._grow_seq = 0
        """First datagram after slow start's last doubling (the next one waits for a
        report about it)."""
        self._expected = 0
        self._received = 0
        self._pooled = 0
        self._slow_start = True
        self._next_ordinal = 0
        self._retx: deque[int] = deque()
        self._retx_set: set[int] = set()
        self._retx_pieces: dict[int, int] = {}
        """Piece index -> how many of its blocks wait in ``_retx`` (oldest NAKed first)."""
        self._loaded: dict[int, memoryview] = {}
        self._loading: set[int] = set()
        self._prefetch = prefetch_pieces
        self._cache = max(cache_pieces, prefetch_pieces + 2)
        self._pass_done_sent = False
        self._last_echo = 0
        self._free: list[bytearray] = []
        """Batch buffers sent and given back (:meth:`recycle`): no allocation per batch."""

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
            if kind != Msg.HELLO or len(body) != len(VERSION_MAGIC) + NONCE_LEN:
                raise RemoteProtocolError("expected HELLO")
            if not body.startswith(VERSION_MAGIC):
                raise RemoteProtocolError(
                    f"unsupported protocol version (want {VERSION_MAGIC.decode()})"
                )
            self._transcript = body + self._nonce
            self._keys = self._key.session_keys(body[len(VERSION_MAGIC) :], self._nonce)
            side.send_plain(
                Msg.CHALLENGE, self._nonce + self._key.proof(b"server", self._transcript)
            )
            self.state = ServerState.AWAIT_AUTH
        elif self.state is ServerState.AWAIT_AUTH:
            if kind != Msg.AUTH or len(body) != 32:
                raise RemoteProtocolError("expected AUTH")
            expected = self._key.proof(b"client", self._transcript)
            if not hmac.compare_digest(body, expected):
                raise AuthenticationError("authentication failed: wrong fleet secret")
            keys = self._keys
            assert keys is not None
            side.send_ctl = Sealer(keys.control_s2c)
            side.recv_ctl = Sealer(keys.control_c2s)
            side.frames.limit = MAX_CONTROL_FRAME
            self._data = Sealer(keys.data_s2c)
            self._probe_aead = AESGCM(keys.data_c2s)
            self.session_id = keys.session_id
            self.state = ServerState.AWAIT_REQUEST
            side.pending.append(Authenticated(self.session_id))
        elif self.state is ServerState.AWAIT_REQUEST:
            if kind != Msg.REQUEST:
                raise RemoteProtocolError("expected REQUEST")
            body = side.open(kind, body)
            if len(body) < REQUEST.size:
                raise RemoteProtocolError("short REQUEST")
            info_hash, rate, block, count = REQUEST.unpack_from(body)
            if not 1 <= count <= MAX_PIECES_PER_REQUEST:
                raise RemoteProtocolError(f"REQUEST names {count} pieces")
            pieces = u32s(body[REQUEST.size :], count, "REQUEST pieces")
            if len(set(pieces)) != len(pieces):
                raise RemoteProtocolError("REQUEST names a piece twice")
            if not MIN_BLOCK_SIZE <= block <= MAX_BLOCK_SIZE:
                raise RemoteProtocolError(f"block size {block} out of range")
            self.state = ServerState.DECIDING
            side.pending.append(RequestReceived(info_hash.hex(), pieces, rate, block))
        elif self.state is ServerState.SENDING or self.state is ServerState.AWAIT_PATH:
            body = side.open(kind, body)
            if kind == Msg.REPORT:
                self._on_report(body, now)
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
        self._requested_rate = float(max(MIN_RATE_BPS, rate_bps))
        self._target = min(self._requested_rate, self.rate_cap)
        wire = block_size + DGRAM_OVERHEAD
        self._pacer = Pacer(start_rate(self._target, path_rtt), 2 * wire)
        self._slow_start = True
        self._grow_seq = 0
        body = ACCEPT.pack(
            piece_size,
            piece_count_for(total_size, piece_size),
            total_size,
            block_size,
            int(self._target),
            len(missing),
        ) + pack_u32s(missing)
        self._side.send_sealed(Msg.ACCEPT, body)
        self.state = ServerState.AWAIT_PATH
        self._want_pieces()

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
        assert self._plan is not None
        self.stats.reports += 1
        self._last_echo = echo
        plan = self._plan
        total = plan.total
        retx_pieces = self._retx_pieces
        for ordinal in naks:
            if ordinal >= total:
                raise RemoteProtocolError(f"NAK for block {ordinal} of {total}")
            if ordinal not in self._retx_set:
                self._retx_set.add(ordinal)
                self._retx.append(ordinal)
                piece = plan.pieces[plan.locate(ordinal)[0]]
                retx_pieces[piece] = retx_pieces.get(piece, 0) + 1
        self.stats.naks += len(naks)
        if naks:
            self._pass_done_sent = False
        # seq_high - expected: the first datagram the report's interval describes.
        if self.state is ServerState.SENDING and seq_high - expected >= self._cut_seq:
            # Reports are pooled until they hold MIN_LOSS_SAMPLE datagrams: at a low rate one
            # interval holds too few, and the rate would never move again.
            self._expected += expected
            self._received += min(received, expected)
            self._pooled += 1
            new, decreased = adapt_rate(
                self.rate,
                self._target,
                self._expected,
                self._received,
                self._pooled,
                self._slow_start,
            )
            if self._expected >= MIN_LOSS_SAMPLE:
                self._expected = self._received = self._pooled = 0
            if self._slow_start and not decreased and new > self.rate:
                # Slow start doubles once per feedback loop, as TCP's does per RTT: the
                # reports of the next round trip describe the old rate, and doubling on
                # each (every 50 ms) took a far session from an eighth of its 1 Gbit
                # target to all of it before the first loss came back from behind a
                # 200 Mbit link (0.4-0.9 MB/s goodput, RTT bloated to 0.5 s).
                if seq_high - expected < self._grow_seq:
                    new = self.rate
                else:
                    self._grow_seq = self._data.counter if self._data is not None else 0
            if decreased:
                self._slow_start = False
                # One cut per feedback loop (NewReno's `recover`, RFC 6582): reports about
                # datagrams sent before this cut describe the old rate; ignore them.
                self._cut_seq = self._data.counter if self._data is not None else 0
                self._expected = self._received = self._pooled = 0
            if new != self.rate:
                self.stats.rate_changes.append((now, new))
            self.rate = new
        self._send_progress(echo)
        self._want_pieces()

    def _send_progress(self, echo: int) -> None:
        # pass_done: every block was sent once and every NAK received so far (up to the
        # report stamped `served`) was served; the receiver NAKs what is still missing.
        done = self._plan is not None and self._next_ordinal >= self._plan.total and not self._retx
        served = self._last_echo if done else 0
        stats = self.stats
        body = PROGRESS.pack(echo, served, int(self.rate), stats.datagrams, stats.bytes, done)
        self._side.send_sealed(Msg.PROGRESS, body)
        self._pass_done_sent = done

    # data channel
    def receive_datagram(self, data: bytes | memoryview, addr: tuple[str, int]) -> bool:
        """A datagram whose session id is ours. False (and counted) if it is not authentic."""
        if (
            self._probe_aead is None
            or len(data) != DGRAM_OVERHEAD
            or data[0] != DGRAM_PROBE
            or data[2:10] != self.session_id
        ):
            self.stats.forged += 1
            return False
        seq = int.from_bytes(data[10:18], "big")
        try:
            self._probe_aead.decrypt(
                nonce(seq), bytes(data[DGRAM_HEADER_LEN:]), bytes(data[:DGRAM_HEADER_LEN])
            )
        except InvalidTag:
            self.stats.forged += 1
            return False
        if seq <= self._probe_seq:
            return True  # a duplicate or replayed probe: authentic but stale
        self._probe_seq = seq
        if addr[0] != self.peer_ip:
            # Sealed with our key but from another IP: a replay by someone on the path. Data
            # only ever goes to the IP whose TCP handshake proved it can receive there.
            self.stats.forged += 1
            return False
        if self.data_addr != addr and self.state in (ServerState.AWAIT_PATH, ServerState.SENDING):
            first = self.data_addr is None
            self.data_addr = addr
            if first:
                self._side.send_sealed(Msg.PATH_OK, b"")
                self.state = ServerState.SENDING
                self._side.pending.append(PathValidated(addr))
        return True

    def piece_loaded(self, index: int, data: bytes | memoryview) -> None:
        if self._plan is None:
            raise LocalProtocolError("piece_loaded() before accept()")
        if len(data) != self._plan.piece_length(index):
            raise LocalProtocolError(
                f"piece {index} is {len(data)} bytes, expected {self._plan.piece_length(index)}"
            )
        self._loading.discard(index)
        self._loaded[index] = memoryview(data)
        self._blocked = False
        self._evict()

    def _evict(self) -> None:
        if len(self._loaded) <= self._cache:
            return
        plan = self._plan
        assert plan is not None
        needed = set(self._retx_pieces)
        if self._next_ordinal < plan.total:
            pos = plan.locate(self._next_ordinal)[0]
            needed.update(plan.pieces[pos : pos + self._prefetch + 1])
        for index in list(self._loaded):
            if len(self._loaded) <= self._cache:
                break
            if index not in needed:
                del self._loaded[index]

    def _want_pieces(self) -> None:
        plan = self._plan
        if plan is None or self.state is ServerState.DONE:
            return
        want = list(itertools.islice(self._retx_pieces, self._cache))
        if self._next_ordinal < plan.total:
            pos = plan.locate(self._next_ordinal)[0]
            want.extend(plan.pieces[pos : pos + self._prefetch + 1])
        new = []
        for index in want:
            if index not in self._loaded and index not in self._loading:
                self._loading.add(index)
                new.append(index)
        if new:
            self._side.pending.append(NeedPieces(tuple(new)))

    def recycle(self, batch: Batch) -> None:
        """The edge has sent ``batch`` and keeps no view of it: its buffer may carry the
        next batch (allocating and zeroing 64 KiB per batch cost more than sealing it)."""
        batch.data.release()
        plan = self._plan
        if (
            plan is not None
            and len(self._free) < MAX_FREE_BUFFERS
            and len(batch.buffer) == self._buffer_size(plan)
        ):
            self._free.append(batch.buffer)

    def _buffer_size(self, plan: BlockPlan) -> int:
        wire_block = plan.block_size + DGRAM_OVERHEAD
        return max(1, min(self.max_batch_segments, self.max_batch_bytes // wire_block)) * wire_block

    def next_timer(self, now: float) -> float | None:
        """When :meth:`handle_timer_batches` has a batch to send (a batch's worth of tokens,
        or a full bucket); None while idle or blocked."""
        if self.state is not ServerState.SENDING or self._plan is None or self.rate <= 0:
            return None
        if self._blocked or (not self._retx and self._next_ordinal >= self._plan.total):
            return None
        self._pacer.refill(now)
        return self._pacer.when(now, max(self._plan.block_size + DGRAM_OVERHEAD, self.wake_bytes))

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

        The first pass is sealed in runs of one piece's full-size blocks straight into the
        batch buffer: per datagram, one header ``pack_into`` and one AEAD call."""
        plan = self._plan
        sealer = self._data
        if self.state is not ServerState.SENDING or plan is None or sealer is None:
            return []
        pacer = self._pacer
        tokens = pacer.refill(now)
        batches: list[Batch] = []
        sid = self.session_id
        loaded = self._loaded
        retx = self._retx
        pieces = plan.pieces
        block = plan.block_size
        wire_block = block + DGRAM_OVERHEAD
        capacity = self._buffer_size(plan) // wire_block
        pack_into = DGRAM.pack_into
        encrypt_into = sealer.aead.encrypt_into
        buf: bytearray | None = None
        view = memoryview(b"")
        segment = used = count = 0
        sent = retransmits = sent_bytes = 0
        retx_waits = False
        free = self._free
        while sent < limit:
            if retx and not retx_waits:
                ordinal, flags = retx[0], FLAG_RETRANSMIT
            elif self._next_ordinal < plan.total:
                ordinal, flags = self._next_ordinal, 0
            else:
                if retx_waits:
                    self._blocked = True
                elif not self._pass_done_sent:
                    self._send_progress(0)
                break
            pos, offset, length = plan.locate(ordinal)
            piece = loaded.get(pieces[pos])
            if piece is None:
                self._want_pieces()
                if flags:
                    # The piece of the next retransmission is loading (it left the cache):
                    # meanwhile the first pass goes on, rather than the link going idle.
                    retx_waits = True
                    continue
                # Wait for piece_loaded() (next_timer is None meanwhile: no busy loop).
                self._blocked = True
                break
            size = length + DGRAM_OVERHEAD
            if tokens < size - 1:  # 1 byte of slack for float rounding
                break
            if buf is not None and (size > segment or count >= capacity):
                batches.append(Batch(view[:used], segment, count, buf))
                buf = None
                if len(batches) >= max_batches:
                    break
            if buf is None:
                buf = free.pop() if free else bytearray(capacity * wire_block)
                view = memoryview(buf)
                segment, used, count = size, 0, 0
            if flags or length != block:
                # One datagram: a retransmission, or a piece's short last block.
                tokens -= size
                if flags:
                    retx.popleft()
                    self._retx_set.discard(ordinal)
                    piece_index = pieces[pos]
                    left = self._retx_pieces[piece_index] - 1
                    if left:
                        self._retx_pieces[piece_index] = left
                    else:
                        del self._retx_pieces[piece_index]
                    retransmits += 1
                else:
                    self._next_ordinal += 1
                used += sealer.seal_datagram_into(
                    view[used:], DGRAM_DATA, flags, sid, ordinal, piece[offset : offset + length]
                )
                count += 1
                sent += 1
                sent_bytes += size
                if length != block:
                    # A short datagram can only end a GSO batch.
                    batches.append(Batch(view[:used], segment, count, buf))
                    buf = None
                    if len(batches) >= max_batches:
                        break
                continue
            # A run of first-pass full blocks of this piece, as many as tokens, the batch
            # and the piece allow (a piece's last block may be short: not in the run).
            full_end = plan.ends[pos] - (1 if plan.lengths[pos] % block else 0)
            run = min(
                full_end - ordinal,
                int((tokens + 1) // wire_block),
                capacity - count,
                limit - sent,
            )
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
            self._next_ordinal = ordinal
            tokens -= run * wire_block
            count += run
            sent += run
            sent_bytes += run * wire_block
        if buf is not None:
            if count:
                batches.append(Batch(view[:used], segment, count, buf))
            else:
                free.append(buf)
        pacer.tokens = tokens
        stats = self.stats
        stats.datagrams += sent
        stats.bytes += sent_bytes
        stats.retransmits += retransmits
        stats.batches += len(batches)
        if sent and self._next_ordinal < plan.total:
            pos = plan.locate(self._next_ordinal)[0]
            ahead = pieces[pos : pos + self._prefetch + 1]
            if any(i not in loaded and i not in self._loading for i in ahead):
                self._want_pieces()
                self._evict()
        return batches
