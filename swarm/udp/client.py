"""The UDP transfer client (asyncio edge of :mod:`swarm.udp.receiver`).

:func:`fetch_pieces` pulls pieces of one artifact from one server and hands each complete
piece to ``on_piece``, which checks its hash (the sink) and returns False to have it sent
again. :func:`fetch_pieces_sync` runs the same in a private event loop, for the daemon's
source threads::

    stats = fetch_pieces_sync(
        "10.0.0.5", 7881, secret, manifest.info_hash_hex, sink.missing(),
        on_piece=lambda i, data: sink.offer(i, data, "udp"),
        piece_size=manifest.piece_size, piece_count=manifest.piece_count,
        rate_bps=1_000_000_000, cancel=cancel_event,
    )

Pieces the server does not have come back in ``stats.unavailable``; pieces whose hash
failed :data:`~swarm.udp.protocol.MAX_PIECE_ATTEMPTS` times in ``stats.failed``.

The data socket (:class:`~swarm.udp.datapath.DataSocket`) is connected to the server, set
"don't fragment", and asks for UDP GRO: one readable event drains up to 64 receives, each
a batch of datagrams, and the machine is fed whole batches (events are handled once per
readable event, not per datagram). The block size asked for fits the route's MTU.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from swarm.netconnect import race_connect
from swarm.udp import protocol as p
from swarm.udp.api import (
    CONNECT_TIMEOUT,
    DEFAULT_RATE_BPS,
    FetchStats,
    UdpAuthError,
    UdpError,
)
from swarm.udp.datapath import RECV_BUDGET, DataSocket, route_mtu

STALL_TIMEOUT = 10.0
"""Seconds without a new block (or, before that, without a validated path) before giving
up: UDP is probably filtered between the two hosts."""


DRAIN_TURNS = 4
"""Receive budgets (64 receives each) the client drains before a REPORT."""


class _Fetch:
    def __init__(
        self,
        session: p.ClientSession,
        on_piece: Callable[[int, bytes | bytearray], bool],
        stall_timeout: float,
        gro: bool = True,
        progress: Callable[[p.ReceiverStats], None] | None = None,
        held: Callable[[int], bool] | None = None,
    ) -> None:
        self.session = session
        self.held = held
        self.gro = gro
        self.progress = progress
        self.on_piece = on_piece
        self.stall_timeout = stall_timeout
        self.writer: asyncio.StreamWriter | None = None
        self.data: DataSocket | None = None
        self.error: BaseException | None = None
        self.wake = asyncio.Event()
        self.timer_wake = asyncio.Event()
        self.refused: str | None = None
        self.checks: set[asyncio.Future[bool]] = set()
        # One thread: the sink sees pieces one at a time, in arrival order, and hashing
        # (which releases the GIL) overlaps with receiving.
        self.sink = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="udp-sink")
        self.last_block = self.started = time.monotonic()

    async def request_when_dealt(self, dealt: concurrent.futures.Future[Sequence[int]]) -> None:
        """Ask for the pieces the caller deals (a session opened before they were known:
        its handshake and path probe overlap the dealing); none: end the session."""
        pieces = await asyncio.wrap_future(dealt)
        if pieces:
            self.session.request(list(pieces))
            self.last_block = self.started = time.monotonic()  # its time runs from here
        else:
            self.session.cancel()
        self.handle_events()
        self.timer_wake.set()
        self.wake.set()

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.wake.set()

    def flush(self) -> None:
        out = self.session.data_to_send()
        if out and self.writer is not None and not self.writer.is_closing():
            self.writer.write(out)

    def handle_events(self) -> None:
        loop = asyncio.get_running_loop()
        for event in self.session.events():
            if isinstance(event, p.PieceReceived):
                future = loop.run_in_executor(self.sink, self.on_piece, event.index, event.data)
                self.checks.add(future)
                future.add_done_callback(functools.partial(self._recheck, event.index, event.data))
            elif isinstance(event, p.Refused):
                self.refused = event.reason
            elif isinstance(event, p.PeerError):
                self.fail(UdpError(f"the UDP server closed the transfer: {event.reason}"))
            elif isinstance(event, p.TransferDone):
                self.wake.set()
            elif isinstance(event, p.Accepted | p.Authenticated):
                self.timer_wake.set()  # probe the UDP path now, not at the next tick
        self.flush()

    def _recheck(self, index: int, data: bytes | bytearray, future: asyncio.Future[bool]) -> None:
        self._checked(future, index, data)

    def _checked(self, future: asyncio.Future[bool], index: int, data: bytes | bytearray) -> None:
        self.checks.discard(future)
        self.session.recycle(data)  # on_piece returned: the buffer is ours again
        try:
            ok = bool(future.result())
        except Exception as error:  # the sink failed (disk full...): stop, report it
            self.fail(error)
            return
        try:
            self.session.piece_checked(index, ok)
        except p.LocalProtocolError as error:
            self.fail(error)
            return
        self.handle_events()

    def on_readable(self, budget: int = RECV_BUDGET) -> bool:
        """Feed the machine up to ``budget`` receives; True if the socket is now empty."""
        data, session = self.data, self.session
        if data is None or self.error is not None:
            return True
        before = session.stats.bytes
        empty = False
        try:
            for _ in range(budget):
                received = data.receive()
                if received is None:
                    empty = True
                    break
                view, size, segment, _ = received
                if size:
                    session.receive_batch(view, size, segment)
        except p.RemoteProtocolError as error:
            self.fail(UdpError(f"the UDP server sent a bad block: {error}"))
            return True
        if session.stats.bytes != before:
            self.last_block = time.monotonic()
        self.handle_events()
        return empty

    async def read_loop(self, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(1 << 16)
            if not data:
                if not self.session.done:
                    self.fail(UdpError("the UDP server closed the control connection"))
                self.wake.set()
                return
            self.session.receive_control(data, loop.time())
            self.handle_events()
            if self.session.state is p.ClientState.DONE and not self.checks:
                self.wake.set()

    async def timer_loop(self, cancel: threading.Event | None) -> None:
        loop = asyncio.get_running_loop()
        session = self.session
        while not session.done:
            # A block still in the socket buffer must not be NAKed as lost (the control
            # channel's PROGRESS may be read before datagrams that preceded it on the
            # wire): catch up first, or tell the machine we could not (a bounded drain,
            # so the sink's verdicts and the control channel get their turn).
            caught_up = False
            for _ in range(DRAIN_TURNS):
                if self.on_readable():
                    caught_up = True
                    break
            now = loop.time()
            if self.held is not None:
                held = self.held
                session.skip([i for i in session.outstanding_pieces() if held(i)])
            reports = session.stats.reports
            for datagram in session.handle_timer(now, caught_up):
                if self.data is not None:
                    with contextlib.suppress(OSError):  # lost like any datagram: resent
                        self.data.sock.send(datagram)
            self.handle_events()
            if self.progress is not None and session.stats.reports != reports:
                self.progress(session.stats)
            if cancel is not None and cancel.is_set():
                session.cancel()
                self.handle_events()
                return
            if time.monotonic() - self.last_block > self.stall_timeout:
                state = (
                    "validate the UDP path" if session.state is p.ClientState.PROBING else "send"
                )
                raise UdpError(
                    f"the UDP server did not {state} for {self.stall_timeout:g}s: "
                    "check that UDP (not only TCP) is allowed to its port"
                )
            due = session.next_timer()
            delay = 0.1 if due is None else min(0.1, max(0.0, due - loop.time()))
            self.timer_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.timer_wake.wait(), delay)


async def fetch_pieces(
    host: str,
    port: int,
    secret: bytes,
    info_hash_hex: str,
    pieces: Sequence[int] | concurrent.futures.Future[Sequence[int]],
    on_piece: Callable[[int, bytes | bytearray], bool],
    *,
    piece_size: int | None = None,
    piece_count: int | None = None,
    rate_bps: int = DEFAULT_RATE_BPS,
    block_size: int | None = None,
    timeout: float | None = None,
    stall_timeout: float = STALL_TIMEOUT,
    cancel: threading.Event | None = None,
    gro: bool = True,
    progress: Callable[[p.ReceiverStats], None] | None = None,
    held: Callable[[int], bool] | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> FetchStats:
    """Fetch ``pieces`` of the artifact ``info_hash_hex`` from the server at ``host:port``.
    ``pieces`` may be a future the caller completes later: the session connects,
    authenticates and proves its UDP path meanwhile, and asks for them once they are
    dealt (an empty list ends it).

    ``on_piece(index, data)`` runs in a worker thread, one piece at a time (``data`` is
    reused once it returns: copy what must outlive the call); it returns False when the
    piece's hash does not match (the piece is then sent again, up to
    :data:`~swarm.udp.protocol.MAX_PIECE_ATTEMPTS` times). ``piece_size``/``piece_count``,
    when given, must match the server's artifact. ``block_size`` (payload bytes per
    datagram) defaults to the largest that fits our route's MTU, and is lowered to it if
    larger. ``timeout`` bounds the whole fetch; setting ``cancel`` stops it cleanly (pieces
    kept so far stay kept). ``gro=False`` receives datagrams one by one (as on a kernel
    without UDP GRO). ``progress(stats)`` runs in the event loop after each REPORT (every
    50 ms while data flows): ``stats.bytes`` counts payload received so far, duplicates
    included (a rate for ``bytes_by_source``); it must return quickly. ``held(index)``,
    asked for the pieces still on their way at every tick of the event loop (every 50 ms
    while data flows; it must return quickly), says a piece arrived from another source:
    the server is told to send no more of it (SKIP), and it counts in ``skipped``.
    ``connect_timeout`` bounds the control connection's connect.

    Raises:
        UdpAuthError: the server does not share our fleet secret.
        UdpError: the server is unreachable, broke the protocol, or data stopped flowing.
    """
    key = p.FleetKey(secret)
    dealt, requested = (
        (pieces, None) if isinstance(pieces, concurrent.futures.Future) else (None, list(pieces))
    )
    session = p.ClientSession(
        key,
        os.urandom(p.NONCE_LEN),
        info_hash_hex,
        requested,
        rate_bps,
        _block_for_route(host, port, block_size),
        piece_size,
        piece_count,
    )
    fetch = _Fetch(session, on_piece, stall_timeout, gro, progress, held)
    try:
        async with asyncio.timeout(timeout):
            await _run(fetch, host, port, cancel, connect_timeout, dealt)
    except TimeoutError:
        raise UdpError(f"UDP fetch from {host}:{port} did not finish in {timeout:g}s") from None
    except p.AuthenticationError as error:
        raise UdpAuthError(
            f"udp://{host}:{port}: {error}: set the same SWARM_SECRET on every node"
        ) from None
    except p.RemoteProtocolError as error:
        raise UdpError(f"udp://{host}:{port} broke the protocol: {error}") from None
    except OSError as error:
        raise UdpError(f"cannot reach udp://{host}:{port}: {error}") from None
    finally:
        fetch.sink.shutdown(wait=True, cancel_futures=True)
    stats = session.stats
    plan = session.plan
    data = fetch.data
    return FetchStats(
        kept=list(session.kept),
        failed=list(session.failed),
        unavailable=list(session.unavailable),
        refused=fetch.refused,
        bytes=stats.bytes,
        datagrams=stats.datagrams,
        duplicates=stats.duplicates,
        forged=stats.forged,
        naks=stats.naks,
        hash_failures=stats.hash_failures,
        seconds=time.monotonic() - fetch.started,
        sender_rate_bps=stats.sender_rate_bps if plan is not None else 0,
        block_size=plan.block_size if plan is not None else 0,
        srtt=stats.srtt,
        min_rtt=stats.min_rtt,
        gro=data is not None and data.gro,
        receives=stats.batches,
        skipped=stats.skipped,
    )


def _block_for_route(host: str, port: int, block_size: int | None) -> int:
    """``block_size`` (default: the largest), lowered to fit our route's MTU to ``host``."""
    block = p.DEFAULT_BLOCK_SIZE if block_size is None else block_size
    p.validate_block_size(block)
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    except OSError:
        return block  # unresolvable: the connection fails next, with its own message
    mtu = route_mtu(str(address[0]), port, family)
    if mtu is None:
        return block
    return min(block, p.block_size_for_mtu(mtu, family == socket.AF_INET6))


async def _run(
    fetch: _Fetch,
    host: str,
    port: int,
    cancel: threading.Event | None,
    connect_timeout: float,
    dealt: concurrent.futures.Future[Sequence[int]] | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    # two SYNs at once (swarm.netconnect): a session's start is not held a second by one lost
    sock = await loop.run_in_executor(None, race_connect, (host, port), connect_timeout)
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    fetch.writer = writer
    server_ip = writer.get_extra_info("peername")[0]
    family = writer.get_extra_info("socket").family
    sock = socket.socket(family, socket.SOCK_DGRAM)
    tasks: list[asyncio.Task[None]] = []
    reading = False
    try:
        # A connected socket: the kernel drops datagrams from any other source address.
        sock.connect((server_ip, port))
        fetch.data = DataSocket(sock, gso=False, gro=fetch.gro)
        loop.add_reader(sock.fileno(), fetch.on_readable)
        reading = True
        fetch.flush()
        tasks = [
            asyncio.ensure_future(fetch.read_loop(reader)),
            asyncio.ensure_future(fetch.timer_loop(cancel)),
        ]
        if dealt is not None:
            tasks.append(asyncio.ensure_future(fetch.request_when_dealt(dealt)))

        def failed(task: asyncio.Future[Any]) -> None:
            error = None if task.cancelled() else task.exception()
            if error is not None:
                fetch.fail(error)

        for task in tasks:
            task.add_done_callback(failed)
        while fetch.error is None and not (fetch.session.done and not fetch.checks):
            fetch.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fetch.wake.wait(), 0.5)
        if fetch.error is not None:
            raise fetch.error
        # Wait briefly for BYE so the server logs a clean end; the data is complete anyway.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tasks[0], 1.0)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if reading:
            loop.remove_reader(sock.fileno())
        sock.close()
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)


def fetch_pieces_sync(*args: object, **kwargs: object) -> FetchStats:
    """:func:`fetch_pieces` in a private event loop: call it from a source thread (not from
    a thread already running an event loop). Pass ``cancel=threading.Event()`` to be able
    to stop it from another thread."""
    return asyncio.run(fetch_pieces(*args, **kwargs))  # type: ignore[arg-type]
