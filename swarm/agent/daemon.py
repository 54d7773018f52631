"""The node daemon: one libtorrent session, every artifact it holds, a local API.

``swarm daemon`` runs this in the foreground (systemd); ``swarm fetch`` starts one in
the background when none answers on ``$SWARM_HOME/daemon.sock``. The daemon keeps
seeding whatever it holds: that is how existing instances seed new ones.

State under ``SWARM_HOME``::

    node_id                 this node's stable id (reported to the coordinator)
    daemon.sock daemon.pid  local API (HTTP over a unix socket), pid for stopping it
    daemon.lock             flock: one daemon per home
    artifacts/IH.swarm      manifests of held artifacts (to seed again after a restart)
    resume/IH.resume        libtorrent resume data (atomic writes)
    data/IH/NAME            the artifact's bytes, seeded from here
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import math
import os
import secrets
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import libtorrent as lt
from aiohttp import ClientSession, ClientTimeout, web
from aiohttp.typedefs import Handler

from swarm import catalog
from swarm.agent.client import sock_path
from swarm.agent.hybrid import (
    LocalOriginPolicy,
    TorrentSink,
    bitfield,
    fill_pieces,
    stripe_offset,
    wide_pieces,
)
from swarm.agent.store import ensure_space
from swarm.config import Settings
from swarm.errors import AccessDeniedError, NotFoundError, SwarmError, UsageError
from swarm.fleetauth import bearer, fleet_token, token_matches
from swarm.manifest import Manifest
from swarm.objectstore import make_client
from swarm.policy import Mode
from swarm.sources import Cancelled
from swarm.sources.peers import DEFAULT_PORT, TorrentSession
from swarm.sources.s3 import S3Source, S3SourceConfig
from swarm.udp import DEFAULT_PORT as UDP_PORT
from swarm.udp import MIN_SECRET_LEN, UdpServer, fetch_pieces_sync

log = logging.getLogger(__name__)

ORIGIN_GRACE = 1.0
"""Seconds a new fetch waits for peers before it reads the origin: long enough for the
first announce and handshakes on a LAN, short enough not to matter when there are none."""

ORIGIN_BATCH_BYTES = 32 << 20
"""Bytes read from S3 per decision (two 16 MiB ranges in flight); the choice is made
again after each batch, so pieces that arrive from peers meanwhile are not read twice."""

WIDE_RANGE = 4 << 20
"""Range size of WIDE-mode reads (see ``_read_origin``)."""

STRIPE_RANGE = 4 << 20
"""Range size of stripe reads (rounded to whole pieces): a stripe is read as several GETs
in flight. Each is a TCP flow, and a node's downlink is shared per flow with its peer
connections (one 16 MiB GET got an eighth of the link against 7 peers). Not smaller:
every GET costs a first-byte latency on S3 (tens of ms; AWS advises 8-16 MiB ranges),
and 1 MiB ranges made the demo on moto, which costs ~0.2 s per GET, take 47 s, not 18."""

FILL_PIECES = 1
"""Pieces per *fill* read. Once every piece has left the origin and S3 would add a useful
share (the plan's ``fill``, :func:`swarm.policy.may_fill`), a node with no stripe reads
one rare missing piece at a time from S3 (:func:`~swarm.agent.hybrid.fill_pieces`): one
more TCP flow on its downlink. While the swarm fills the link that flow gets a flow's
share (an eighth against 7 peers); when the swarm is slower (slow uploads, a stalled
tail) it takes the slack. Measured (bench/fleet.py, swarm-bound at 50 Mbit): without it,
nodes stayed at two thirds of their link in the peer phase while the origin sat idle."""

IN_FLIGHT_TTL = 1.0
"""Seconds an :class:`InFlight` answer is reused (a stale one costs at most a duplicate
piece, which libtorrent drops)."""

PLAN_TTL = 3.0
"""A coordinator plan older than this (three missed reports) is stale: the node decides
alone, on its own samples, with the same policy (:mod:`swarm.policy`)."""

ORIGIN_RETRY = 5.0
REPORT_INTERVAL = 1.0
SOURCES = ("s3", "peers")


def node_id(home: Path) -> str:
    path = home / "node_id"
    if not path.exists():
        path.write_text(secrets.token_hex(8))
    return path.read_text().strip()


@dataclass
class Artifact:
    """The daemon's view of one artifact it fetches or seeds."""

    manifest: Manifest
    path: Path
    sink: TorrentSink
    sources: tuple[str, ...] = SOURCES
    cancel: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)
    seconds: float | None = None
    restored: bool = False
    """Held before this daemon started (restored from resume data), not fetched by it."""
    s3_error: str | None = None
    udp_error: str | None = None
    origin_thread: threading.Thread | None = None
    plan: dict[str, Any] | None = None
    """The coordinator's latest origin plan for us: ``{"stripe", "mode", "s3_estimate"}``."""
    plan_at: float = 0.0
    plan_updated: threading.Event = field(default_factory=threading.Event)


class Daemon:
    """Everything one node holds and seeds, behind one libtorrent session."""

    def __init__(
        self,
        settings: Settings,
        listen_ip: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        upload_limit: int = 0,
    ):
        self.settings = settings
        self.home = settings.home
        self.listen_ip = listen_ip
        for sub in ("artifacts", "resume", "data"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        self.node_id = node_id(self.home)
        self.session = TorrentSession(listen_ip, port, self.home / "resume", upload_limit)
        self.artifacts: dict[str, Artifact] = {}
        self._lock = threading.Lock()
        self.wake_reporter: Callable[[], object] = lambda: None
        self.extra_peers: list[tuple[str, int]] = []
        """Peers known without the tracker (``--peers-from-asg``), dialled for every torrent."""
        self.token = fleet_token(settings.secret) if settings.secret else None
        self.udp_secret = udp_secret(settings.secret)
        """With a fleet secret: required on the local API, sent to the coordinator, and
        peers are admitted only if the coordinator lists them as members."""
        coordinator = settings.coordinator
        announce = coordinator.rstrip("/") + "/announce" if coordinator else None
        if announce and self.token:
            announce += f"?token={self.token}"  # trackers take no headers (BEP 3)
        self.trackers = [announce] if announce else []
        if self.token:
            self.session.admit_only([])  # nobody, until the coordinator names the members

    # -- artifacts --------------------------------------------------------------------------

    def restore(self, clean: bool = True) -> None:
        """Seed again everything held before a restart (resume data spares a re-download;
        after an unclean stop, ``clean`` False, the data files are hashed instead)."""
        for path in sorted((self.home / "artifacts").glob("*.swarm")):
            try:
                manifest = Manifest.loads(path.read_bytes(), origin=str(path))
            except SwarmError as error:
                log.warning("skipping %s: %s", path, error)
                continue
            self._add(manifest, sources=("peers",), trust_resume=clean).restored = True
            log.info("restored %s (%s)", manifest.name, manifest.info_hash)

    def _add(
        self, manifest: Manifest, sources: tuple[str, ...], trust_resume: bool = True
    ) -> Artifact:
        with self._lock:
            if manifest.info_hash in self.artifacts:
                return self.artifacts[manifest.info_hash]
            save_dir = self.home / "data" / manifest.info_hash
            save_dir.mkdir(parents=True, exist_ok=True)
            (self.home / "artifacts" / f"{manifest.info_hash}.swarm").write_bytes(manifest.dumps())
            if not (save_dir / manifest.name).exists():
                ensure_space(save_dir, manifest.size)
            state = self.session.add(manifest, save_dir, self.trackers, trust_resume=trust_resume)
            for address in self.extra_peers:
                state.handle.connect_peer(address)
            artifact = Artifact(
                manifest, save_dir / manifest.name, TorrentSink(self.session, manifest), sources
            )
            self.artifacts[manifest.info_hash] = artifact
            return artifact

    def fetch(self, request: dict[str, Any]) -> Artifact:
        """Resolve the source, add the torrent, start the origin reader. Blocking (S3 I/O)."""
        source = request.get("source")
        if not isinstance(source, str) or not source:
            raise UsageError("swarm: the fetch request names no source")
        sources = tuple(request.get("sources") or SOURCES)
        unknown = [s for s in sources if s not in SOURCES and not s.startswith("udp://")]
        if unknown:
            raise UsageError(f"swarm: unknown source(s) {unknown}: use s3, peers, udp://HOST:PORT")
        udp = [parse_udp_source(s) for s in sources if s.startswith("udp://")]
        if udp and not self.udp_secret:
            raise UsageError(
                "swarm: UDP needs the fleet secret: set SWARM_SECRET (16+ bytes, the same on "
                "every node); with no secret UDP is off"
            )
        endpoint = request.get("endpoint_url") or self.settings.endpoint_url
        client = make_client(endpoint)
        url = catalog.resolve(client, source, request.get("catalog") or self.settings.catalog)
        manifest = catalog.load_manifest(client, url, self.settings.secret)
        artifact = self._add(manifest, sources)
        if "peers" not in sources:
            # Forced sources only (--source s3 / udp://): libtorrent uploads, never downloads.
            artifact.sink.handle.set_flags(lt.torrent_flags.upload_mode)
        for host, port in udp:
            if not artifact.sink.complete():
                threading.Thread(
                    target=self._read_udp,
                    args=(artifact, host, port),
                    daemon=True,
                    name=f"udp-{manifest.name}",
                ).start()
        if "s3" in sources and not artifact.sink.complete() and not artifact.origin_thread:
            artifact.origin_thread = threading.Thread(
                target=self._origin_worker,
                args=(artifact, client),
                daemon=True,
                name=f"origin-{manifest.name}",
            )
            artifact.origin_thread.start()
        return artifact

    def _origin_worker(self, artifact: Artifact, client: Any) -> None:
        """The origin reader's thread: a bug in one round must not stall the fetch."""
        while not artifact.cancel.is_set():
            try:
                self._read_origin(artifact, client)
                return
            except Exception as error:
                artifact.s3_error = f"internal error: {error!r}"
                log.exception("origin reader of %s failed; restarting", artifact.manifest.name)
                if artifact.cancel.wait(ORIGIN_RETRY):
                    return

    def _read_origin(self, artifact: Artifact, client: Any) -> None:
        """Read from S3 what the plan says: the coordinator's stripe, or everything missing
        when the swarm is too slow (WIDE), or, without a fresh plan, the local choice."""
        manifest, sink = artifact.manifest, artifact.sink
        state = self.session.torrents[manifest.info_hash]
        stripe_source = S3Source(
            client, manifest, sink, artifact.cancel, S3SourceConfig(range_size=STRIPE_RANGE)
        )
        # WIDE reads everything it may, in small ranges many at a time: pieces that arrive
        # from peers meanwhile are skipped range by range, and the link fills at once.
        wide_source = S3Source(
            client, manifest, sink, artifact.cancel, S3SourceConfig(range_size=WIDE_RANGE)
        )
        # Fill: once every piece has left the origin, one GET at a time of a rare piece
        # (see FILL_PIECES).
        fill_source = S3Source(
            client, manifest, sink, artifact.cancel, S3SourceConfig(1, manifest.piece_size)
        )
        batch_pieces = max(1, ORIGIN_BATCH_BYTES // manifest.piece_size)
        local = LocalOriginPolicy(stripe_offset(self.node_id, manifest.layout.count))
        s3_only = "peers" not in artifact.sources
        if not s3_only and self.trackers:
            self.wake_reporter()
            # The coordinator's first plan; reading alone meanwhile would duplicate stripes.
            artifact.plan_updated.wait(PLAN_TTL)
        elif not s3_only and state.finished.wait(ORIGIN_GRACE):
            return
        handle = state.handle
        in_flight = InFlight(handle)
        while not sink.complete() and not artifact.cancel.is_set():
            missing = sink.missing()
            status = state.status
            peers_rate = float(status.download_payload_rate) if status is not None else 0.0
            now = time.monotonic()
            plan = artifact.plan if now - artifact.plan_at < PLAN_TTL else None
            wide = fill = False
            if s3_only:
                batch = missing  # all of it, at full speed
            elif plan is not None and plan["mode"] != Mode.WIDE:
                batch = [p for p in plan["stripe"] if not sink.have(p)]
                if not batch and plan.get("fill"):
                    batch = fill_pieces(
                        missing, handle.piece_availability(), in_flight(), local.offset,
                        FILL_PIECES,
                    )  # fmt: skip
                    fill = True
            elif plan is not None:  # WIDE: its stripe, then what peers are slow to give
                stripe = [p for p in plan["stripe"] if not sink.have(p)]
                slow = wide_pieces(missing, handle.piece_availability(), in_flight(), len(missing))
                taken = set(stripe)
                batch = stripe + [p for p in slow if p not in taken]
                wide = True
            else:
                s3_bytes = sink.bytes_by_source.get("s3", 0)
                batch = local.choose(
                    missing,
                    handle.piece_availability(),
                    in_flight(),
                    batch_pieces,
                    piece_size=manifest.piece_size,
                    peers_rate=peers_rate,
                    s3_bytes=s3_bytes,
                    now=now,
                )
                wide = local.state.mode is Mode.WIDE
            if not batch:
                artifact.plan_updated.clear()
                artifact.plan_updated.wait(0.25)
                continue
            try:
                artifact.plan_updated.clear()
                source = wide_source if wide else fill_source if fill else stripe_source
                source.fetch(batch)
                artifact.s3_error = None
                if plan is not None and not fill:  # report the finished stripe, for the next
                    self.wake_reporter()
                    artifact.plan_updated.wait(0.5)
            except Cancelled:
                return
            except (AccessDeniedError, NotFoundError) as error:
                artifact.s3_error = str(error)
                log.error("origin reads stopped, peers only from now: %s", error)
                return
            except SwarmError as error:
                artifact.s3_error = str(error)
                log.warning("origin read failed, retrying in %.0fs: %s", ORIGIN_RETRY, error)
                if artifact.cancel.wait(ORIGIN_RETRY):
                    return

    def _read_udp(self, artifact: Artifact, host: str, port: int) -> None:
        """Pull the missing pieces from a peer's UDP server; libtorrent checks each one."""
        manifest, sink = artifact.manifest, artifact.sink
        assert self.udp_secret is not None
        state = self.session.torrents[manifest.info_hash]
        while not sink.complete() and not artifact.cancel.is_set():
            missing = [i for i in sink.missing() if not sink.have(i)]
            if not missing:
                state.finished.wait(0.5)  # all held: libtorrent is flushing
                continue
            try:
                stats = fetch_pieces_sync(
                    host,
                    port,
                    self.udp_secret,
                    manifest.info_hash,
                    missing,
                    lambda index, data: sink.offer(index, data, "udp"),
                    piece_size=manifest.piece_size,
                    piece_count=manifest.layout.count,
                    cancel=artifact.cancel,
                )
                if stats.unavailable and not stats.kept:
                    artifact.udp_error = f"udp://{host}:{port} holds none of the missing pieces"
                    artifact.cancel.wait(ORIGIN_RETRY)
            except SwarmError as error:
                artifact.udp_error = str(error)
                log.warning(
                    "udp://%s:%d failed, retrying in %.0fs: %s", host, port, ORIGIN_RETRY, error
                )
                if artifact.cancel.wait(ORIGIN_RETRY):
                    return

    # -- status ---------------------------------------------------------------------------

    def describe(self, artifact: Artifact) -> dict[str, Any]:
        manifest = artifact.manifest
        state = self.session.torrents.get(manifest.info_hash)
        # A fresh status per API call (a request, not a polling loop): counters are exact
        # when someone asks, instead of up to STATUS_INTERVAL old.
        status = state.handle.status() if state else None
        complete = artifact.sink.complete()
        if complete and artifact.seconds is None:
            artifact.seconds = round(time.monotonic() - artifact.started, 3)
        have = status.total_wanted_done if status is not None else 0
        s3 = artifact.sink.bytes_by_source.get("s3", 0)
        return {
            "info_hash": manifest.info_hash,
            "name": manifest.name,
            "size": manifest.size,
            "sha256": manifest.sha256,
            "path": str(artifact.path),
            "state": "seeding" if complete else ("error" if state and state.error else "fetching"),
            "complete": complete,
            "have_bytes": manifest.size if complete else have,
            "bytes_by_source": {
                "peers": status.total_payload_download if status is not None else 0,
                "s3": s3,
                "udp": artifact.sink.bytes_by_source.get("udp", 0),
            },
            "down_rate": status.download_payload_rate if status is not None else 0,
            "up_rate": status.upload_payload_rate if status is not None else 0,
            "uploaded": status.total_payload_upload if status is not None else 0,
            "peers": status.num_peers if status is not None else 0,
            "seconds": artifact.seconds,
            "error": (state.error if state else None),
            "error_no_space": bool(state and state.error_errno == errno.ENOSPC),
            "s3_error": artifact.s3_error,
            "udp_error": artifact.udp_error,
            "hash_failures": artifact.sink.hash_failures,
            "peer_hash_failures": state.peer_hash_failures if state else 0,
            "peers_banned": state.peers_banned if state else 0,
            # the fetch's duration (history); unknown for what a restart restored
            "elapsed": None
            if artifact.restored
            else (artifact.seconds if complete else round(time.monotonic() - artifact.started, 3)),
            "piece_size": manifest.piece_size,
            "piece_count": manifest.layout.count,
            "pieces": bitfield(status.pieces) if status is not None else None,
            "mode": (artifact.plan or {}).get("mode"),
        }

    def connect_peers(self, addresses: list[tuple[str, int]]) -> int:
        """Dial peers found outside the tracker (an Auto Scaling group) for every torrent,
        and remember them for torrents added later."""
        self.extra_peers = list(addresses)
        count = 0
        for state in list(self.session.torrents.values()):
            for address in addresses:
                state.handle.connect_peer(address)
                count += 1
        return count

    def take_members(self, members: list[str]) -> None:
        """The coordinator's authenticated members (plus peers known otherwise) become the
        only addresses a peer connection may use."""
        if self.token:
            allowed = {str(m) for m in members} | {ip for ip, _ in self.extra_peers}
            allowed.add(self.listen_ip)
            self.session.admit_only(sorted(allowed))

    def take_plans(self, plans: dict[str, Any]) -> None:
        now = time.monotonic()
        for info_hash, plan in plans.items():
            artifact = self.artifacts.get(info_hash)
            if artifact is not None and isinstance(plan, dict):
                artifact.plan, artifact.plan_at = plan, now
                artifact.plan_updated.set()

    def snapshot(self) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "addr": f"{self.listen_ip}:{self.session.listen_port}",
            "artifacts": [self.describe(a) for a in list(self.artifacts.values())],
        }

    def close(self) -> None:
        for artifact in self.artifacts.values():
            artifact.cancel.set()
        self.session.close()


def parse_udp_source(source: str) -> tuple[str, int]:
    """``udp://HOST:PORT`` -> (host, port)."""
    host, sep, port = source.removeprefix("udp://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"swarm: bad UDP source {source!r}: use udp://HOST:PORT")
    return host.strip("[]"), int(port)


def udp_secret(secret: str | None) -> bytes | None:
    """The fleet secret as UDP's key material; None (UDP off) without one or if too short."""
    if not secret:
        return None
    if len(secret.encode()) < MIN_SECRET_LEN:
        log.warning("SWARM_SECRET is shorter than %d bytes: UDP stays off", MIN_SECRET_LEN)
        return None
    return secret.encode()


@dataclass(frozen=True)
class HeldPieces:
    """An artifact this daemon holds, as the UDP server sees it (held pieces only)."""

    artifact: Artifact

    @property
    def piece_size(self) -> int:
        return self.artifact.manifest.piece_size

    @property
    def piece_count(self) -> int:
        return self.artifact.manifest.layout.count

    @property
    def total_size(self) -> int:
        return self.artifact.manifest.size

    def has(self, index: int) -> bool:
        return bool(self.artifact.sink.handle.have_piece(index))

    def read(self, index: int) -> bytes:
        layout = self.artifact.manifest.layout
        with self.artifact.path.open("rb") as data:
            return os.pread(data.fileno(), layout.length(index), layout.offset(index))


class HeldArtifacts:
    """The daemon's :class:`swarm.udp.PieceProvider`."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def lookup(self, info_hash_hex: str) -> HeldPieces | None:
        artifact = self.daemon.artifacts.get(info_hash_hex.lower())
        return HeldPieces(artifact) if artifact else None


# -- the local API and the process ------------------------------------------------------------


def error_response(error: SwarmError) -> web.Response:
    return web.json_response({"error": str(error), "exit_code": error.exit_code}, status=400)


def make_api(daemon: Daemon) -> web.Application:
    routes = web.RouteTableDef()

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if daemon.token and not token_matches(
            bearer(request.headers.get("Authorization")), daemon.token
        ):
            return web.json_response(
                {
                    "error": "swarm: the daemon API needs the fleet token (SWARM_SECRET)",
                    "exit_code": AccessDeniedError.exit_code,
                },
                status=403,
            )
        return await handler(request)

    @routes.get("/v1/health")
    async def health(_: web.Request) -> web.Response:
        return web.json_response({"node": daemon.node_id, "pid": os.getpid()})

    @routes.post("/v1/fetch")
    async def fetch(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            artifact = await asyncio.get_running_loop().run_in_executor(None, daemon.fetch, body)
        except SwarmError as error:
            return error_response(error)
        except ValueError as error:
            return error_response(UsageError(f"swarm: bad fetch request: {error}"))
        return web.json_response(daemon.describe(artifact))

    @routes.get("/v1/artifacts")
    async def artifacts(_: web.Request) -> web.Response:
        return web.json_response(daemon.snapshot())

    @routes.get("/v1/artifacts/{info_hash}")
    async def artifact(request: web.Request) -> web.Response:
        found = daemon.artifacts.get(request.match_info["info_hash"])
        if not found:
            return error_response(NotFoundError("swarm: this daemon holds no such artifact"))
        return web.json_response(daemon.describe(found))

    app = web.Application(middlewares=[require_token])
    app.add_routes(routes)
    return app


async def report_loop(daemon: Daemon, wake: asyncio.Event) -> None:
    """Post this node's counters to the coordinator about once a second (soft state), and
    take the origin plans of its reply. ``wake`` sends a report at once (a new fetch)."""
    url = daemon.settings.coordinator.rstrip("/") + "/v1/report"  # type: ignore[union-attr]
    headers = {"Authorization": f"Bearer {daemon.token}"} if daemon.token else {}
    async with ClientSession(timeout=ClientTimeout(total=2), headers=headers) as http:
        while True:
            try:
                async with http.post(url, json=daemon.snapshot()) as response:
                    reply = await response.json() if response.status == 200 else {}
                daemon.take_plans(reply.get("plans") or {})
                if isinstance(reply.get("members"), list):
                    daemon.take_members(reply["members"])
            except (TimeoutError, OSError, ValueError) as error:
                log.debug("report to %s failed: %s", url, error)
            wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), REPORT_INTERVAL)


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


class InFlight:
    """Pieces partly downloaded from peers, asked of libtorrent at most every
    ``IN_FLIGHT_TTL`` seconds: ``get_download_queue`` lists every block in flight as
    Python dicts, and asked for each fill read it took most of a daemon's CPU."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self._pieces: set[int] = set()
        self._at = -math.inf

    def __call__(self) -> set[int]:
        now = time.monotonic()
        if now - self._at >= IN_FLIGHT_TTL:
            self._pieces = {p["piece_index"] for p in self.handle.get_download_queue()}
            self._at = now
        return self._pieces


async def serve(
    settings: Settings,
    listen_ip: str,
    port: int,
    on_ready: Callable[[Daemon], Awaitable[None]] | None = None,
    peers_from_asg: str | None = None,
    udp_port: int = UDP_PORT,
    upload_limit: int = 0,
) -> None:
    """Run the daemon until SIGTERM or SIGINT; ``on_ready`` runs once it serves (seeders)."""
    settings.home.mkdir(parents=True, exist_ok=True)
    lock = hold_lock(settings.home)
    daemon = Daemon(settings, listen_ip, port, upload_limit)
    # The marker exists only between a clean close and the next start: its absence means
    # the last daemon died (kill -9, power loss) and its resume data may lie.
    marker = settings.home / "clean-shutdown"
    clean = marker.exists()
    marker.unlink(missing_ok=True)
    if not clean:
        log.info("previous daemon did not stop cleanly: verifying data files")
    daemon.restore(clean)
    sock = sock_path(settings.home)
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    runner = web.AppRunner(make_api(daemon), access_log=None)
    await runner.setup()
    await web.UnixSite(runner, str(sock)).start()
    os.chmod(sock, 0o600)
    (settings.home / "daemon.pid").write_text(str(os.getpid()))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    wake = asyncio.Event()
    daemon.wake_reporter = lambda: loop.call_soon_threadsafe(wake.set)
    reporter = asyncio.create_task(report_loop(daemon, wake)) if settings.coordinator else None
    udp_server = None
    if daemon.udp_secret and udp_port:
        udp_server = UdpServer(
            daemon.udp_secret, HeldArtifacts(daemon), host=listen_ip, port=udp_port
        )
        await udp_server.start()
        log.info("serving held pieces over UDP on %s:%d", listen_ip, udp_port)
    starter = asyncio.create_task(on_ready(daemon)) if on_ready else None
    asg = asyncio.create_task(asg_loop(daemon, peers_from_asg, port)) if peers_from_asg else None
    log.info("daemon %s listening on %s:%d", daemon.node_id, listen_ip, daemon.session.listen_port)
    try:
        await stop.wait()
    finally:
        for task in (reporter, starter, asg):
            if task:
                task.cancel()
        if udp_server:
            await udp_server.close()
        await runner.cleanup()
        await loop.run_in_executor(None, daemon.close)
        marker.write_text(str(os.getpid()))
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        os.close(lock)
