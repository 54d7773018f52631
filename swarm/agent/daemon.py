"""The node daemon: one libtorrent session, every artifact it holds, a local API.

``swarm daemon`` runs this in the foreground (systemd); ``swarm fetch`` starts one in
the background when none answers on ``$SWARM_HOME/daemon.sock``. The daemon keeps
seeding whatever it holds: that is how existing instances seed new ones.

Its roles, a module each: the artifact registry (:mod:`.registry`), what a start takes
over from earlier runs (:mod:`.restore`), sources as supervised tasks
(:mod:`.sourcetasks`, :mod:`.supervisor`, with the S3 reader :mod:`.origin` and the UDP
sources :mod:`.udpauto` and :mod:`.udpsource`), the whole-file hash and DEST
(:mod:`.finisher`, run for each artifact by :mod:`.completion`), status (:mod:`.status`),
the local API (:mod:`.api`), the reporter (:mod:`.reporter`) and the coordinator's plans
it brings (:mod:`.plans`), the peer filter kept to the fleet's members
(:mod:`.membership`), what the UDP server sees of the pieces held (:mod:`.held`) and the
process (:mod:`.serve`). This module ties them together.

State under ``SWARM_HOME``::

    node_id                 this node's stable id (reported to the coordinator)
    daemon.sock daemon.pid  local API (HTTP over a unix socket), pid for stopping it
    daemon.lock             flock: one daemon per home
    artifacts/IH.swarm|json manifests of held artifacts and where their data is
    resume/IH.resume        libtorrent resume data (atomic writes)
    data/IH/NAME            data of artifacts fetched without a DEST of their own
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import libtorrent as lt

from swarm import catalog
from swarm.agent import plans as coordinator_plans
from swarm.agent import registry, seedershare, treefs
from swarm.agent.catchup import CATCH_UP_SETTINGS, CatchUp
from swarm.agent.completion import Completion
from swarm.agent.destlock import DestLock
from swarm.agent.earlyread import take_read_ahead
from swarm.agent.held import udp_secret
from swarm.agent.hybrid import TorrentSink
from swarm.agent.linkcount import SentUploads, interface_counter, interface_for
from swarm.agent.membership import Membership
from swarm.agent.pieceserver import pieces_port
from swarm.agent.registry import Artifact
from swarm.agent.restore import held_records, node_id
from swarm.agent.sourcetasks import AUTO_UDP, start_source
from swarm.agent.status import describe
from swarm.agent.store import ensure_space
from swarm.config import Settings, coordinator_urls
from swarm.errors import DestBusyError, SwarmError, UsageError
from swarm.fleetauth import fleet_token
from swarm.manifest import Manifest
from swarm.messages import ArtifactStatus, FetchRequest
from swarm.s3http import S3Client
from swarm.sources import peertrace
from swarm.sources.ltsettings import DEFAULT_PORT
from swarm.sources.peers import TorrentSession

log = logging.getLogger(__name__)

DAEMON_S3_ATTEMPTS = 3
"""The S3 client's own tries per call in the daemon: its retries are silent (eight of them
with backoff hid a minute of 503s), the supervisor's show on the progress line."""

DROPPED_KEPT = 64
"""Reasons for dropped artifacts the daemon remembers (:attr:`Daemon.dropped`)."""

STOP_BUDGET = 8.0
"""Seconds a stopping daemon gives libtorrent to save resume data (systemd's default
stop timeout is 90 s; a fetch's CLI waits for its daemon's answer meanwhile)."""


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
        self.session = TorrentSession(
            listen_ip, port, self.home / "resume", upload_limit, trace_peers=peertrace.enabled()
        )
        self.link_interface = interface_for(listen_ip)
        """The interface whose counters measure this node's link (None: loopback)."""
        self._sent_uploads = (
            None
            if self.link_interface is None
            else SentUploads(functools.partial(interface_counter, self.link_interface, "tx_bytes"))
        )
        self.artifacts: dict[str, Artifact] = {}
        self.dropped: dict[str, tuple[type[SwarmError], str]] = {}
        """Why the daemon stopped seeding an artifact (:meth:`_drop`), by info-hash: the
        error (class, message) a ``swarm fetch`` still following it reports; the last
        :data:`DROPPED_KEPT`."""
        self._lock = threading.Lock()
        self.wake_reporter: Callable[[], object] = lambda: None
        self.on_link: Callable[[float], object] = lambda bytes_per_s: None
        """Told the coordinator's measure of this node's link (bytes/s: the most its
        reports moved one way in an interval): the UDP server's send budget, unless the
        operator gave one (see ``serve``)."""
        self.start_asg: Callable[[str], object] = lambda group: None
        self.asg_groups: set[str] = set()
        self.extra_peers: list[tuple[str, int]] = []
        """Peers known without the tracker (``--peers-from-asg``), dialled for every torrent."""
        self.report_interval = 1.0
        """The report interval the coordinator asked for last (set by the reporter)."""
        self.token = fleet_token(settings.secret) if settings.secret else None
        self.udp_secret = udp_secret(settings.secret)
        """With a fleet secret: required on the local API, sent to the coordinator, and
        peers are admitted only if the coordinator lists them as members."""
        self.udp_port = 0
        """The port this node's UDP server listens on (0: none), taken to be every
        holder's too (a fleet-wide setting) by the automatic UDP source."""
        self.coordinators = coordinator_urls(settings.coordinator)
        """Every coordinator of the fleet (``A,B``): reports and announces fail over."""
        query = f"?token={self.token}" if self.token else ""  # trackers take no headers
        self.trackers = [f"{url}/announce{query}" for url in self.coordinators]
        self.membership = (
            Membership(
                self.session,
                listen_ip,
                lambda: (ip for ip, _ in self.extra_peers),
                lambda: self.wake_reporter(),
                lambda: self.report_interval,
            )
            if self.token
            else None
        )
        """The peer filter kept to the coordinator's members (None: an open fleet)."""
        if self.membership is not None:
            self.session.on_blocked = self.membership.refused
        self.completion = Completion(
            self.session,
            self.home,
            self.trackers,
            lambda: self.extra_peers,
            functools.partial(start_source, self),
            lambda: self.wake_reporter(),
        )

    # -- the registry -----------------------------------------------------------------------

    def piece_access(self) -> seedershare.PieceAccess | None:
        """The fleet's piece servers (:mod:`.pieceserver`), which listen beside the UDP
        servers: None without them (no secret, no UDP, a UDP port of its own). The rule
        both ends follow: this node serves its pieces by it too (``serve``)."""
        port = pieces_port(self.udp_port)
        if not (port and self.udp_secret and self.token):
            return None
        return seedershare.PieceAccess(port, self.token)

    def restore(self, clean: bool = True) -> None:
        """Seed again everything held before a restart (resume data spares a re-download;
        after an unclean stop, ``clean`` False, the data files are hashed instead): the
        records :func:`.restore.held_records` finds still backed by their data."""
        for held in held_records(self.home, self.session.remove):
            manifest = held.manifest
            # An unfinished fetch may hold pieces the S3 reader wrote itself (direct.py),
            # which libtorrent's resume data does not list: have it check the file.
            artifact = self._add(
                manifest,
                held.data_path,
                held.dest,
                {"peers"},
                trust_resume=clean and held.verified,
                verified=held.verified,
            )
            artifact.restored = True
            artifact.was_verified = held.verified
            if held.dest is not None and not held.verified:  # a fetch into DEST was under way
                lock = DestLock(held.dest, self._lock_owner(manifest))
                artifact.lock = lock if lock.try_acquire() else None
            self.completion.start(artifact)
            log.info("restored %s (%s) from %s", manifest.name, manifest.info_hash,
                     held.data_path)  # fmt: skip

    def _add(
        self,
        manifest: Manifest,
        data_path: Path,
        dest: Path | None,
        sources: set[str],
        trust_resume: bool = True,
        verified: bool = False,
        prepare: Callable[[Artifact], None] = lambda _: None,
    ) -> Artifact:
        """The artifact held for ``manifest`` (added, or the one already held);
        ``prepare`` runs on it before the reporter can see it."""
        with self._lock:
            if manifest.info_hash in self.artifacts:
                prepare(self.artifacts[manifest.info_hash])
                return self.artifacts[manifest.info_hash]
            data_path.parent.mkdir(parents=True, exist_ok=True)
            identity = registry.save_record(self.home, manifest, data_path, dest, verified)
            if not data_path.exists():
                ensure_space(data_path.parent, manifest.size)
            state = self.session.add(manifest, data_path, self.trackers, trust_resume=trust_resume)
            for address in self.extra_peers:
                state.handle.connect_peer(address)
            artifact = Artifact(
                manifest,
                TorrentSink(self.session, manifest),
                data_path,
                dest,
                set(sources),
                identity=identity,  # a restored verified file's, as load_record compared it
            )
            prepare(artifact)
            self.artifacts[manifest.info_hash] = artifact
            self.dropped.pop(manifest.info_hash, None)  # held again: no longer why it went
            return artifact

    def _drop(self, artifact: Artifact, why: str, error: type[SwarmError] = SwarmError) -> None:
        """Stop seeding an artifact whose data is gone or changed (it is fetched anew by
        the next request for it); ``error``: what a fetch following it then fails with."""
        log.warning("stopped seeding %s: %s", artifact.manifest.name, why)
        artifact.gone = why
        artifact.cancel.set()
        with self._lock:
            self.artifacts.pop(artifact.info_hash, None)
            self.dropped[artifact.info_hash] = (
                error,
                f"swarm: the daemon stopped serving {artifact.manifest.name} before this "
                f"fetch returned: {why}; rerun it",
            )
            while len(self.dropped) > DROPPED_KEPT:
                del self.dropped[next(iter(self.dropped))]
        self.session.remove(artifact.info_hash)
        registry.forget_record(self.home, artifact.info_hash)
        if artifact.lock is not None:
            artifact.lock.release()
        artifact.end_tunings()
        self.wake_reporter()

    # -- fetching -------------------------------------------------------------------------

    def check_request(self, request: FetchRequest) -> None:
        """Refuse what this running daemon cannot take; take what it can."""
        running = f"this node's daemon (pid {os.getpid()}, SWARM_HOME {self.home})"
        restart = f"stop it (kill {os.getpid()}, or systemctl restart swarm-daemon) and fetch again"
        if request.listen and request.listen != self.listen_ip:
            raise UsageError(
                f"swarm: {running} listens on {self.listen_ip}, not {request.listen}: "
                f"{restart}, or drop --listen"
            )
        if request.coordinator and request.coordinator != self.settings.coordinator:
            raise UsageError(
                f"swarm: {running} reports to {self.settings.coordinator or 'no coordinator'}, "
                f"not {request.coordinator}: {restart}, or drop --coordinator"
            )
        if any(s.startswith("udp://") for s in request.sources) and not self.udp_secret:
            raise UsageError(
                "swarm: UDP needs the fleet secret: set SWARM_SECRET (16+ bytes, the same on "
                "every node); with no secret UDP is off"
            )
        if request.peers_from_asg and request.peers_from_asg not in self.asg_groups:
            self.asg_groups.add(request.peers_from_asg)
            self.start_asg(request.peers_from_asg)

    def fetch(self, request: FetchRequest) -> Artifact:
        """Resolve the source, add the torrent, start its sources. Blocking (S3 I/O).

        A later request for an artifact already here restarts its failed sources (with
        this request's S3 endpoint) and adds the sources it names."""
        self.check_request(request)
        client = S3Client(
            request.endpoint_url or self.settings.endpoint_url, max_attempts=DAEMON_S3_ATTEMPTS
        )
        if request.manifest is not None:  # read by swarm fetch while this daemon started
            manifest = Manifest.loads(
                request.manifest.encode(),
                self.settings.secret,
                origin=f"{request.source} (as swarm fetch read it)",
            )
            log.info("%s: manifest as swarm fetch read it while this daemon started", manifest.name)
        else:
            manifest = catalog.manifest_for(
                client, request.source, request.catalog or self.settings.catalog,
                self.settings.secret,
            )  # fmt: skip
        if request.dest:
            treefs.check_dest_kind(manifest, Path(request.dest))
        dest = Path(request.dest) if request.dest and not request.copy else None
        artifact = self.artifacts.get(manifest.info_hash)
        if artifact is not None and artifact.verified.is_set():
            self.watch_one(artifact)  # deleted a moment ago? then it is fetched anew
            artifact = self.artifacts.get(manifest.info_hash)
        if artifact is None:
            lock = None
            if dest is not None:
                lock = DestLock(dest, self._lock_owner(manifest))
                lock.acquire(manifest.info_hash, timeout=0)
                if not lock.held:
                    dest = None  # DEST is another fetch's for now: the CLI copies later
                    lock = None
            data_path = registry.data_path_for(self.home, manifest, dest)
            try:
                artifact = self._add(
                    manifest, data_path, dest, set(request.sources),
                    # (its client and what swarm fetch read: see take_read_ahead)
                    prepare=lambda added: take_read_ahead(added, request, client),
                )  # fmt: skip
            except BaseException:
                if lock is not None:
                    lock.release()
                raise
            artifact.lock = lock
        else:
            take_read_ahead(artifact, request, client)
        sources = set(request.sources)
        artifact.sources |= sources
        artifact.failure = None
        artifact.peers_idle_since = None
        handle = artifact.sink.handle
        if "peers" not in artifact.sources:
            # Forced sources only (--source s3 / udp://): libtorrent uploads, never downloads.
            handle.set_flags(lt.torrent_flags.upload_mode)
        else:
            handle.unset_flags(lt.torrent_flags.upload_mode)
        if not artifact.sink.complete():
            for name in sorted(sources - {"peers"}):
                start_source(self, artifact, name)
            forced_udp = any(s.startswith("udp://") for s in artifact.sources)
            if "peers" in artifact.sources and self.udp_port and not forced_udp:
                start_source(self, artifact, AUTO_UDP)
        self.completion.start(artifact)
        return artifact

    def _lock_owner(self, manifest: Manifest) -> dict[str, object]:
        return {
            "pid": os.getpid(),
            "home": str(self.home),
            "name": manifest.name,
            "info_hash": manifest.info_hash,
        }

    def watch(self) -> None:
        """Stop seeding what is no longer on disk as verified: a file deleted or
        replaced under the daemon, or one libtorrent can no longer read."""
        for artifact in list(self.artifacts.values()):
            if artifact.verified.is_set():
                self.watch_one(artifact)
                if artifact.catch_up is not None and artifact.catch_up.limit:
                    with contextlib.suppress(RuntimeError):  # a seeder uploads freely
                        artifact.catch_up.lift(artifact.sink.state.handle)
            elif artifact.fetching:
                self._catch_up(artifact)

    def _catch_up(self, artifact: Artifact) -> None:
        """Hold the fetch's uploads back while it trails its peers (:mod:`.catchup`)."""
        state = artifact.sink.state
        status = state.status
        if status is None or artifact.plan is None:  # (only in a fleet with a coordinator)
            return
        if artifact.catch_up is None:
            artifact.catch_up = CatchUp(
                artifact.manifest.name, lambda: self.session.tuned(CATCH_UP_SETTINGS)
            )
        with contextlib.suppress(RuntimeError):  # the handle went meanwhile
            artifact.catch_up.step(
                state.handle, len(state.held) / state.count, status.upload_payload_rate
            )

    def lookup(self, info_hash: str) -> Artifact | None:
        """An artifact held, checked on the spot: a verified file deleted or replaced a
        moment ago is not reported as complete."""
        artifact = self.artifacts.get(info_hash)
        if artifact is not None and artifact.verified.is_set():
            self.watch_one(artifact)
            artifact = self.artifacts.get(info_hash)
        return artifact

    def watch_one(self, artifact: Artifact) -> None:
        identity = registry.file_identity(artifact.final_path)
        if identity is None:
            self._drop(
                artifact,
                f"{artifact.final_path} was deleted (by another swarm fetch?)",
                DestBusyError,
            )
        elif identity != artifact.identity:
            self._drop(
                artifact,
                f"{artifact.final_path} was replaced by another file (by another swarm fetch?)",
                DestBusyError,
            )
        elif artifact.sink.state.error:
            self._drop(artifact, f"libtorrent cannot read it: {artifact.sink.state.error}")

    # -- status and the coordinator -------------------------------------------------------

    def describe(self, artifact: Artifact) -> ArtifactStatus:
        return describe(artifact)

    def connect_peers(self, addresses: list[tuple[str, int]]) -> int:
        """Dial peers found outside the tracker (an Auto Scaling group) for every torrent,
        and remember them for torrents added later."""
        self.extra_peers = list(dict.fromkeys(self.extra_peers + list(addresses)))
        torrents = list(self.session.torrents)
        for info_hash in torrents:
            self.session.dial(info_hash, tuple(addresses))
        return len(torrents) * len(addresses)

    def take_members(self, members: list[str]) -> None:
        """The coordinator's member list (:meth:`.membership.Membership.take`); nothing in
        an open fleet, whose filter lets everyone through."""
        if self.membership is not None:
            self.membership.take(members)

    def take_plans(self, plans: dict[str, Any], interval: float = 1.0) -> None:
        """Take the coordinator's plans (:func:`.plans.take_plans`)."""
        coordinator_plans.take_plans(self, plans, interval)

    def fetching(self) -> bool:
        """Some artifact is being fetched (not yet verified, not failed or cancelled)."""
        with self._lock:
            artifacts = list(self.artifacts.values())
        return any(artifact.fetching for artifact in artifacts)

    def fleet_down(self) -> float:
        """What the fleets of the artifacts being fetched can receive, as their
        coordinators' plans say (bytes/s, the most of them; 0: not known)."""
        with self._lock:
            artifacts = list(self.artifacts.values())
        return max(
            (a.plan.fleet_down for a in artifacts if a.fetching and a.plan is not None),
            default=0.0,
        )

    def snapshot(self) -> dict[str, Any]:
        """This node's report to its coordinator (one per report: the upload totals are
        held to what the link has sent since the last, :class:`SentUploads`)."""
        described = [describe(a) for a in list(self.artifacts.values())]
        if self._sent_uploads is not None:
            totals = self._sent_uploads.totals({d.info_hash: d.uploaded for d in described})
            for status in described:
                status.uploaded = totals[status.info_hash]
        return {
            "node": self.node_id,
            "addr": f"{self.listen_ip}:{self.session.listen_port}",
            "artifacts": [d.to_json() for d in described],
        }

    def close(self) -> None:
        if self.membership is not None:
            self.membership.close()
        for artifact in self.artifacts.values():
            artifact.cancel.set()
        self.session.close(timeout=STOP_BUDGET / 2)
        for artifact in self.artifacts.values():
            if artifact.lock is not None:
                artifact.lock.release()
