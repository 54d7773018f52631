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

The handshake: :mod:`swarm.udp.handshake`; datagrams into piece buffers:
:mod:`swarm.udp.intake`; loss detection and NAKs: :mod:`swarm.udp.loss`; piece buffers and
checks: :mod:`swarm.udp.assembly`; the request and its grant: :mod:`swarm.udp.request`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from swarm.udp.assembly import PieceAssembly
from swarm.udp.control import ControlChannel
from swarm.udp.crypto import AESGCM, FleetKey, Sealer
from swarm.udp.events import (
    Authenticated,
    Event,
    PeerError,
    Progress,
    Refused,
    TransferDone,
)
from swarm.udp.handshake import ClientHandshake, seal_probe
from swarm.udp.intake import BlockIntake
from swarm.udp.loss import LossTracker
from swarm.udp.request import check_pieces, check_request, pack_request, parse_accept
from swarm.udp.wire import (
    ACCEPT,
    DEFAULT_BLOCK_SIZE,
    PROGRESS,
    AuthenticationError,
    BlockPlan,
    LocalProtocolError,
    Msg,
    RemoteProtocolError,
    pack_u32s,
)

REPORT_INTERVAL = 0.05
"""Seconds between receiver REPORTs: the rate's control period. Short enough to react to a
queue filling within a few intervals, long enough for ~2,000 datagrams per sample at 1434 B
and 500 Mbit/s, so a loss fraction of a few tenths of a percent is measurable."""
PROBE_INTERVAL = 0.1
"""Seconds between PROBE datagrams until the server confirms the UDP path (PATH_OK)."""
FIRST_PROBE_AFTER = 0.005
"""Seconds after AUTH and REQUEST before the first PROBE: probes start with the keys (the
server validates the path on ACCEPT if one came before), not after ACCEPT, a round trip
later (0.1 s of each far-region session's start). Not at once: a probe that overtakes AUTH
finds no session at the server, and the next one is :data:`PROBE_INTERVAL` later."""
EARLY_DATA_BYTES = 1 << 20
"""Data received before ACCEPT is read (UDP may overtake the control connection once the
server has validated the path early) is kept up to this and taken once ACCEPT is read."""


class ClientState(enum.Enum):
    AWAIT_CHALLENGE = "await challenge"
    AWAIT_PIECES = "await pieces"
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
    skipped: int = 0
    """Pieces skipped (another source brought them first): see :meth:`ClientSession.skip`."""


class ClientSession:
    """The receiving side: authenticates, requests pieces, reassembles and NAKs blocks.

    ``pieces`` None: the session authenticates and proves its UDP path, then waits for
    :meth:`request` (a caller that decides what to ask for while the handshake's round
    trips go by)."""

    def __init__(
        self,
        key: FleetKey,
        client_nonce: bytes,
        info_hash_hex: str,
        pieces: Sequence[int] | None,
        rate_bps: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        piece_size: int | None = None,
        piece_count: int | None = None,
    ) -> None:
        self._handshake = ClientHandshake(key, client_nonce)
        info_hash = check_request(info_hash_hex, pieces, rate_bps, block_size, piece_count)
        self._side = ControlChannel()
        self._info_hash = info_hash
        self._requested = None if pieces is None else list(pieces)
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
        self._early: list[tuple[bytes, int]] = []  # (batch, segment) before ACCEPT
        self._early_bytes = 0
        self._assembly: PieceAssembly | None = None
        """The pieces being received; set by ACCEPT."""
        self._intake: BlockIntake | None = None
        """What takes the data socket's datagrams; set by ACCEPT."""
        self._loss = LossTracker()
        self._next_report = 0.0
        self._side.send_plain(Msg.HELLO, self._handshake.hello)

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
            awaiting_accept = self.state in (ClientState.AWAIT_PIECES, ClientState.AWAIT_ACCEPT)
            self.state = ClientState.DONE
            try:
                reason = side.error_frame(body)
            except RemoteProtocolError:
                if not awaiting_accept:
                    raise
                # A server that rejects our AUTH has no session keys, so it answers in
                # plaintext; a plaintext ERROR is accepted only after our AUTH.
                plain = body.decode("utf-8", "replace")
                raise AuthenticationError(
                    f"the server refused our fleet secret ({plain})"
                ) from None
            side.pending.append(PeerError(reason))
            return
        if self.state is ClientState.AWAIT_CHALLENGE:
            keys, auth = self._handshake.answer(kind, body)
            side.use_keys(keys.control_c2s, keys.control_s2c)
            self._data_aead = AESGCM(keys.data_s2c)
            self._probe = Sealer(keys.data_c2s)
            self.session_id = keys.session_id
            side.send_plain(Msg.AUTH, auth)
            self.state = ClientState.AWAIT_PIECES
            if self._requested is not None:
                self._send_request(self._requested)
            self._next_probe = now + FIRST_PROBE_AFTER
            side.pending.append(Authenticated(self.session_id))
            return
        body = side.open(kind, body)
        if self.state is ClientState.AWAIT_PIECES:
            raise RemoteProtocolError(f"unexpected message type {kind} before our REQUEST")
        if self.state is ClientState.AWAIT_ACCEPT:
            if kind == Msg.REFUSE:
                if not body:
                    raise RemoteProtocolError("empty REFUSE")
                side.pending.append(Refused(body[0], body[1:].decode("utf-8", "replace")))
                self.unavailable = tuple(self._requested or ())
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
                self._loss.sender_pass_done(now, served)
        elif kind == Msg.BYE:
            self.state = ClientState.DONE
        else:
            raise RemoteProtocolError(f"unexpected message type {kind} in {self.state.value}")

    def request(self, pieces: Sequence[int]) -> None:
        """Ask for ``pieces`` (a session made without them): now if the handshake is done,
        else with AUTH."""
        if self._requested is not None or self.state not in (
            ClientState.AWAIT_CHALLENGE,
            ClientState.AWAIT_PIECES,
        ):
            raise LocalProtocolError(f"request() twice or in {self.state.value}")
        check_pieces(pieces, self._expect_piece_count)
        self._requested = list(pieces)
        if self.state is ClientState.AWAIT_PIECES:
            self._send_request(self._requested)

    def _send_request(self, pieces: list[int]) -> None:
        req = pack_request(self._info_hash, self._rate, self._block_size, pieces)
        self._side.send_sealed(Msg.REQUEST, req)
        self.state = ClientState.AWAIT_ACCEPT

    def _on_accept(self, body: bytes) -> None:
        assert self._requested is not None
        accepted = parse_accept(
            body,
            self._requested,
            self._block_size,
            self._expect_piece_size,
            self._expect_piece_count,
        )
        self.unavailable = accepted.unavailable
        gone = set(self.unavailable)
        pieces = [p for p in self._requested if p not in gone]
        self.plan = BlockPlan(pieces, accepted.piece_size, accepted.total_size, accepted.block_size)
        self._assembly = PieceAssembly(self.plan)
        assert self._data_aead is not None  # set by CHALLENGE
        self._intake = BlockIntake(
            self.plan,
            self._data_aead,
            self.session_id,
            self._assembly,
            self._loss,
            self.stats,
            self._side,
            self._path_proven,
        )
        self._side.pending.append(accepted)
        if not pieces:
            self._finish()
            return
        # PROBING is entered here only, once, with the intake just made: the intake's
        # latch (on_path_proven once) relies on it; a path probed again would need a
        # fresh intake.
        self.state = ClientState.PROBING
        self._next_probe = 0.0  # once more now: an early probe may have been lost
        early, self._early = self._early, []
        for batch, segment in early:
            self.receive_batch(memoryview(batch), len(batch), segment)

    # data channel
    def receive_batch(self, data: memoryview, size: int, segment: int) -> None:
        """One receive of ``size`` bytes from the data socket: datagrams of ``segment``
        bytes back to back, the last one possibly shorter (a UDP GRO batch; ``segment ==
        size`` for a single datagram). ``data`` may be reused once this returns.

        The blocks go to :class:`~swarm.udp.intake.BlockIntake` (its fast path, and the
        careful one of :meth:`receive_datagram`)."""
        if segment <= 0:
            segment = size
        if self.state is ClientState.AWAIT_ACCEPT:
            if self._early_bytes + size <= EARLY_DATA_BYTES:
                self._early.append((bytes(data[:size]), segment))
                self._early_bytes += size
            return
        self.stats.batches += 1
        if self._intake is None:
            self.stats.forged += len(range(0, size, segment))  # no plan: none is ours
            return
        self._intake.receive_batch(data, size, segment, self._live())

    def receive_datagram(self, data: bytes | memoryview) -> None:
        """A datagram from the data socket. Forged ones are counted in ``stats.forged``."""
        if self._intake is None:
            self.stats.forged += 1  # no plan: it is not ours
            return
        self._intake.receive(memoryview(data), self._live())

    def _live(self) -> bool:
        """Blocks are taken (else only authenticated and counted)."""
        return self.state in (ClientState.PROBING, ClientState.RECEIVING)

    def _path_proven(self) -> None:
        """The first authentic block arrived: it proves the path, PATH_OK or not."""
        if self.state is ClientState.PROBING:
            self.state = ClientState.RECEIVING
            self._next_report = 0.0

    def recycle(self, data: bytes | bytearray) -> None:
        """The edge is done with a :class:`PieceReceived`'s buffer (checked, and copied or
        written where it goes): it may hold the next piece. A fresh 4 MiB buffer per piece
        costs its zeroing and page faults, as much as decrypting into it."""
        if self._assembly is not None:
            self._assembly.recycle(data)

    def piece_checked(self, index: int, ok: bool) -> None:
        """The sink's verdict on a :class:`PieceReceived`; False re-requests the piece."""
        assembly = self._assembly
        if assembly is None:
            raise LocalProtocolError("piece_checked() before ACCEPT")
        again = assembly.checked(index, ok)
        if ok:
            self.kept.append(index)
        else:
            self.stats.hash_failures += 1
            if again is None:
                self.failed.append(index)
            else:
                self._loss.missing_again(again)
        if assembly.all_settled and self.state is not ClientState.DONE:
            self._finish()

    def outstanding_pieces(self) -> list[int]:
        """Accepted pieces not yet whole nor settled: what :meth:`skip` may drop."""
        assembly = self._assembly
        if assembly is None or self.plan is None:
            return []
        busy = assembly.finished | assembly.checking
        return [piece for pos, piece in enumerate(self.plan.pieces) if pos not in busy]

    def skip(self, pieces: Iterable[int]) -> list[int]:
        """Pieces another source brought while this session ran: the server is told
        (SKIP) to send none of their blocks any more, and none are NAKed. Pieces not
        accepted, whole or settled are left alone; returns those skipped. The transfer
        ends once every piece is settled or skipped."""
        assembly, plan = self._assembly, self.plan
        if (
            assembly is None
            or plan is None
            or self.state not in (ClientState.PROBING, ClientState.RECEIVING)
        ):
            return []
        skipped = []
        for piece in pieces:
            pos = plan.position.get(piece)
            if pos is not None and assembly.skip(pos):
                self._loss.skipped(plan.ordinals(pos))
                skipped.append(piece)
        if skipped:
            self.stats.skipped += len(skipped)
            self._side.send_sealed(Msg.SKIP, pack_u32s([len(skipped), *skipped]))
            if assembly.all_settled:
                self._finish()
        return skipped

    def cancel(self) -> None:
        """Stop the transfer (deadline, shutdown): tells the server DONE; a session that
        has asked for nothing yet just ends (its control connection closes)."""
        if self.state in (ClientState.PROBING, ClientState.RECEIVING):
            self._finish()
        elif self._requested is None and self.state is not ClientState.DONE:
            self.state = ClientState.DONE
            self._side.pending.append(TransferDone())

    def _finish(self) -> None:
        self._side.send_sealed(Msg.DONE, b"")
        self.state = ClientState.DONE
        self._side.pending.append(TransferDone())

    def next_timer(self) -> float | None:
        if self._probing():
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
        if self._probing():
            if now < self._next_probe:
                return []
            self._next_probe = now + PROBE_INTERVAL
            return [self._seal_probe()]
        if self.state is not ClientState.RECEIVING or now < self._next_report:
            return []
        self._next_report = now + REPORT_INTERVAL
        self._report(now, caught_up)
        return []

    def _probing(self) -> bool:
        """PROBEs go out from the keys (AUTH sent) until the path is proven."""
        return self.state is ClientState.PROBING or (
            self.state in (ClientState.AWAIT_PIECES, ClientState.AWAIT_ACCEPT)
            and self._probe is not None
        )

    def _seal_probe(self) -> bytes:
        assert self._probe is not None
        return seal_probe(self._probe, self.session_id)

    def _report(self, now: float, caught_up: bool = True) -> None:
        assembly = self._assembly
        assert assembly is not None
        body, naks = self._loss.report(assembly.have, now, caught_up)
        self._side.send_sealed(Msg.REPORT, body)
        self.stats.naks += naks
        self.stats.reports += 1
