"""The request and its grant, checked on both sides: what a client may ask for (REQUEST)
and what a server may answer (ACCEPT).

Pure: values in, bytes out, and bytes in, events out. A bad argument of ours raises
:class:`LocalProtocolError`; a bad message from the peer :class:`RemoteProtocolError`.
"""

from __future__ import annotations

from collections.abc import Sequence

from swarm.udp.events import Accepted, RequestReceived
from swarm.udp.rate import MIN_RATE_BPS
from swarm.udp.wire import (
    ACCEPT,
    HASH_LEN,
    MAX_BLOCK_SIZE,
    MAX_PIECE_SIZE,
    MAX_PIECES_PER_REQUEST,
    MIN_BLOCK_SIZE,
    REQUEST,
    LocalProtocolError,
    RemoteProtocolError,
    pack_u32s,
    piece_count_for,
    u32s,
    validate_block_size,
)


def check_request(
    info_hash_hex: str,
    pieces: Sequence[int] | None,
    rate_bps: int,
    block_size: int,
    piece_count: int | None,
) -> bytes:
    """The client's own request, before it is sent; returns the info-hash's bytes.
    ``pieces`` None: checked later (:func:`check_pieces`), when they are dealt."""
    try:
        info_hash = bytes.fromhex(info_hash_hex)
    except ValueError:
        info_hash = b""
    if len(info_hash) != HASH_LEN:
        raise LocalProtocolError(f"info_hash must be 40 hex digits, got {info_hash_hex!r}")
    validate_block_size(block_size)
    if pieces is not None:
        check_pieces(pieces, piece_count)
    if rate_bps < MIN_RATE_BPS:
        raise LocalProtocolError(f"rate_bps must be >= {MIN_RATE_BPS}, got {rate_bps}")
    return info_hash


def check_pieces(pieces: Sequence[int], piece_count: int | None) -> None:
    """A request's pieces: 1 to :data:`MAX_PIECES_PER_REQUEST` distinct, in range."""
    if not pieces or len(pieces) > MAX_PIECES_PER_REQUEST or len(set(pieces)) != len(pieces):
        raise LocalProtocolError(
            f"pieces must be 1..{MAX_PIECES_PER_REQUEST} distinct indices, got {len(pieces)}"
        )
    if min(pieces) < 0 or (piece_count is not None and max(pieces) >= piece_count):
        raise LocalProtocolError(f"piece index out of range 0..{piece_count}")


def pack_request(info_hash: bytes, rate_bps: int, block_size: int, pieces: Sequence[int]) -> bytes:
    return REQUEST.pack(info_hash, rate_bps, block_size, len(pieces)) + pack_u32s(pieces)


def parse_request(body: bytes) -> RequestReceived:
    """The server's check of a REQUEST's (opened) body."""
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
    return RequestReceived(info_hash.hex(), pieces, rate, block)


def pack_accept(
    piece_size: int, total_size: int, block_size: int, rate_bps: int, unavailable: Sequence[int]
) -> bytes:
    body = ACCEPT.pack(
        piece_size,
        piece_count_for(total_size, piece_size),
        total_size,
        block_size,
        rate_bps,
        len(unavailable),
    )
    return body + pack_u32s(unavailable)


def parse_accept(
    body: bytes,
    requested: Sequence[int],
    block_size: int,
    expect_piece_size: int | None,
    expect_piece_count: int | None,
) -> Accepted:
    """The client's check of an ACCEPT's (opened) body, at least ``ACCEPT.size`` bytes,
    against its request: ``requested`` pieces in blocks of at most ``block_size``, of the
    artifact it expects (``expect_piece_size`` and ``expect_piece_count``; None: any)."""
    piece_size, piece_count, total, block, rate, n = ACCEPT.unpack_from(body)
    missing = u32s(body[ACCEPT.size :], n, "ACCEPT unavailable")
    if not 1 <= piece_size <= MAX_PIECE_SIZE or total < 1:
        raise RemoteProtocolError(f"piece size {piece_size} / size {total} out of range")
    if piece_count != piece_count_for(total, piece_size):
        raise RemoteProtocolError(f"{piece_count} pieces cannot make {total} bytes")
    if expect_piece_size not in (None, piece_size) or expect_piece_count not in (
        None,
        piece_count,
    ):
        raise RemoteProtocolError(
            f"the server's artifact has {piece_count} pieces of {piece_size} bytes, "
            f"ours {expect_piece_count} of {expect_piece_size}"
        )
    if not MIN_BLOCK_SIZE <= block <= min(block_size, MAX_BLOCK_SIZE):
        # The server may lower our block size (its path MTU), never raise it (ours).
        raise RemoteProtocolError(
            f"ACCEPT names block size {block}, not in {MIN_BLOCK_SIZE}..{block_size}"
        )
    if max(requested) >= piece_count:
        raise RemoteProtocolError(f"the artifact has only {piece_count} pieces")
    if not set(missing) <= set(requested):
        raise RemoteProtocolError("ACCEPT lists a piece we did not ask for")
    return Accepted(piece_size, piece_count, total, block, rate, missing)
