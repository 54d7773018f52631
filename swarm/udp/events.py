"""What the transfer machines tell their edges (:meth:`events`), oldest first."""

from __future__ import annotations

from dataclasses import dataclass


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
    """Client side: check the piece, then call :meth:`ClientSession.piece_checked`.

    ``data`` is the buffer the blocks were decrypted into (no copy). The machine writes into
    it again only after the edge gives it back with :meth:`ClientSession.recycle`."""

    index: int
    data: bytes | bytearray


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
