"""The UDP transfer server (asyncio edge of :mod:`swarm.udp.sender`).

Every daemon serves the pieces it holds: TCP control and UDP data on the same port number
(default 7881). One :class:`~swarm.udp.sender.ServerSession` per control connection; one
UDP socket for all sessions (:class:`~swarm.udp.datapath.DataSocket`), demultiplexed by
the session id in each datagram. A session's pacer hands over batches of sealed datagrams,
each sent with one ``sendmsg`` (UDP GSO); blocks fit the route's MTU (no IP fragments).

What the server guarantees whatever a client does:

- nothing is read or sent before the client proved the fleet secret;
- a request names an info-hash, looked up in the :class:`~swarm.udp.pieces.PieceProvider`;
  never a path;
- data goes only to the control connection's IP, at the UDP port a sealed PROBE came from;
  an unauthenticated datagram gets no answer at all (0 bytes: no reflection, no
  amplification), and a forged one is counted in :attr:`UdpServer.forged_datagrams`;
- the sum of all sessions' rates stays under ``rate_cap_bps`` (an equal share each).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import deque

from swarm.netconnect import handshake_rtt
from swarm.udp import protocol as p
from swarm.udp.api import DEFAULT_RATE_CAP_BPS, reserve_ports
from swarm.udp.datapath import (
    GSO_MAX_BYTES,
    RECV_BUDGET,
    SOCKET_BUFFER,
    DataSocket,
    route_mtu,
    tune_buffers,
)
from swarm.udp.pieces import ArtifactPieces, PieceProvider

log = logging.getLogger(__name__)

MAX_SESSIONS = 32
HANDSHAKE_TIMEOUT = 10.0
"""Seconds from TCP accept to a validated UDP path; then the connection is closed."""
BATCHES_PER_TURN = 16
"""Batches sealed per turn of a session's pacer before they are sent (and their buffers
recycled): up to 1,024 datagrams, 16 x 64 KiB. More is due at once after a late wake: the
next turn follows without sleeping."""
IDLE_TIMEOUT = 30.0
"""Seconds without a control frame from the client (it reports every 50 ms)."""


class _Conn:
    """One control connection and its session."""

    def __init__(
        self, server: UdpServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.spoke = False  # any control bytes yet (sessions_total counts those)
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}"
        self.family = writer.get_extra_info("socket").family
        data = server._data
        assert data is not None
        self.session = p.ServerSession(
            server._key,
            os.urandom(p.NONCE_LEN),
            peer[0],
            server.rate_cap_bps,
            max_batch_segments=data.max_segments,
            max_batch_bytes=GSO_MAX_BYTES,
            wake_bytes=GSO_MAX_BYTES,
        )
        self.wake = asyncio.Event()
        self.artifact: ArtifactPieces | None = None
        self.closing = False
        self.backlog: deque[p.Batch] = deque()

    def flush(self) -> None:
        out = self.session.data_to_send()
        if out and not self.writer.is_closing():
            self.writer.write(out)

    def fail(self, reason: str) -> None:
        self.session.send_error(reason)
        self.closing = True
        self.flush()
        self.wake.set()

    def handle_events(self) -> None:
        server, session = self.server, self.session
        for event in session.events():
            if isinstance(event, p.Authenticated):
                if event.session_id in server._sessions:
                    session.send_error("session id collision, retry")
                    continue
                server._sessions[event.session_id] = self
            elif isinstance(event, p.RequestReceived):
                self._decide(event)
            elif isinstance(event, p.NeedPieces):
                for index in event.pieces:
                    asyncio.get_running_loop().create_task(self._load(index))
            elif isinstance(event, p.PathValidated):
                log.info("udp: sending to %s:%d", *event.addr)
                self.wake.set()
            elif isinstance(event, p.TransferDone | p.PeerError):
                self.closing = True
                self.wake.set()
        self.flush()

    def _decide(self, request: p.RequestReceived) -> None:
        server, session = self.server, self.session
        artifact = server.provider.lookup(request.info_hash_hex)
        if artifact is None:
            server.refused += 1
            session.refuse(p.RefuseCode.UNKNOWN_ARTIFACT, "no artifact with this info-hash here")
            self.closing = True
            return
        if max(request.pieces) >= artifact.piece_count:
            server.refused += 1
            session.refuse(
                p.RefuseCode.BAD_REQUEST, f"the artifact has {artifact.piece_count} pieces"
            )
            self.closing = True
            return
        if artifact.piece_size > p.MAX_PIECE_SIZE:
            session.refuse(p.RefuseCode.BAD_REQUEST, "piece size too large for UDP transfer")
            self.closing = True
            return
        self.artifact = artifact
        have = [i for i in request.pieces if artifact.has(i)]
        gone = [i for i in request.pieces if not artifact.has(i)]
        block = min(request.block_size, server.max_block_size)
        mtu = route_mtu(session.peer_ip, server.port, self.family)
        if mtu is not None:
            # Our route to the client may have a smaller MTU than its route to us.
            block = min(block, p.block_size_for_mtu(mtu, self.family == socket.AF_INET6))
        session.accept(
            artifact.piece_size, artifact.total_size, have, gone, request.rate_bps, block,
            path_rtt=handshake_rtt(self.writer.get_extra_info("socket")),
        )  # fmt: skip
        server._sending.add(self)
        server._share_cap()

    async def _load(self, index: int) -> None:
        assert self.artifact is not None
        loop = asyncio.get_running_loop()
        try:
            data = await loop.run_in_executor(None, self.artifact.read, index)
        except OSError as error:
            log.warning("udp: cannot read piece %d: %s", index, error)
            self.fail("server cannot read a piece")
            return
        if not self.session.closed:
            self.session.piece_loaded(index, data)
            self.handle_events()
            self.wake.set()

    async def read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.closing:
            timeout = (
                HANDSHAKE_TIMEOUT
                if self.session.state is p.ServerState.AWAIT_HELLO
                else self.server.idle_timeout
            )
            try:
                data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
            except TimeoutError:
                log.info("udp: %s idle, closing", self.peer)
                return
            if not data:
                return
            if not self.spoke:
                # a session from its first bytes: a connect raced by the client (two
                # SYNs, swarm.netconnect) whose other won closes before it says anything
                self.spoke = True
                self.server.sessions_total += 1
            try:
                self.session.receive_control(data, loop.time())
            except p.AuthenticationError as error:
                self.server.auth_failures += 1
                log.warning("udp: %s: %s", self.peer, error)
                self.session.send_error(str(error))
                self.flush()
                return
            except p.RemoteProtocolError as error:
                log.warning("udp: %s: %s", self.peer, error)
                self.session.send_error(str(error))
                self.flush()
                return
            self.handle_events()
            self.wake.set()

    def _send(self, addr: tuple[str, int]) -> bool:
        """Send the backlog; False if the socket is full (wait until writable)."""
        data = self.server._data
        assert data is not None
        backlog = self.backlog
        while backlog:
            batch = backlog[0]
            if not data.send_batch(batch, addr):
                return False
            backlog.popleft()
            self.server.bytes_sent += len(batch.data)
            self.session.recycle(batch)
        return True

    async def pace_loop(self) -> None:
        loop = asyncio.get_running_loop()
        session, server = self.session, self.server
        deadline = loop.time() + HANDSHAKE_TIMEOUT
        while not self.closing:
            if server._data is None:
                return
            if session.state is not p.ServerState.SENDING:
                if loop.time() > deadline:
                    log.info("udp: %s did not validate its UDP path in time", self.peer)
                    return
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), 0.5)
                continue
            addr = session.data_addr
            assert addr is not None
            try:
                if not self._send(addr):
                    await server._wait_writable()
                    continue
                self.backlog.extend(
                    session.handle_timer_batches(loop.time(), max_batches=BATCHES_PER_TURN)
                )
                sent = self._send(addr)
            except OSError as error:
                # EMSGSIZE: a block larger than the route's MTU (the MTU shrank mid-transfer).
                log.warning("udp: cannot send to %s:%d: %s", *addr, error)
                self.fail(f"server cannot send: {error.strerror or error}")
                return
            self.handle_events()
            if not sent:
                await server._wait_writable()
                continue
            due = session.next_timer(loop.time())
            if due is None:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), 0.5)
            else:
                await asyncio.sleep(max(0.0, due - loop.time()))

    async def run(self) -> None:
        reader = asyncio.ensure_future(self.read_loop())
        pacer = asyncio.ensure_future(self.pace_loop())
        try:
            await asyncio.wait({reader, pacer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.closing = True
            for task in (reader, pacer):
                task.cancel()
            for task in (reader, pacer):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self.flush()
            self.server._forget(self)
            with contextlib.suppress(Exception):
                self.writer.close()
                await asyncio.wait_for(self.writer.wait_closed(), 1.0)


class UdpServer:
    """Serves pieces from ``provider`` over TCP control + UDP data on ``host:port``.

    ``secret`` is the fleet secret (``SWARM_SECRET``); there is no default, and without one
    the daemon must not start this server. ``port=0`` picks a free port (tests); TCP and
    UDP then share it. ``gso=False`` sends datagrams one by one (as on a kernel without
    UDP GSO).
    """

    def __init__(
        self,
        secret: bytes,
        provider: PieceProvider,
        host: str = "0.0.0.0",
        port: int = p.DEFAULT_PORT,
        rate_cap_bps: int = DEFAULT_RATE_CAP_BPS,
        max_sessions: int = MAX_SESSIONS,
        max_block_size: int = p.MAX_BLOCK_SIZE,
        idle_timeout: float = IDLE_TIMEOUT,
        gso: bool = True,
    ) -> None:
        self._key = p.FleetKey(secret)
        if rate_cap_bps < p.MIN_RATE_BPS:
            raise ValueError(f"rate_cap_bps must be >= {p.MIN_RATE_BPS}, got {rate_cap_bps}")
        p.validate_block_size(max_block_size)
        self.provider = provider
        self.host = host
        self.port = port
        self.rate_cap_bps = rate_cap_bps
        self.max_sessions = max_sessions
        self.max_block_size = max_block_size
        self.idle_timeout = idle_timeout
        self.gso = gso
        self._tcp: asyncio.Server | None = None
        self._data: DataSocket | None = None
        self._writable: asyncio.Event | None = None
        self._writer_armed = False
        self._sessions: dict[bytes, _Conn] = {}
        self._conns: set[_Conn] = set()
        self._sending: set[_Conn] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # counters
        self.forged_datagrams = 0
        self.bytes_sent = 0
        self.sessions_total = 0
        self.auth_failures = 0
        self.refused = 0
        self.rejected_busy = 0
        self.finished: deque[p.SenderStats] = deque(maxlen=16)
        """The sender stats of the last sessions that ended (newest last)."""

    @property
    def sessions_active(self) -> int:
        return len(self._conns)

    @property
    def gso_active(self) -> bool:
        """Whether sends are batched by UDP GSO (False on kernels without it)."""
        return self._data is not None and self._data.gso

    async def start(self, reserved: tuple[socket.socket, socket.socket] | None = None) -> None:
        """Serve on the sockets :func:`swarm.udp.api.reserve_ports` bound, ``reserved``
        earlier or here on ``host:port``; this server owns them from here (and closes them
        if it cannot start)."""
        loop = asyncio.get_running_loop()
        listener, sock = reserved if reserved is not None else reserve_ports(self.host, self.port)
        try:
            self._tcp = await asyncio.start_server(self._on_connection, sock=listener)
        except BaseException:
            listener.close()
            sock.close()
            raise
        self.port = listener.getsockname()[1]
        try:
            # Only PROBEs arrive here: no GRO needed.
            self._data = DataSocket(sock, gso=self.gso, gro=False)
            loop.add_reader(sock.fileno(), self._on_readable)
        except BaseException:
            sock.close()
            self._data = None
            self._tcp.close()
            raise
        self._writable = asyncio.Event()
        log.info(
            "udp: serving on %s:%d (cap %.0f Mbit/s, GSO %s)",
            self.host,
            self.port,
            self.rate_cap_bps / 1e6,
            "on" if self._data.gso else "off",
        )

    async def close(self) -> None:
        if self._tcp is not None:
            self._tcp.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._tcp is not None:
            with contextlib.suppress(Exception):
                await self._tcp.wait_closed()
        if self._data is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self._data.fileno())
            loop.remove_writer(self._data.fileno())
            self._data.close()
            self._data = None

    async def __aenter__(self) -> UdpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if len(self._conns) >= self.max_sessions or self._data is None:
            # Before authentication there is nothing to say safely; the client retries later.
            self.rejected_busy += 1
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        conn = _Conn(self, reader, writer)
        self._conns.add(conn)
        try:
            await conn.run()
        except asyncio.CancelledError:
            # close() cancels sessions in flight; conn.run has cleaned up. Ending quietly
            # spares the daemon's log asyncio's "Exception in callback" at every stop.
            pass
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]

    def _forget(self, conn: _Conn) -> None:
        if conn.session.stats.datagrams:
            self.finished.append(conn.session.stats)
        self._conns.discard(conn)
        self._sending.discard(conn)
        if conn.session.session_id:
            self._sessions.pop(conn.session.session_id, None)
        self._share_cap()

    def set_rate_cap(self, rate_cap_bps: float) -> None:
        """A new budget for all sessions together (at least :data:`MIN_RATE_BPS`), shared
        among the sending ones at once. Told the node's measured link, a seeder stops
        sending four far sessions into a 1 Gbit/s budget over a 200 Mbit/s uplink, where
        10-35% of every session's datagrams were lost in its queue."""
        cap = max(p.MIN_RATE_BPS, int(rate_cap_bps))
        if abs(cap - self.rate_cap_bps) > 0.1 * self.rate_cap_bps:
            log.info(
                "udp: sending budget %.0f Mbit/s (was %.0f)", cap / 1e6, self.rate_cap_bps / 1e6
            )
        self.rate_cap_bps = cap
        self._share_cap()

    def _share_cap(self) -> None:
        if self._sending:
            share = self.rate_cap_bps / len(self._sending)
            for conn in self._sending:
                conn.session.set_rate_cap(share)

    async def _wait_writable(self) -> None:
        """Until the UDP socket has room again (every blocked session wakes)."""
        data, event = self._data, self._writable
        if data is None or event is None:
            return
        loop = asyncio.get_running_loop()
        if not self._writer_armed:
            self._writer_armed = True
            event.clear()

            def writable() -> None:
                loop.remove_writer(data.fileno())
                self._writer_armed = False
                event.set()

            loop.add_writer(data.fileno(), writable)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), 0.5)

    def _on_readable(self) -> None:
        data = self._data
        if data is None:
            return
        for _ in range(RECV_BUDGET):
            received = data.receive()
            if received is None:
                return
            view, size, _, addr = received
            if size and addr is not None:
                self._on_datagram(bytes(view[:size]), addr)

    def _on_datagram(self, data: bytes, addr: tuple[str, int]) -> None:
        session_id = p.peek_session_id(data)
        conn = self._sessions.get(session_id) if session_id is not None else None
        if conn is None:
            self.forged_datagrams += 1
            return
        if not conn.session.receive_datagram(data, addr):
            self.forged_datagrams += 1
            return
        conn.handle_events()


__all__ = [
    "DEFAULT_RATE_CAP_BPS",
    "SOCKET_BUFFER",
    "UdpServer",
    "tune_buffers",
]
