"""The daemon's process: one per SWARM_HOME (a lock), its local API, UDP server and
loops (reporter, watchdog, Auto Scaling group peers), until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn

from swarm.agent import memory
from swarm.agent.api import ApiServer
from swarm.agent.client import READY_FD_ENV, sock_path
from swarm.agent.daemon import Daemon
from swarm.agent.held import UDP_SERVE_DELAY, DeferredUdpServer, HeldArtifacts
from swarm.agent.pieceserver import PieceServer, start_server
from swarm.agent.reporter import report_loop
from swarm.agent.uplink import UplinkPacer
from swarm.config import Settings
from swarm.errors import SwarmError, UsageError
from swarm.udp.api import DEFAULT_RATE_CAP_BPS, reserve_ports
from swarm.udp.rate import MIN_RATE_BPS
from swarm.udp.wire import DEFAULT_PORT as UDP_PORT

log = logging.getLogger(__name__)

LISTEN_POLL = 0.005
"""Seconds between looks at whether libtorrent listens yet (it binds in its own thread,
within a few ms of the session's start: at 0.05 a start waited 25 ms on average here)."""

WATCH_INTERVAL = 1.0
"""Seconds between checks that every seeded file is still the one verified, and that
every fetch keeps up with its fleet (:mod:`swarm.agent.catchup`). One second, not two:
a trailing node then holds its uploads back a second sooner on average, and mixed at a
quarter of its rates took 34.81-36.39 s (mean 35.63) against 35.72-37.33 (36.64), four
alternating pairs."""


def hold_lock(home: Path) -> int:
    """One daemon per SWARM_HOME: an exclusive flock held for the process's life."""
    fd = os.open(home / "daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SwarmError(f"swarm: a daemon already runs for {home}") from None
    return fd


async def asg_loop(daemon: Daemon, group: str, port: int) -> None:
    """Connect to the group's instances as peers, again every ``REFRESH_SECONDS``."""
    from swarm.sources.asg import REFRESH_SECONDS, asg_peer_ips

    loop = asyncio.get_running_loop()
    while True:
        try:
            ips = await loop.run_in_executor(
                None,
                lambda: asg_peer_ips(group, exclude={daemon.listen_ip}),
            )
            dialled = daemon.connect_peers([(ip, port) for ip in ips])
            log.info("asg %s: %d instances, %d peer connections tried", group, len(ips), dialled)
        except SwarmError as error:
            log.warning("%s", error)
        await asyncio.sleep(REFRESH_SECONDS)


async def watch_loop(daemon: Daemon) -> None:
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(WATCH_INTERVAL)
        try:
            await loop.run_in_executor(None, daemon.watch)
        except Exception:  # the watchdog must outlive one bad check
            log.exception("watching the seeded files failed")


async def wait_listening(daemon: Daemon, port: int, timeout: float = 3.0) -> bool:
    """True once libtorrent listens on ``port`` (it binds in the background)."""
    deadline = time.monotonic() + timeout
    while daemon.session.listen_port != port:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(LISTEN_POLL)
    return True


def tell_ready() -> None:
    """Tell the ``swarm fetch`` that forked this daemon that it serves (one byte on the
    pipe named by :data:`READY_FD_ENV`); nothing when started otherwise."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is None:
        return
    with contextlib.suppress(OSError, ValueError):
        os.write(int(fd), b"1")
        os.close(int(fd))


async def serve(
    settings: Settings,
    listen_ip: str,
    port: int,
    on_ready: Callable[[Daemon], Awaitable[None]] | None = None,
    peers_from_asg: str | None = None,
    udp_port: int = UDP_PORT,
    upload_limit: int = 0,
) -> None:
    """Run the daemon until SIGTERM or SIGINT; ``on_ready`` runs once it serves (seeders).
    ``upload_limit`` (bytes/s, 0 = none) caps BitTorrent's uploads and is the UDP
    server's send budget, shared among its sessions (else a 1 Gbit/s NIC's worth)."""
    memory.keep_piece_buffers()
    settings.home.mkdir(parents=True, exist_ok=True)
    lock = hold_lock(settings.home)
    daemon = Daemon(settings, listen_ip, port, upload_limit)

    def refuse(message: str) -> NoReturn:
        daemon.close()
        os.close(lock)
        raise UsageError(message)

    if port and not await wait_listening(daemon, port):
        refuse(
            f"swarm: cannot listen on {listen_ip}:{port} (in use by another daemon or "
            "BitTorrent client?): stop it, or give this node another --listen IP or --port"
        )
    udp_key = daemon.udp_secret if udp_port else None  # None: this daemon serves no UDP
    udp_budget = upload_limit * 8 if upload_limit else DEFAULT_RATE_CAP_BPS
    if udp_key is not None and udp_budget < MIN_RATE_BPS:
        refuse(
            f"swarm: --upload-limit {upload_limit} bytes/s is below the least rate a UDP "
            f"session sends at ({MIN_RATE_BPS // 8} bytes/s): raise it, or turn UDP off "
            "with --udp-port 0"
        )
    reserved: tuple[socket.socket, socket.socket] | None = None
    if udp_key is not None:
        try:
            reserved = reserve_ports(listen_ip, udp_port)
        except OSError as error:
            refuse(
                f"swarm: cannot serve UDP on {listen_ip}:{udp_port} ({error.strerror}): "
                "stop what holds it, give this node another --udp-port, or turn UDP off "
                "with --udp-port 0"
            )
        daemon.udp_port = udp_port
    # The marker exists only between a clean close and the next start: its absence means
    # the last daemon died (kill -9, power loss) and its resume data may lie.
    marker = settings.home / "clean-shutdown"
    clean = marker.exists()
    marker.unlink(missing_ok=True)
    if not clean and any((settings.home / "artifacts").glob("*.swarm")):
        log.info("previous daemon did not stop cleanly: verifying data files")
    daemon.restore(clean)
    sock = sock_path(settings.home)
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    loop = asyncio.get_running_loop()
    api = ApiServer(daemon, sock, loop)
    api.start()
    (settings.home / "daemon.pid").write_text(str(os.getpid()))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    wake = asyncio.Event()
    daemon.wake_reporter = lambda: loop.call_soon_threadsafe(wake.set)
    tasks: list[asyncio.Task[None]] = [asyncio.create_task(watch_loop(daemon))]
    pacer = None
    if daemon.link_interface is not None:  # (the daemon found it: UplinkPacer.for_address)
        pacer = UplinkPacer(
            daemon.link_interface, daemon.session.peer_endpoints, daemon.fetching,
            daemon.fleet_down,
        )  # fmt: skip
        pacer.start()
    if settings.coordinator:
        tasks.append(asyncio.create_task(report_loop(daemon, wake)))

    def start_asg(group: str) -> None:
        def start() -> None:
            tasks.append(asyncio.create_task(asg_loop(daemon, group, port)))

        loop.call_soon_threadsafe(start)

    daemon.start_asg = start_asg
    if peers_from_asg:
        daemon.asg_groups.add(peers_from_asg)
        start_asg(peers_from_asg)
    held = HeldArtifacts(daemon)  # what the UDP and piece servers serve
    udp: DeferredUdpServer | None = None
    udp_task: asyncio.Task[None] | None = None
    if udp_key is not None and reserved is not None:
        udp = DeferredUdpServer(udp_key, held, reserved, listen_ip, udp_port, udp_budget)
        if not upload_limit:  # the operator's budget stands; else the measured link's
            daemon.on_link = udp.follow_link
        # a daemon that holds artifacts already (a seeder's restart) serves them at once
        udp_task = asyncio.create_task(udp.run(0.0 if daemon.artifacts else UDP_SERVE_DELAY))
    pieces: PieceServer | None = None
    access = daemon.piece_access()  # the rule new nodes pull by (swarm.agent.seedershare)
    if access is not None:

        async def serve_pieces(delay: float) -> None:  # as the UDP server: not at the start
            nonlocal pieces
            await asyncio.sleep(delay)
            pieces = start_server(listen_ip, access.port, access.token, held)

        tasks.append(
            asyncio.create_task(serve_pieces(0.0 if daemon.artifacts else UDP_SERVE_DELAY))
        )
    if on_ready:
        tasks.append(asyncio.create_task(on_ready(daemon)))  # type: ignore[arg-type]
    log.info("daemon %s listening on %s:%d", daemon.node_id, listen_ip, daemon.session.listen_port)
    tell_ready()
    try:
        await stop.wait()
        log.info("stopping: saving resume data")
    finally:
        for task in tasks:
            task.cancel()
        if pacer is not None:
            pacer.stop()
        if udp_task is not None:
            udp_task.cancel()
            await asyncio.gather(udp_task, return_exceptions=True)
        if udp is not None:
            await udp.close()
        if pieces is not None:
            await loop.run_in_executor(None, pieces.stop)
        # A stop does not wait for API requests still in flight (a fetch request blocked
        # on an S3 endpoint that never answers): their threads are daemon threads.
        await loop.run_in_executor(None, api.stop)
        await loop.run_in_executor(None, daemon.close)
        marker.write_text(str(os.getpid()))
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        os.close(lock)
        log.info("stopped")
        # Everything worth keeping is saved. Threads still blocked in an S3 read or a
        # retry's backoff would hold the interpreter's exit (and systemd's stop) for as
        # long as their timeouts: leave now.
        logging.shutdown()
        os._exit(0)
