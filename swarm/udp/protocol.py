"""Tsunami-style transfer, sans-IO: a TCP control channel and rate-paced UDP data.

Tsunami UDP (Meier, Indiana University, 2002) showed that a sender pacing large UDP blocks
at a target rate, with retransmit requests over a TCP control channel, fills a long fat
link that one TCP flow cannot. It also showed what to avoid: a default shared secret,
plaintext data, a client that names any path and any rate. Here the secret has no default,
every byte after the handshake is sealed with AES-256-GCM under per-session keys, a request
names an info-hash, and the server's cap bounds the rate.

Nothing in this module touches a socket, a clock or an RNG: nonces and session times are
passed in, bytes go in and out, and the asyncio edges (``server.py``, ``client.py``) do the
I/O. Bad input from the peer on the *control* channel raises :class:`RemoteProtocolError`
(the edge sends ``ERROR`` and closes). A bad *datagram* never raises: UDP sources are
spoofable, so raising would let anyone kill a session; it is dropped and counted.

Handshake (control channel, frames ``u32 length | u8 type | body``)::

    C -> S  HELLO      "SWUDP1" | client_nonce[32]
    S -> C  CHALLENGE  server_nonce[32] | HMAC(auth_key, "server" | transcript)
    C -> S  AUTH       HMAC(auth_key, "client" | transcript)        (client checks S first)
    C -> S  REQUEST    info_hash[20] | rate u64 | block u32 | n u32 | piece u32 * n   (sealed)
    S -> C  ACCEPT     piece_size u32 | piece_count u32 | size u64 | block u32 | rate u64
                       | n u32 | unavailable piece u32 * n                           (sealed)
         or REFUSE     code u8 | reason                                              (sealed)
    C => S  PROBE      datagrams from the client's data socket until PATH_OK
    S -> C  PATH_OK                                                                  (sealed)
    S => C  DATA       paced datagrams
    C -> S  REPORT     echo u64 | seq_high u64 | expected u32 | received u32
                       | n u32 | nak u32 * n                                         (sealed)
    S -> C  PROGRESS   echo u64 | served u64 | rate u64 | datagrams u64 | bytes u64
                       | pass_done u8                                               (sealed)
    C -> S  DONE                                                                     (sealed)
    S -> C  BYE        datagrams u64 | bytes u64                                     (sealed)

``transcript = HELLO body | server_nonce``. The distinct labels stop a proof of one side
being reflected as the other's. Keys come from HKDF-SHA256 (RFC 5869) over the fleet
secret, salted with both nonces, so every session has fresh keys and a fresh session id
even if one side's nonce repeats. Sealed control frames use a per-direction key and an
implicit frame counter as nonce (TCP is ordered), so a reordered, replayed or injected
frame fails its tag.

Datagram (both directions)::

    type u8 | flags u8 | session_id[8] | seq u64 | ordinal u32 | AES-GCM(payload) | tag[16]

The 22-byte header is the AEAD's associated data; ``seq`` (unique per direction and session)
is the nonce. ``ordinal`` numbers the blocks of the accepted pieces in request order, which
both sides compute from REQUEST and ACCEPT (:class:`BlockPlan`), so a datagram carries no
piece index or offset. The receiver infers a loss from a gap in first-pass ordinals, NAKs it
in the next REPORT, and re-NAKs it if the retransmission is lost too.

Rate rule (:func:`adapt_rate`): the receiver reports, every :data:`REPORT_INTERVAL`, how
many datagrams the sender's ``seq`` says were sent in the interval and how many arrived;
above 2% loss the sender cuts its rate to the delivered rate, below 0.5% it speeds up by 4%
per interval, in between it holds; never above min(client's ask, server's cap).
"""

from __future__ import annotations

import bisect
import enum
import hmac
import itertools
import struct
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

# -- constants ---------------------------------------------------------------------------------

VERSION_MAGIC: Final = b"SWUDP1"
NONCE_LEN: Final = 32
TAG_LEN: Final = 16
"""AES-GCM tag length (NIST SP 800-38D: the full 128 bits; truncation buys nothing here)."""
HASH_LEN: Final = 20
"""Info-hash length (BEP 3 SHA-1 info-hash, hex in our APIs)."""
MIN_SECRET_LEN: Final = 16
"""Shortest fleet secret accepted: 128 bits, so an offline guess of the secret from a
recorded handshake is infeasible. There is no default secret: without one UDP is off."""

DEFAULT_PORT: Final = 7881
"""TCP control and UDP data share this port number (the daemon's BitTorrent port is 6881)."""

DEFAULT_BLOCK_SIZE: Final = 32 * 1024
"""Payload bytes per datagram. Python spends microseconds per datagram, so small datagrams
cap goodput by CPU (bench/udp.py, 500 Mbit tbf link, 1500 MTU: 1400 B -> 35% of the link,
8 KiB -> 84%, 32 KiB -> 82%, 60 KiB -> 92%). Blocks above the MTU are IP-fragmented: one
lost fragment loses the block, and incomplete blocks hold the receiver's reassembly memory
(``net.ipv4.ipfrag_high_thresh``, 4 MiB) for ``ipfrag_time`` (30 s), so under sustained
loss raise the one and lower the other, use a jumbo MTU (9001 inside an AWS VPC) or ~1400."""
MIN_BLOCK_SIZE: Final = 512
MAX_BLOCK_SIZE: Final = 65507 - 22 - TAG_LEN
"""Largest payload in one IPv4 UDP datagram (65507) less our header and tag."""
MAX_PIECE_SIZE: Final = 64 << 20
"""Largest piece accepted from an ACCEPT: a receiver buffers whole pieces."""
MAX_PIECES_PER_REQUEST: Final = 1 << 18
MAX_CONTROL_FRAME: Final = 4 + 4 * MAX_PIECES_PER_REQUEST + 64
"""Largest control frame body (a REQUEST naming the most pieces)."""
MAX_PREAUTH_FRAME: Final = 128
"""Largest frame before authentication: an unauthenticated peer cannot make us buffer much."""

REPORT_INTERVAL: Final = 0.05
"""Seconds between receiver REPORTs: the rate's control period. Short enough to react to a
queue filling within a few intervals, long enough for ~40 datagrams per sample at 32 KiB and
250 Mbit/s, so a loss fraction of a few percent is measurable."""
PROBE_INTERVAL: Final = 0.1
"""Seconds between PROBE datagrams until the server confirms the UDP path (PATH_OK)."""
MAX_NAKS_PER_REPORT: Final = 8192
REORDER_SLACK: Final = 16
"""First-pass ordinals a block may arrive late by before it is NAKed: reordering is rare on
one path, and a spurious NAK costs one duplicate block."""
END_GRACE: Final = 0.02
"""After the sender's first pass ends, seconds before NAKing the tail (datagrams sent just
before PASS_DONE may still be in flight)."""
RENAK_TIMEOUT: Final = 1.0
"""Seconds after which a NAKed block that did not arrive is NAKed again regardless. Lost
retransmissions are found sooner and without a timer: the sender serves NAKs in order, so
a retransmission arriving for a later NAK reveals the loss of an earlier one, and the
sender's PROGRESS says when every NAK it was sent has been served. This timeout is only a
backstop: a timer tight enough to matter would fire while a retransmission waits in a
bottleneck's queue (100 ms on netlab's links) and send every such block twice."""
MAX_PIECE_ATTEMPTS: Final = 3
"""Times a piece is received before the receiver gives up on it (its hash failed each time):
a sender with a corrupt piece must not keep us in a loop; another source will provide it."""

LOSS_HIGH: Final = 0.02
LOSS_LOW: Final = 0.005
RATE_INCREASE: Final = 1.04
MAX_DECREASE: Final = 0.25
MIN_RATE_BPS: Final = 1_000_000
MIN_LOSS_SAMPLE: Final = 8
START_FRACTION: Final = 0.125
"""The first rate is this fraction of the target, then doubles per clean report until the
first loss. Tsunami starts at the target, but a blast far above the bottleneck loses IP
fragments in bulk, and incomplete datagrams fill the receiver's reassembly memory
(``net.ipv4.ipfrag_high_thresh``, 4 MiB by default) until every datagram is dropped."""
BURST_SECONDS: Final = 0.004
"""Token-bucket depth of the pacer in seconds at the current rate (at least 2 datagrams):
an event loop wakes every ~1 ms, so 4 ms of tokens absorbs a late wake without bursting
past a tbf bucket (netlab's 500 Mbit bucket holds ~4 ms)."""


class ProtocolError(Exception):
    """Base of the transfer protocol's errors."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something we cannot accept; the message is safe to send back."""


class LocalProtocolError(ProtocolError):
    """We called the machine in a way its state does not allow (a bug on our side)."""


class AuthenticationError(RemoteProtocolError):
    """The peer failed to prove it holds the fleet secret, or refused our proof."""


# -- message types -----------------------------------------------------------------------------


class Msg(enum.IntEnum):
    HELLO = 1
    CHALLENGE = 2
    AUTH = 3
    REQUEST = 4
    ACCEPT = 5
    REFUSE = 6
    PATH_OK = 7
    REPORT = 8
    PROGRESS = 9
    DONE = 10
    BYE = 11
    ERROR = 12


DGRAM_DATA: Final = 0x44
DGRAM_PROBE: Final = 0x50
FLAG_RETRANSMIT: Final = 0x01

_FRAME = struct.Struct("!IB")
_DGRAM = struct.Struct("!BB8sQI")
DGRAM_HEADER_LEN: Final = _DGRAM.size
DGRAM_OVERHEAD: Final = DGRAM_HEADER_LEN + TAG_LEN
_REQUEST = struct.Struct("!20sQII")
_ACCEPT = struct.Struct("!IIQIQI")
_REPORT = struct.Struct("!QQIII")
_PROGRESS = struct.Struct("!QQQQQB")
_BYE = struct.Struct("!QQ")


class RefuseCode(enum.IntEnum):
    UNKNOWN_ARTIFACT = 1
    BAD_REQUEST = 2
    BUSY = 3


# -- keys --------------------------------------------------------------------------------------


def hkdf_extract(salt: bytes, ikm: bytes) -> bytes:
    """RFC 5869 HKDF-Extract with SHA-256."""
    return hmac.digest(salt, ikm, "sha256")


def hkdf_expand(prk: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 HKDF-Expand with SHA-256."""
    if length > 255 * 32:
        raise LocalProtocolError(f"HKDF-Expand length must be <= 8160, got {length}")
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.digest(prk, block + info + bytes([counter]), "sha256")
        out += block
        counter += 1
    return out[:length]


class FleetKey:
    """The fleet secret, reduced once to a pseudo-random key (HKDF-Extract)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_LEN:
            raise LocalProtocolError(
                f"fleet secret must be at least {MIN_SECRET_LEN} bytes, got {len(secret)}: "
                "set SWARM_SECRET to a random value (e.g. `openssl rand -hex 32`) on every node"
            )
        self._prk = hkdf_extract(b"swarm-udp/1 fleet", secret)
        self._auth = hkdf_expand(self._prk, b"auth", 32)

    def proof(self, label: bytes, transcript: bytes) -> bytes:
        return hmac.digest(self._auth, label + transcript, "sha256")

    def session_keys(self, client_nonce: bytes, server_nonce: bytes) -> SessionKeys:
        prk = hkdf_extract(client_nonce + server_nonce, self._prk)
        material = hkdf_expand(prk, b"session keys", 4 * 32 + 8)
        return SessionKeys(
            control_c2s=material[0:32],
            control_s2c=material[32:64],
            data_s2c=material[64:96],
            data_c2s=material[96:128],
            session_id=material[128:136],
        )


@dataclass(frozen=True, slots=True)
class SessionKeys:
    control_c2s: bytes
    control_s2c: bytes
    data_s2c: bytes
    data_c2s: bytes
    session_id: bytes


class _Sealer:
    """AES-256-GCM with a 64-bit counter nonce: one instance per key and direction, so a
    nonce is never reused (GCM's one hard rule, SP 800-38D section 8)."""

    __slots__ = ("_aead", "_counter")

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._counter = 0

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        nonce = b"\0\0\0\0" + self._counter.to_bytes(8, "big")
        self._counter += 1
        return self._aead.encrypt(nonce, plaintext, aad)

    def open(self, ciphertext: bytes, aad: bytes) -> bytes:
        nonce = b"\0\0\0\0" + self._counter.to_bytes(8, "big")
        try:
            plaintext = self._aead.decrypt(nonce, ciphertext, aad)
        except InvalidTag:
            raise RemoteProtocolError("control frame failed authentication") from None
        self._counter += 1
        return plaintext


# -- framing -----------------------------------------------------------------------------------


def frame(msg: Msg, body: bytes) -> bytes:
    return _FRAME.pack(len(body), msg) + body


class FrameBuffer:
    """Splits a byte stream into ``(type, body)`` frames, refusing oversized ones early."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.limit = MAX_PREAUTH_FRAME

    def feed(self, data: bytes) -> Iterator[tuple[int, bytes]]:
        """Frames now complete, one at a time: handling one may raise :attr:`limit` (after
        AUTH) before the next frame's length is checked."""
        self._buf += data
        while len(self._buf) >= _FRAME.size:
            length, kind = _FRAME.unpack_from(self._buf)
            if length > self.limit:
                raise RemoteProtocolError(f"control frame of {length} bytes (limit {self.limit})")
            end = _FRAME.size + length
            if len(self._buf) < end:
                break
            body = bytes(self._buf[_FRAME.size : end])
            del self._buf[:end]
            yield kind, body


def peek_session_id(datagram: bytes) -> bytes | None:
    """The session id of a datagram (unauthenticated: only a demultiplexing hint)."""
    if len(datagram) < DGRAM_OVERHEAD:
        return None
    return datagram[2:10]


# -- the block plan ----------------------------------------------------------------------------


class BlockPlan:
    """Blocks of ``pieces`` (in request order) numbered 0..total-1, the same on both sides."""

    def __init__(
        self, pieces: Sequence[int], piece_size: int, total_size: int, block_size: int
    ) -> None:
        self.pieces = list(pieces)
        self.piece_size = piece_size
        self.total_size = total_size
        self.block_size = block_size
        self.first: list[int] = []
        ordinal = 0
        for piece in self.pieces:
            self.first.append(ordinal)
            ordinal += -(-self.piece_length(piece) // block_size)
        self.total = ordinal

    def piece_length(self, piece: int) -> int:
        return min(self.piece_size, self.total_size - piece * self.piece_size)

    def locate(self, ordinal: int) -> tuple[int, int, int]:
        """``(position in pieces, byte offset in the piece, length)`` of block ``ordinal``."""
        pos = bisect.bisect_right(self.first, ordinal) - 1
        offset = (ordinal - self.first[pos]) * self.block_size
        length = min(self.block_size, self.piece_length(self.pieces[pos]) - offset)
        return pos, offset, length

    def ordinals(self, pos: int) -> range:
        end = self.first[pos + 1] if pos + 1 < len(self.first) else self.total
        return range(self.first[pos], end)


def validate_block_size(block_size: int) -> None:
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise LocalProtocolError(
            f"block_size must be in {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE} bytes, got {block_size}"
        )


def piece_count_for(total_size: int, piece_size: int) -> int:
    return -(-total_size // piece_size)


# -- the rate rule -----------------------------------------------------------------------------


def adapt_rate(
    rate: float,
    target: float,
    expected: int,
    received: int,
    intervals: int = 1,
    slow_start: bool = False,
) -> tuple[float, bool]:
    """One control step of the sender's rate from one receiver REPORT.

    ``loss = (expected - received) / expected`` over the report's interval (``expected``
    counts the sender's datagrams by ``seq``, so retransmissions count and reordering
    across an interval boundary only adds noise, clamped to 0..1).

    - fewer than :data:`MIN_LOSS_SAMPLE` datagrams expected: no change (one datagram more
      or less would swing the estimate by more than the thresholds);
    - ``loss > LOSS_HIGH`` (2%): ``rate *= max(MAX_DECREASE, 1 - loss)``: the new rate is
      the rate that was *delivered*, the bottleneck's share, like Tsunami's back-off on a
      high error rate but in one step instead of many small ones; never below half, since a
      burst of loss (a tbf queue overflowing once) overstates the steady loss;
    - ``loss <= LOSS_LOW`` (0.5%): ``rate *= RATE_INCREASE ** intervals`` (4% per 50 ms
      report interval the sample spans), up to ``target``: probing for spare capacity
      multiplicatively, as Tsunami speeds up; during ``slow_start`` (until the first
      loss, from :data:`START_FRACTION` of the target) the rate doubles per interval instead,
      like TCP's slow start (RFC 5681);
    - in between: hold. The sender then runs a few percent above the bottleneck, which costs
      a few percent of its packets but keeps the link full (a dropped datagram never used
      the link, so goodput stays at the link rate).

    The caller applies at most one decrease per feedback loop: after a cut it ignores
    reports until they describe datagrams sent after it. The result is clamped to
    ``MIN_RATE_BPS..target``.

    Returns:
        ``(new rate, decreased)``.
    """
    if expected < MIN_LOSS_SAMPLE:
        return min(rate, target), False
    loss = min(1.0, max(0.0, (expected - received) / expected))
    if loss > LOSS_HIGH:
        new = max(MIN_RATE_BPS, rate * max(MAX_DECREASE, 1.0 - loss))
        return min(new, target), True
    if loss <= LOSS_LOW:
        factor = (2.0 if slow_start else RATE_INCREASE) ** max(1, intervals)
        return max(MIN_RATE_BPS, min(target, rate * factor)), False
    return min(rate, target), False


# -- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    pass


@dataclass(frozen=True, slots=True)
class Authenticated(Event):
    session_id: bytes


@dataclass(frozen=True, slots=True)
class RequestReceived(Event):
    """Server side: decide with :meth:`ServerSession.accept` or :meth:`ServerSession.refuse`."""

    info_hash_hex: str
    pieces: tuple[int, ...]
    rate_bps: int
    block_size: int


@dataclass(frozen=True, slots=True)
class Accepted(Event):
    piece_size: int
    piece_count: int
    total_size: int
    block_size: int
    rate_bps: int
    unavailable: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Refused(Event):
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class PathValidated(Event):
    addr: tuple[str, int]


@dataclass(frozen=True, slots=True)
class NeedPieces(Event):
    """Server side: load these pieces and pass them to :meth:`ServerSession.piece_loaded`."""

    pieces: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PieceReceived(Event):
    """Client side: check the piece, then call :meth:`ClientSession.piece_checked`."""

    index: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Progress(Event):
    rate_bps: int
    sent_datagrams: int
    sent_bytes: int


@dataclass(frozen=True, slots=True)
class TransferDone(Event):
    """Every accepted piece was kept or given up on (client); the client said DONE (server)."""


@dataclass(frozen=True, slots=True)
class PeerError(Event):
    reason: str


# -- shared machinery --------------------------------------------------------------------------


class _Side:
    def __init__(self) -> None:
        self._frames = FrameBuffer()
        self._out = bytearray()
        self._events: list[Event] = []
        self._send_ctl: _Sealer | None = None
        self._recv_ctl: _Sealer | None = None
        self.closed = False

    def events(self) -> list[Event]:
        """Events since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def data_to_send(self) -> bytes:
        """Control-channel bytes to write, since the last call."""
        out = bytes(self._out)
        self._out.clear()
        return out

    def _send_plain(self, msg: Msg, body: bytes) -> None:
        self._out += frame(msg, body)

    def _send_sealed(self, msg: Msg, body: bytes) -> None:
        if self._send_ctl is None:
            raise LocalProtocolError(f"cannot send {msg.name} before authentication")
        self._out += frame(msg, self._send_ctl.seal(body, bytes([msg])))

    def _open(self, kind: int, body: bytes) -> bytes:
        if self._recv_ctl is None:
            raise RemoteProtocolError(f"message type {kind} before authentication")
        return self._recv_ctl.open(body, bytes([kind]))

    def send_error(self, reason: str) -> None:
        """Tell the peer why we are closing (sealed once authenticated)."""
        body = reason.encode()[:100]
        if self._send_ctl is None:
            self._send_plain(Msg.ERROR, body)
        else:
            self._send_sealed(Msg.ERROR, body)
        self.closed = True

    def _error_frame(self, body: bytes) -> str:
        if self._recv_ctl is not None:
            body = self._open(Msg.ERROR, body)
        return body.decode("utf-8", "replace")


def _u32s(data: bytes, count: int, what: str) -> tuple[int, ...]:
    if len(data) != 4 * count:
        raise RemoteProtocolError(f"{what}: {len(data)} bytes for {count} entries")
    return struct.unpack(f"!{count}I", data)


# -- server (sender) ---------------------------------------------------------------------------


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
    rate_changes: list[tuple[float, float]] = field(default_factory=list)


class ServerSession:
    """One control connection on the server: authenticates, then sends what was asked.

    The edge feeds control bytes to :meth:`receive_control`, this session's datagrams to
    :meth:`receive_datagram`, calls :meth:`handle_timer` to get paced datagrams, and sends
    them to :attr:`data_addr` only (which exists once a PROBE sealed with this session's
    key arrived from the control connection's IP). Until then nothing at all is sent by UDP,
    so an unauthenticated address receives 0 bytes, well inside the 3x anti-amplification
    budget of RFC 9000 section 8.
    """

    def __init__(
        self,
        key: FleetKey,
        server_nonce: bytes,
        peer_ip: str,
        rate_cap_bps: int,
        prefetch_pieces: int = 2,
        cache_pieces: int = 8,
    ) -> None:
        if len(server_nonce) != NONCE_LEN:
            raise LocalProtocolError(f"server nonce must be {NONCE_LEN} bytes")
        if rate_cap_bps < MIN_RATE_BPS:
            raise LocalProtocolError(f"rate_cap_bps must be >= {MIN_RATE_BPS}, got {rate_cap_bps}")
        self._side = _Side()
        self._key = key
        self._nonce = server_nonce
        self.peer_ip = peer_ip
        self.rate_cap = float(rate_cap_bps)
        self.state = ServerState.AWAIT_HELLO
        self.session_id = b""
        self.data_addr: tuple[str, int] | None = None
        self.stats = SenderStats()
        self._transcript = b""
        self._keys: SessionKeys | None = None
        self._data: _Sealer | None = None
        self._probe_aead: AESGCM | None = None
        self._probe_seq = -1
        self._plan: BlockPlan | None = None
        self._requested_rate = 0.0
        self._target = 0.0
        self.rate = 0.0
        self._blocked = False
        self._tokens = 0.0
        self._last_tick: float | None = None
        self._cut_seq = 0
        self._expected = 0
        self._received = 0
        self._pooled = 0
        self._slow_start = True
        self._next_ordinal = 0
        self._retx: deque[int] = deque()
        self._retx_set: set[int] = set()
        self._seq = 0
        self._loaded: dict[int, memoryview] = {}
        self._loading: set[int] = set()
        self._prefetch = prefetch_pieces
        self._cache = max(cache_pieces, prefetch_pieces + 2)
        self._pass_done_sent = False
        self._last_echo = 0

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

    # control channel
    def receive_control(self, data: bytes, now: float) -> None:
        if self.state is ServerState.DONE:
            return
        for kind, body in self._side._frames.feed(data):
            self._handle(kind, body, now)

    def _handle(self, kind: int, body: bytes, now: float) -> None:
        side = self._side
        if kind == Msg.ERROR:
            side._events.append(PeerError(side._error_frame(body)))
            self.state = ServerState.DONE
            return
        if self.state is ServerState.AWAIT_HELLO:
            if kind != Msg.HELLO or len(body) != len(VERSION_MAGIC) + NONCE_LEN:
                raise RemoteProtocolError("expected HELLO")
            if not body.startswith(VERSION_MAGIC):
                raise RemoteProtocolError("unsupported protocol version (want SWUDP1)")
            self._transcript = body + self._nonce
            keys = self._key.session_keys(body[len(VERSION_MAGIC) :], self._nonce)
            self._keys = keys
            side._send_plain(
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
            side._send_ctl = _Sealer(keys.control_s2c)
            side._recv_ctl = _Sealer(keys.control_c2s)
            side._frames.limit = MAX_CONTROL_FRAME
            self._data = _Sealer(keys.data_s2c)
            self._probe_aead = AESGCM(keys.data_c2s)
            self.session_id = keys.session_id
            self.state = ServerState.AWAIT_REQUEST
            side._events.append(Authenticated(self.session_id))
        elif self.state is ServerState.AWAIT_REQUEST:
            if kind != Msg.REQUEST:
                raise RemoteProtocolError("expected REQUEST")
            body = side._open(kind, body)
            if len(body) < _REQUEST.size:
                raise RemoteProtocolError("short REQUEST")
            info_hash, rate, block, count = _REQUEST.unpack_from(body)
            if not 1 <= count <= MAX_PIECES_PER_REQUEST:
                raise RemoteProtocolError(f"REQUEST names {count} pieces")
            pieces = _u32s(body[_REQUEST.size :], count, "REQUEST pieces")
            if len(set(pieces)) != len(pieces):
                raise RemoteProtocolError("REQUEST names a piece twice")
            if not MIN_BLOCK_SIZE <= block <= MAX_BLOCK_SIZE:
                raise RemoteProtocolError(f"block size {block} out of range")
            self.state = ServerState.DECIDING
            side._events.append(RequestReceived(info_hash.hex(), pieces, rate, block))
        elif self.state is ServerState.SENDING or self.state is ServerState.AWAIT_PATH:
            body = side._open(kind, body)
            if kind == Msg.REPORT:
                self._on_report(body, now)
            elif kind == Msg.DONE:
                side._send_sealed(Msg.BYE, _BYE.pack(self.stats.datagrams, self.stats.bytes))
                side._events.append(TransferDone())
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
    ) -> None:
        """Answer the request: send ``pieces`` (those we have, in request order)."""
        if self.state is not ServerState.DECIDING:
            raise LocalProtocolError(f"accept() in state {self.state.value}")
        missing = tuple(unavailable)
        self._plan = BlockPlan(pieces, piece_size, total_size, block_size)
        self._requested_rate = float(max(MIN_RATE_BPS, rate_bps))
        self._target = min(self._requested_rate, self.rate_cap)
        self.rate = max(float(MIN_RATE_BPS), self._target * START_FRACTION)
        self._slow_start = True
        body = _ACCEPT.pack(
            piece_size,
            piece_count_for(total_size, piece_size),
            total_size,
            block_size,
            int(self._target),
            len(missing),
        ) + struct.pack(f"!{len(missing)}I", *missing)
        self._side._send_sealed(Msg.ACCEPT, body)
        self.state = ServerState.AWAIT_PATH
        self._want_pieces()

    def refuse(self, code: RefuseCode, reason: str) -> None:
        if self.state is not ServerState.DECIDING:
            raise LocalProtocolError(f"refuse() in state {self.state.value}")
        self._side._send_sealed(Msg.REFUSE, bytes([code]) + reason.encode()[:200])
        self.state = ServerState.DONE

    def set_rate_cap(self, rate_cap_bps: float) -> None:
        """Lower (or raise) this session's cap: the server divides its cap among sessions."""
        self.rate_cap = max(float(MIN_RATE_BPS), rate_cap_bps)
        if self._plan is not None:
            self._target = min(self._requested_rate, self.rate_cap)
            self.rate = min(self.rate, self._target)

    def _on_report(self, body: bytes, now: float) -> None:
        if len(body) < _REPORT.size:
            raise RemoteProtocolError("short REPORT")
        echo, seq_high, expected, received, count = _REPORT.unpack_from(body)
        if count > MAX_NAKS_PER_REPORT:
            raise RemoteProtocolError(f"REPORT with {count} NAKs")
        naks = _u32s(body[_REPORT.size :], count, "REPORT naks")
        assert self._plan is not None
        self.stats.reports += 1
        self._last_echo = echo
        total = self._plan.total
        for ordinal in naks:
            if ordinal >= total:
                raise RemoteProtocolError(f"NAK for block {ordinal} of {total}")
            if ordinal not in self._retx_set:
                self._retx_set.add(ordinal)
                self._retx.append(ordinal)
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
            if decreased:
                self._slow_start = False
                # One cut per feedback loop (NewReno's `recover`, RFC 6582): reports about
                # datagrams sent before this cut describe the old rate; ignore them.
                self._cut_seq = self._seq
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
        body = _PROGRESS.pack(echo, served, int(self.rate), stats.datagrams, stats.bytes, done)
        self._side._send_sealed(Msg.PROGRESS, body)
        self._pass_done_sent = done

    # data channel
    def receive_datagram(self, data: bytes, addr: tuple[str, int]) -> bool:
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
                b"\0\0\0\0" + data[10:18], data[DGRAM_HEADER_LEN:], data[:DGRAM_HEADER_LEN]
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
                self._side._send_sealed(Msg.PATH_OK, b"")
                self.state = ServerState.SENDING
                self._side._events.append(PathValidated(addr))
        return True

    def piece_loaded(self, index: int, data: bytes) -> None:
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
        needed = {plan.pieces[plan.locate(o)[0]] for o in self._retx}
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
        want: list[int] = []
        for ordinal in itertools.islice(self._retx, 64):
            want.append(plan.pieces[plan.locate(ordinal)[0]])
        if self._next_ordinal < plan.total:
            pos = plan.locate(self._next_ordinal)[0]
            want.extend(plan.pieces[pos : pos + self._prefetch + 1])
        new = []
        for index in want:
            if index not in self._loaded and index not in self._loading:
                self._loading.add(index)
                new.append(index)
        if new:
            self._side._events.append(NeedPieces(tuple(new)))

    def next_timer(self, now: float) -> float | None:
        """When :meth:`handle_timer` has datagrams to send; None while idle or blocked."""
        if self.state is not ServerState.SENDING or self._plan is None or self.rate <= 0:
            return None
        if self._blocked or (not self._retx and self._next_ordinal >= self._plan.total):
            return None
        size = self._plan.block_size + DGRAM_OVERHEAD
        if self._tokens >= size - 1:
            return now
        # At least a microsecond ahead: float rounding must not make a timer that is due
        # "now" yet finds a token short (a busy loop).
        return now + max(1e-6, (size - self._tokens) * 8 / self.rate)

    def handle_timer(self, now: float, limit: int = 64) -> list[bytearray]:
        """Datagrams due by ``now`` at the paced rate (at most ``limit``), for
        :attr:`data_addr`. Empty until the UDP path is validated."""
        plan = self._plan
        if self.state is not ServerState.SENDING or plan is None or self._data is None:
            return []
        if self._last_tick is not None:
            self._tokens += (now - self._last_tick) * self.rate / 8
        self._last_tick = now
        wire_block = plan.block_size + DGRAM_OVERHEAD
        burst = max(2 * wire_block, self.rate / 8 * BURST_SECONDS)
        self._tokens = min(self._tokens, burst)
        out: list[bytearray] = []
        sid = self.session_id
        while len(out) < limit:
            if self._retx:
                ordinal, flags = self._retx[0], FLAG_RETRANSMIT
            elif self._next_ordinal < plan.total:
                ordinal, flags = self._next_ordinal, 0
            else:
                if not self._pass_done_sent:
                    self._send_progress(0)
                break
            pos, offset, length = plan.locate(ordinal)
            piece = self._loaded.get(plan.pieces[pos])
            if piece is None:
                # Wait for piece_loaded() (next_timer is None meanwhile: no busy loop).
                self._blocked = True
                self._want_pieces()
                break
            size = length + DGRAM_OVERHEAD
            if self._tokens < size - 1:  # 1 byte of slack for float rounding
                break
            self._tokens -= size
            if flags:
                self._retx.popleft()
                self._retx_set.discard(ordinal)
                self.stats.retransmits += 1
            else:
                self._next_ordinal += 1
            out.append(self._seal_block(sid, flags, ordinal, piece[offset : offset + length]))
            self.stats.bytes += size
        self.stats.datagrams += len(out)
        if out and self._next_ordinal < plan.total:
            pos = plan.locate(self._next_ordinal)[0]
            ahead = plan.pieces[pos : pos + self._prefetch + 1]
            if any(i not in self._loaded and i not in self._loading for i in ahead):
                self._want_pieces()
                self._evict()
        return out

    def _seal_block(self, sid: bytes, flags: int, ordinal: int, payload: memoryview) -> bytearray:
        assert self._data is not None
        seq = self._seq
        self._seq += 1
        buf = bytearray(DGRAM_HEADER_LEN + len(payload) + TAG_LEN)
        _DGRAM.pack_into(buf, 0, DGRAM_DATA, flags, sid, seq, ordinal)
        header = bytes(buf[:DGRAM_HEADER_LEN])
        self._data._aead.encrypt_into(
            b"\0\0\0\0" + header[10:18], payload, header, memoryview(buf)[DGRAM_HEADER_LEN:]
        )
        return buf


# -- client (receiver) -------------------------------------------------------------------------


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


class ClientSession:
    """The receiving side: authenticates, requests pieces, reassembles and NAKs blocks.

    The edge sends :meth:`data_to_send` on the control connection, the datagrams of
    :meth:`handle_timer` (PROBEs) from its data socket, feeds arriving datagrams to
    :meth:`receive_datagram`, and answers each :class:`PieceReceived` with
    :meth:`piece_checked`.
    """

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
        self._side = _Side()
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
        self._probe: _Sealer | None = None
        self._next_probe = 0.0
        self._have = bytearray()
        self._remaining: list[int] = []
        self._buffers: dict[int, bytearray] = {}
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
        self._nak_at: dict[int, int] = {}
        """Outstanding ordinal -> the stamp (``echo``) of the report that last NAKed it."""
        self._next_nak_id = 0
        self._pass_done = False
        self._pass_done_at: float | None = None
        self._seq_high = -1
        self._seq_high_reported = -1
        self._received_interval = 0
        self._next_report = 0.0
        self._side._send_plain(Msg.HELLO, self._hello)

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
        for kind, body in self._side._frames.feed(data):
            self._handle(kind, body, now)
            if self.state is ClientState.DONE:
                return

    def _handle(self, kind: int, body: bytes, now: float) -> None:
        side = self._side
        if kind == Msg.ERROR:
            awaiting_accept = self.state is ClientState.AWAIT_ACCEPT
            self.state = ClientState.DONE
            try:
                reason = side._error_frame(body)
            except RemoteProtocolError:
                if not awaiting_accept:
                    raise
                # A server that rejects our AUTH has no session keys, so it answers in
                # plaintext; a plaintext ERROR is accepted only in this one state.
                plain = body.decode("utf-8", "replace")
                raise AuthenticationError(
                    f"the server refused our fleet secret ({plain})"
                ) from None
            side._events.append(PeerError(reason))
            return
        if self.state is ClientState.AWAIT_CHALLENGE:
            if kind != Msg.CHALLENGE or len(body) != NONCE_LEN + 32:
                raise RemoteProtocolError("expected CHALLENGE")
            server_nonce, proof = body[:NONCE_LEN], body[NONCE_LEN:]
            transcript = self._hello + server_nonce
            if not hmac.compare_digest(proof, self._key.proof(b"server", transcript)):
                raise AuthenticationError("the server failed to prove the fleet secret")
            keys = self._key.session_keys(self._client_nonce, server_nonce)
            side._send_ctl = _Sealer(keys.control_c2s)
            side._recv_ctl = _Sealer(keys.control_s2c)
            side._frames.limit = MAX_CONTROL_FRAME
            self._data_aead = AESGCM(keys.data_s2c)
            self._probe = _Sealer(keys.data_c2s)
            self.session_id = keys.session_id
            side._send_plain(Msg.AUTH, self._key.proof(b"client", transcript))
            req = _REQUEST.pack(self._info_hash, self._rate, self._block_size, len(self._requested))
            side._send_sealed(
                Msg.REQUEST, req + struct.pack(f"!{len(self._requested)}I", *self._requested)
            )
            self.state = ClientState.AWAIT_ACCEPT
            side._events.append(Authenticated(self.session_id))
            return
        body = side._open(kind, body)
        if self.state is ClientState.AWAIT_ACCEPT:
            if kind == Msg.REFUSE:
                if not body:
                    raise RemoteProtocolError("empty REFUSE")
                side._events.append(Refused(body[0], body[1:].decode("utf-8", "replace")))
                self.unavailable = tuple(self._requested)
                self.state = ClientState.DONE
                return
            if kind != Msg.ACCEPT or len(body) < _ACCEPT.size:
                raise RemoteProtocolError("expected ACCEPT")
            self._on_accept(body)
        elif kind == Msg.PATH_OK:
            if self.state is ClientState.PROBING:
                self.state = ClientState.RECEIVING
                self._next_report = now + REPORT_INTERVAL
        elif kind == Msg.PROGRESS:
            if len(body) != _PROGRESS.size:
                raise RemoteProtocolError("bad PROGRESS")
            echo, served, rate, datagrams, sent, pass_done = _PROGRESS.unpack(body)
            if echo:
                sample = max(0.0, now - echo / 1e6)
                srtt = self.stats.srtt
                self.stats.srtt = sample if srtt is None else 0.875 * srtt + 0.125 * sample
            self.stats.sender_rate_bps = rate
            side._events.append(Progress(rate, datagrams, sent))
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
        piece_size, piece_count, total, block, rate, n = _ACCEPT.unpack_from(body)
        missing = _u32s(body[_ACCEPT.size :], n, "ACCEPT unavailable")
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
        if block != self._block_size and not MIN_BLOCK_SIZE <= block <= MAX_BLOCK_SIZE:
            # the server's word, not our misuse: a RemoteProtocolError
            raise RemoteProtocolError(f"ACCEPT names block size {block}, out of range")
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
        self._accepted_event = Accepted(piece_size, piece_count, total, block, rate, missing)
        self._side._events.append(self._accepted_event)
        if not pieces:
            self._finish()
            return
        self.state = ClientState.PROBING

    # data channel
    def receive_datagram(self, data: bytes) -> None:
        """A datagram from the data socket. Forged ones are counted in ``stats.forged``."""
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
        _, flags, _, seq, ordinal = _DGRAM.unpack_from(data)
        header = data[:DGRAM_HEADER_LEN]
        nonce = b"\0\0\0\0" + data[10:18]
        body = memoryview(data)[DGRAM_HEADER_LEN:]
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
        buf = self._buffers.get(pos)
        if buf is None:
            buf = self._buffers[pos] = bytearray(plan.piece_length(plan.pieces[pos]))
        try:
            # Decrypts in place; on a bad tag the bytes written are garbage, but the block
            # stays missing, so the authentic copy overwrites them.
            aead.decrypt_into(nonce, body, header, memoryview(buf)[offset : offset + length])
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
            nak_id = self._nak_id.pop(ordinal, None)
            if nak_id is not None and flags & FLAG_RETRANSMIT:
                self._lost_before(nak_id - REORDER_SLACK)
        if not flags & FLAG_RETRANSMIT and ordinal > self._first_high:
            self._first_high = ordinal
        self._remaining[pos] -= 1
        if self._remaining[pos] == 0:
            self._checking.add(pos)
            self._side._events.append(PieceReceived(plan.pieces[pos], bytes(buf)))
            del self._buffers[pos]

    def _lost_before(self, nak_id: int) -> None:
        """NAKs are served in order: those before ``nak_id`` still missing were lost again."""
        order = self._nak_order
        while order and order[0][0] < nak_id:
            old_id, ordinal = order.popleft()
            if self._nak_id.get(ordinal) == old_id:
                self._outstanding[ordinal] = 0.0

    def _count(self, seq: int, payload: int) -> None:
        self.stats.datagrams += 1
        self.stats.bytes += payload
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
        self._side._send_sealed(Msg.DONE, b"")
        self.state = ClientState.DONE
        self._side._events.append(TransferDone())

    def next_timer(self) -> float | None:
        if self.state is ClientState.PROBING:
            return self._next_probe
        if self.state is ClientState.RECEIVING:
            return self._next_report
        return None

    def handle_timer(self, now: float) -> list[bytes]:
        """Sends REPORTs (control) when due; returns PROBE datagrams for the data socket."""
        if self.state is ClientState.PROBING:
            if now < self._next_probe:
                return []
            self._next_probe = now + PROBE_INTERVAL
            return [self._seal_probe()]
        if self.state is not ClientState.RECEIVING or now < self._next_report:
            return []
        self._next_report = now + REPORT_INTERVAL
        self._report(now)
        return []

    def _seal_probe(self) -> bytes:
        assert self._probe is not None
        seq = self._probe._counter
        header = _DGRAM.pack(DGRAM_PROBE, 0, self.session_id, seq, 0)
        return header + self._probe.seal(b"", header)

    def _report(self, now: float) -> None:
        plan = self.plan
        assert plan is not None
        # Gap detection: first-pass blocks arrive in ordinal order, so a missing ordinal well
        # below the highest first-pass one seen was lost (Tsunami's retransmit requests).
        horizon = self._first_high - REORDER_SLACK
        if self._pass_done and self._pass_done_at is not None and now >= self._pass_done_at:
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
            if due <= now:
                naks.append(ordinal)
                if len(naks) >= MAX_NAKS_PER_REPORT:
                    break
        for ordinal in naks:
            self._outstanding[ordinal] = now + RENAK_TIMEOUT
            self._nak_id[ordinal] = self._next_nak_id
            self._nak_order.append((self._next_nak_id, ordinal))
            self._nak_at[ordinal] = echo
            self._next_nak_id += 1
        expected = max(0, self._seq_high - self._seq_high_reported)
        received = min(self._received_interval, expected)
        self._seq_high_reported = self._seq_high
        self._received_interval = 0
        body = _REPORT.pack(echo, max(0, self._seq_high), expected, received, len(naks))
        self._side._send_sealed(Msg.REPORT, body + struct.pack(f"!{len(naks)}I", *naks))
        self.stats.naks += len(naks)
        self.stats.reports += 1
