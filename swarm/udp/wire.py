"""The transfer's wire format: constants, errors, control frames, datagram headers, and the
block plan both sides derive from REQUEST and ACCEPT. Pure: no socket, clock or RNG.

Handshake (control channel, TCP, frames ``u32 length | u8 type | body``)::

    C -> S  HELLO      "SWUDP3" | client_nonce[32]
    S -> C  CHALLENGE  server_nonce[32] | HMAC(auth_key, "server" | transcript)
    C -> S  AUTH       HMAC(auth_key, "client" | transcript)        (client checks S first)
    C -> S  REQUEST    info_hash[20] | rate u64 | block u32 | n u32 | piece u32 * n   (sealed)
    S -> C  ACCEPT     piece_size u32 | piece_count u32 | size u64 | block u32 | rate u64
                       | n u32 | unavailable piece u32 * n                           (sealed)
         or REFUSE     code u8 | reason                                              (sealed)
    C => S  PROBE      datagrams from the client's data socket, from AUTH until PATH_OK
    S -> C  PATH_OK                                                                  (sealed)
    S => C  DATA       paced datagrams
    C -> S  REPORT     echo u64 | seq_high u64 | expected u32 | received u32
                       | n u32 | nak u32 * n                                         (sealed)
    S -> C  PROGRESS   echo u64 | served u64 | rate u64 | datagrams u64 | bytes u64
                       | pass_done u8                                               (sealed)
    C -> S  SKIP       n u32 | piece u32 * n                                         (sealed)
    C -> S  DONE                                                                     (sealed)
    S -> C  BYE        datagrams u64 | bytes u64                                     (sealed)

``transcript = HELLO body | server_nonce`` (keys and sealing: :mod:`swarm.udp.crypto`).

SKIP names accepted pieces the client no longer wants (another source brought them while
the session ran): the sender sends none of their blocks from then on, first pass or
retransmission, and the client NAKs none. Far-region's sessions received a quarter of
their bytes for pieces the region's own exchange had brought meanwhile.

Datagram (both directions)::

    type u8 | flags u8 | session_id[8] | seq u64 | ordinal u32 | AES-GCM(payload) | tag[16]

The 22-byte header is the AEAD's associated data; ``seq`` (unique per direction and session)
is the nonce. ``ordinal`` numbers the blocks of the accepted pieces in request order, which
both sides compute from REQUEST and ACCEPT (:class:`BlockPlan`), so a datagram carries no
piece index or offset.

A datagram is never larger than the path's MTU: the ACCEPTed block size is at most what
the client asked for (its own path MTU, :func:`block_size_for_mtu`) and what the server's
route to the client allows, and both sockets set "don't fragment". Blocks above the MTU
would travel as IP fragments, and one lost fragment loses the whole datagram.
"""

from __future__ import annotations

import bisect
import enum
import struct
from collections.abc import Iterator, Sequence
from typing import Final

VERSION_MAGIC: Final = b"SWUDP3"
"""Version 3: SKIP (version 2 servers refuse the frame mid-session); version 2: keys from
``cryptography``'s HKDF with a fleet key (version 1 derived them by hand, differently). A
node of another version says so rather than "wrong fleet secret" or a broken session."""
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

IPV4_HEADER: Final = 20
IPV6_HEADER: Final = 40
UDP_HEADER: Final = 8
MAX_UDP_PAYLOAD: Final = 65507
"""Largest UDP payload in one IPv4 datagram (65535 less the IP and UDP headers)."""

_FRAME = struct.Struct("!IB")
_DGRAM = struct.Struct("!BB8sQI")
DGRAM_HEADER_LEN: Final = _DGRAM.size
DGRAM_OVERHEAD: Final = DGRAM_HEADER_LEN + TAG_LEN
"""Our bytes around each block: the 22-byte header and the 16-byte tag."""

MIN_BLOCK_SIZE: Final = 512
MAX_BLOCK_SIZE: Final = MAX_UDP_PAYLOAD - DGRAM_OVERHEAD
"""Largest payload in one IPv4 UDP datagram (65507) less our header and tag."""
DEFAULT_BLOCK_SIZE: Final = MAX_BLOCK_SIZE
"""What a client asks for unless told otherwise; both ends then lower it to their path MTU
(:func:`block_size_for_mtu`): 1434 bytes on a 1500-byte Ethernet path, 8935 on a 9001-byte
VPC path, the largest block on loopback."""
MAX_PIECE_SIZE: Final = 64 << 20
"""Largest piece accepted from an ACCEPT: a receiver buffers whole pieces."""
MAX_PIECES_PER_REQUEST: Final = 1 << 18
MAX_NAKS_PER_REPORT: Final = 8192
MAX_CONTROL_FRAME: Final = 4 + 4 * MAX_PIECES_PER_REQUEST + 64
"""Largest control frame body (a REQUEST naming the most pieces)."""
MAX_PREAUTH_FRAME: Final = 128
"""Largest frame before authentication: an unauthenticated peer cannot make us buffer much."""


class ProtocolError(Exception):
    """Base of the transfer protocol's errors."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something we cannot accept; the message is safe to send back."""


class LocalProtocolError(ProtocolError):
    """We called the machine in a way its state does not allow (a bug on our side)."""


class AuthenticationError(RemoteProtocolError):
    """The peer failed to prove it holds the fleet secret, or refused our proof."""


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
    SKIP = 13


class RefuseCode(enum.IntEnum):
    UNKNOWN_ARTIFACT = 1
    BAD_REQUEST = 2
    BUSY = 3


DGRAM_DATA: Final = 0x44
DGRAM_PROBE: Final = 0x50
FLAG_RETRANSMIT: Final = 0x01

REQUEST: Final = struct.Struct("!20sQII")
ACCEPT: Final = struct.Struct("!IIQIQI")
REPORT: Final = struct.Struct("!QQIII")
PROGRESS: Final = struct.Struct("!QQQQQB")
BYE: Final = struct.Struct("!QQ")
DGRAM: Final = _DGRAM


def block_size_for_mtu(mtu: int, ipv6: bool = False) -> int:
    """The largest block whose datagram fits one IP packet of ``mtu`` bytes, within
    ``MIN_BLOCK_SIZE..MAX_BLOCK_SIZE``."""
    ip = IPV6_HEADER if ipv6 else IPV4_HEADER
    return max(MIN_BLOCK_SIZE, min(MAX_BLOCK_SIZE, mtu - ip - UDP_HEADER - DGRAM_OVERHEAD))


def validate_block_size(block_size: int) -> None:
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise LocalProtocolError(
            f"block_size must be in {MIN_BLOCK_SIZE}..{MAX_BLOCK_SIZE} bytes, got {block_size}"
        )


def piece_count_for(total_size: int, piece_size: int) -> int:
    return -(-total_size // piece_size)


def u32s(data: bytes, count: int, what: str) -> tuple[int, ...]:
    """``count`` big-endian u32s that must fill ``data`` exactly (else the peer lied)."""
    if len(data) != 4 * count:
        raise RemoteProtocolError(f"{what}: {len(data)} bytes for {count} entries")
    return struct.unpack(f"!{count}I", data)


def pack_u32s(values: Sequence[int]) -> bytes:
    return struct.pack(f"!{len(values)}I", *values)


# -- control frames ----------------------------------------------------------------------------


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


# -- datagrams ---------------------------------------------------------------------------------


def peek_session_id(datagram: bytes) -> bytes | None:
    """The session id of a datagram (unauthenticated: only a demultiplexing hint)."""
    if len(datagram) < DGRAM_OVERHEAD:
        return None
    return bytes(datagram[2:10])


def split_datagrams(size: int, segment: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each datagram in a receive of ``size`` bytes made of datagrams
    of ``segment`` bytes (the last one may be shorter): what one UDP GRO receive returns."""
    if segment <= 0:
        raise LocalProtocolError(f"segment must be > 0, got {segment}")
    for start in range(0, size, segment):
        yield start, min(start + segment, size)


# -- the block plan ----------------------------------------------------------------------------


class BlockPlan:
    """Blocks of ``pieces`` (in request order) numbered 0..total-1, the same on both sides.

    Per position in ``pieces``: :attr:`first` (its first ordinal), :attr:`ends` (one past
    its last), :attr:`lengths` (its bytes); every block is ``block_size`` bytes but a
    piece's last, which may be shorter."""

    def __init__(
        self, pieces: Sequence[int], piece_size: int, total_size: int, block_size: int
    ) -> None:
        self.pieces = list(pieces)
        self.piece_size = piece_size
        self.total_size = total_size
        self.block_size = block_size
        self.first: list[int] = []
        self.ends: list[int] = []
        self.lengths: list[int] = []
        ordinal = 0
        for piece in self.pieces:
            length = self.piece_length(piece)
            self.first.append(ordinal)
            self.lengths.append(length)
            ordinal += -(-length // block_size)
            self.ends.append(ordinal)
        self.total = ordinal
        self.position = {piece: pos for pos, piece in enumerate(self.pieces)}
        """Piece index -> its position in :attr:`pieces` (the plan's pieces are distinct)."""

    def piece_length(self, piece: int) -> int:
        return min(self.piece_size, self.total_size - piece * self.piece_size)

    def locate(self, ordinal: int) -> tuple[int, int, int]:
        """``(position in pieces, byte offset in the piece, length)`` of block ``ordinal``."""
        pos = bisect.bisect_right(self.first, ordinal) - 1
        offset = (ordinal - self.first[pos]) * self.block_size
        length = min(self.block_size, self.lengths[pos] - offset)
        return pos, offset, length

    def ordinals(self, pos: int) -> range:
        return range(self.first[pos], self.ends[pos])
