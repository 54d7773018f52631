"""The artifacts a daemon holds, and where each one's data lives.

On disk, under ``SWARM_HOME``::

    artifacts/IH.swarm   the manifest (to seed again after a restart)
    artifacts/IH.json    {"path": DATA FILE, "dest": DEST or null}: where the data is

The data is one file: beside DEST (the hidden partial while fetching, DEST afterwards),
or ``data/IH/NAME`` for artifacts fetched with no DEST of their own (seeders, ``--copy``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from swarm.agent.rtt import endpoint_addresses, kernel_min_rtts, least_round_trip, s3_round_trip
from swarm.agent.store import partial_path
from swarm.agent.udpchoice import s3_far
from swarm.manifest import Manifest
from swarm.messages import SOURCES, OriginPlan, S3Read

if TYPE_CHECKING:
    from swarm.agent.catchup import CatchUp
    from swarm.agent.destlock import DestLock
    from swarm.agent.direct import DirectSink
    from swarm.agent.finisher import Finisher
    from swarm.agent.hybrid import TorrentSink
    from swarm.agent.supervisor import SourceTask

READS_POLL: Final = 0.01
"""Seconds between looks at whether a fetch has its plan or S3 GET
(:meth:`Artifact.await_s3_reads`)."""

S3_RTT_RELOOK: Final = 1.0
"""Seconds between looks at the kernel's least round trip to S3 while the figure a fetch
has says S3 is far (:meth:`Artifact.s3_round_trip`): a netlink dump of the node's TCP
sockets, a few ms."""


class BusyClock:
    """Seconds spent inside some activity (the S3 reader's batches), running one included:
    S3's rate while it is asked is its bytes over these seconds, where a report interval's
    average dilutes a one-second stripe into a fraction of the link."""

    def __init__(self) -> None:
        self._total = 0.0
        self._since: float | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._since is None:
                self._since = time.monotonic()

    def stop(self) -> None:
        with self._lock:
            if self._since is not None:
                self._total += time.monotonic() - self._since
                self._since = None

    def add(self, seconds: float) -> None:
        """Seconds spent before this clock ran (``swarm fetch``'s early GET)."""
        with self._lock:
            self._total += seconds

    def running(self) -> bool:
        """Whether an activity is under way now."""
        with self._lock:
            return self._since is not None

    def seconds(self) -> float:
        with self._lock:
            running = time.monotonic() - self._since if self._since is not None else 0.0
            return self._total + running


class ByteCount:
    """Bytes counted by several threads (the S3 reader's GETs), read by the reporter."""

    def __init__(self) -> None:
        self._total = 0
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self._total += nbytes

    @property
    def total(self) -> int:
        return self._total


@dataclass
class Artifact:
    """The daemon's view of one artifact it fetches or seeds."""

    manifest: Manifest
    sink: TorrentSink
    data_path: Path
    """Where libtorrent keeps the bytes now (the partial while fetching into a DEST)."""
    dest: Path | None = None
    """The DEST the data becomes once verified (None: the data stays in the home)."""
    sources: set[str] = field(default_factory=lambda: set(SOURCES))
    cancel: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)
    seconds: float | None = None
    restored: bool = False
    """Held before this daemon started (restored from resume data), not fetched by it."""
    verified: threading.Event = field(default_factory=threading.Event)
    """Set once the whole file matched its SHA-256 and sits at its final path."""
    failure: tuple[str, int] | None = None
    """(message, exit code) once the fetch cannot complete (see ``status.failure_of``)."""
    client: Any = None
    """The S3 client of the latest request (a later request may name another endpoint)."""
    tasks: dict[str, SourceTask] = field(default_factory=dict)
    finisher: Finisher | None = None
    direct: DirectSink | None = None
    """Set once the S3 reader writes into the file itself (nobody to share with)."""
    lock: DestLock | None = None
    plan: OriginPlan | None = None
    """The coordinator's latest origin plan for us."""
    plan_at: float = 0.0
    plan_ttl: float = 3.0
    """Seconds the plan stays fresh: three of the coordinator's report intervals."""
    plan_updated: threading.Event = field(default_factory=threading.Event)
    seeders: tuple[str, ...] = ()
    """Addresses of nodes holding the whole artifact, from the coordinator's first plans
    (``OriginPlan.holders``; later plans name none, and these stay)."""
    seeders_named: threading.Event = field(default_factory=threading.Event)
    """Set when a plan names ``seeders``: the UDP source, waiting for a holder, looks at
    once (it looked every 0.1 s: half of that, on average, of a far node's start)."""
    direct_pieces: int = 0
    """Pieces read from S3 as the plan's direct share (against ``plan.direct``)."""
    peers_redundant_before: int = 0
    """Bytes of peers' payload libtorrent called redundant on a handle replaced since (the
    verified file handed to a new one in seed mode), for the completion's log line."""
    peers_idle_since: float | None = None
    """Since when no connected peer holds a missing piece (None: one does)."""
    identity: FileIdentity | None = None
    """The data file's identity once verified (:func:`file_identity`): another at the path
    means it was replaced, and the daemon stops seeding it."""
    gone: str | None = None
    was_verified: bool = False
    """Restored from a record that says its whole file matched before the restart."""
    catch_up: CatchUp | None = None
    """Holds the torrent's uploads back while the fetch trails the fleet (:mod:`.catchup`)."""
    s3_busy: BusyClock = field(default_factory=BusyClock)
    """How long the S3 reader has been reading (reported: the coordinator's S3 rate)."""
    s3_streamed: ByteCount = field(default_factory=ByteCount)
    """Bytes the S3 reader has received, counted as they stream in (reported: the
    coordinator's rates), where ``bytes_by_source`` counts whole pieces once stored."""
    s3_overtaken: ByteCount = field(default_factory=ByteCount)
    """Bytes of those read in vain: pieces another source brought while S3 brought them
    (the completion's log line says how much of the excess over the size they are)."""
    early_bytes: ByteCount = field(default_factory=ByteCount)
    """Bytes of the pieces ``swarm fetch`` read from S3 while this daemon started and
    handed over, kept (:mod:`swarm.agent.earlyread`)."""
    early_streamed: ByteCount = field(default_factory=ByteCount)
    """Bytes of :attr:`s3_streamed` that ``swarm fetch``'s early GET brought (reported:
    that read was no stripe, and the coordinator tells such a node from a reader)."""
    _udp_carries_wan_until: float = 0.0
    _s3_rtt: tuple[str | None, float] | None = None
    _s3_rtt_lock: threading.Lock = field(default_factory=threading.Lock)
    _s3_rtt_relooked: float = 0.0
    _s3_addresses: tuple[str | None, set[str]] | None = None
    _tunings: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _tunings_lock: threading.Lock = field(default_factory=threading.Lock)
    _repair: set[int] = field(default_factory=set)
    _repair_lock: threading.Lock = field(default_factory=threading.Lock)
    _early: dict[int, float] = field(default_factory=dict)
    _early_lock: threading.Lock = field(default_factory=threading.Lock)

    def expect_early(self, pieces: Iterable[int], seconds: float) -> None:
        """``swarm fetch`` read these pieces from S3 while this daemon started and hands
        them over next (``PUT .../pieces/N``): the S3 reader leaves them alone until they
        arrive, or for ``seconds`` at most (a CLI that died meanwhile)."""
        until = time.monotonic() + seconds
        count = self.manifest.layout.count
        with self._early_lock:
            self._early.update((i, until) for i in pieces if 0 <= i < count)

    def early_arrived(self, index: int) -> None:
        """The CLI handed piece ``index`` over (kept or not: a refused one is read again)."""
        with self._early_lock:
            self._early.pop(index, None)

    def no_more_early(self) -> None:
        """The CLI handed over all it read (or gave up): none is waited for any more."""
        with self._early_lock:
            self._early.clear()

    def coming(self) -> set[int]:
        """Pieces the CLI is still to hand over (:meth:`expect_early`)."""
        if not self._early:
            return set()
        now = time.monotonic()
        with self._early_lock:
            self._early = {i: until for i, until in self._early.items() if until > now}
            return set(self._early)

    def ask_repair(self, pieces: list[int]) -> None:
        """Pieces libtorrent counts as written but never keeps (:mod:`swarm.agent.stuck`):
        the S3 reader writes them into the file itself."""
        with self._repair_lock:
            self._repair.update(pieces)

    def s3_round_trip(self, kernel_rtts: dict[str, float] | None = None) -> float | None:
        """S3's round trip in seconds (None: nothing answered), measured once per endpoint
        and kept (a far figure may be revised down: :meth:`_relooked_s3_round_trip`): the
        S3 reader asks before its first GET, and the UDP source gets the same figure.
        Measured after the first GETs, the timed connects waited behind their bytes in the
        node's own downlink queue: in the s3-fast fleet at a quarter of its rates, with no
        S3 connection in the kernel's table yet, a node timed its LAN S3 at 22-39 ms, took
        it for far, and left it to UDP for two seconds. ``kernel_rtts``: the kernel's
        least round trips as a caller has just read them (:func:`kernel_min_rtts`), to
        revise a far figure with instead of reading them again."""
        endpoint = getattr(self.client, "endpoint_url", None)
        with self._s3_rtt_lock:  # one measurement: the other caller waits for it
            if self._s3_rtt is not None and self._s3_rtt[0] == endpoint:
                return self._relooked_s3_round_trip(endpoint, self._s3_rtt[1], kernel_rtts)
            rtt = s3_round_trip(self.client)
            if rtt is not None:  # S3 refused: asked again next time
                self._s3_rtt = (endpoint, rtt)
                self._s3_rtt_relooked = time.monotonic()
            return rtt

    def _relooked_s3_round_trip(
        self, endpoint: str | None, rtt: float, kernel_rtts: dict[str, float] | None
    ) -> float:
        """``rtt``, or less where it says S3 is far and the kernel has since seen less on
        this node's connections to S3 (``kernel_rtts``, else read every
        :data:`S3_RTT_RELOOK` at most).
        The first figure can come through a full queue: in the slow-uploads fleet at a
        quarter of its rates one node's CLI timed its LAN S3 at 27 ms behind the other
        nodes' early GETs in the origin's uplink, and that node took no ALL plan for the
        rest of its fetch (it crawled from peers for 11 s, the origin idle, 46.6 s against
        36-37). The kernel keeps each connection's least round trip for minutes, and a
        GET's connection sees the queue drained within seconds. Never revised upward:
        a longer round trip is a queue, not a move."""
        if not s3_far(rtt):
            return rtt
        if kernel_rtts is None:
            now = time.monotonic()
            if now - self._s3_rtt_relooked < S3_RTT_RELOOK:
                return rtt
            self._s3_rtt_relooked = now
            kernel_rtts = kernel_min_rtts()
        if self._s3_addresses is None or self._s3_addresses[0] != endpoint:
            self._s3_addresses = (endpoint, endpoint_addresses(endpoint))
        least = least_round_trip(kernel_rtts, self._s3_addresses[1])
        if least is None or least >= rtt:
            return rtt
        self._s3_rtt = (endpoint, least)
        return least

    def took_s3_read(self, read: S3Read) -> None:
        """``swarm fetch``'s early GET (:mod:`swarm.agent.earlyread`), counted as the S3
        reader's: its bytes as streamed, its seconds as reading time (what the reports
        give the coordinator as S3's rate to this node). The fetch began with that GET
        (``elapsed``, and so the coordinator's cohort start): its bytes over the seconds
        since the daemon's fetch began put a 12.5 MB/s origin at 106 MB/s, and the
        origin-bound fleet went ALL (each piece read by every node: 1.37 F from the origin,
        15.9 s against 12.9)."""
        self.s3_streamed.add(read.bytes)
        self.early_streamed.add(read.bytes)
        self.s3_busy.add(read.seconds)
        self.started = min(self.started, time.monotonic() - read.seconds)

    def await_s3_reads(self, timeout: float) -> None:
        """Return once this fetch has a plan, its S3 reader reads, or it ended (verified
        or failed), or after ``timeout``: the answer to a request whose CLI reads S3
        meanwhile (:data:`swarm.agent.earlyread.ANSWER_WAIT`)."""
        end = time.monotonic() + timeout
        while (
            self.plan is None
            and not self.s3_busy.running()
            and self.failure is None
            and not self.verified.is_set()
            and time.monotonic() < end
        ):
            time.sleep(READS_POLL)

    def know_s3_round_trip(self, rtt: float) -> None:
        """S3's round trip as ``swarm fetch`` measured it before its early GET
        (:mod:`swarm.agent.earlyread`), taken for this fetch's endpoint."""
        with self._s3_rtt_lock:
            self._s3_rtt = (getattr(self.client, "endpoint_url", None), rtt)
            self._s3_rtt_relooked = time.monotonic()

    def leave_s3_to_udp(self, seconds: float | None) -> None:
        """UDP brings (or looks for a holder to bring) what crosses the WAN for at least
        ``seconds`` more; None: no longer. Said while S3 is far
        (:func:`swarm.agent.udpauto.auto_udp`)."""
        until = 0.0 if seconds is None else time.monotonic() + seconds
        self._udp_carries_wan_until = max(self._udp_carries_wan_until, until) if until else 0.0

    def udp_carries_wan(self) -> bool:
        """Whether UDP is bringing (or still looking for) what crosses the WAN: the S3
        reader then reads nothing from a far S3 (see ``read_origin``)."""
        return time.monotonic() < self._udp_carries_wan_until

    @property
    def fetching(self) -> bool:
        """Not verified, failed or dropped yet."""
        return not (self.verified.is_set() or self.failure is not None or self.cancel.is_set())

    def tune_while_fetching(self, tuning: AbstractContextManager[object]) -> None:
        """Hold ``tuning`` (:meth:`swarm.sources.peers.TorrentSession.tuned`) until this
        fetch ends (:meth:`end_tunings`); not at all if it has ended already."""
        with self._tunings_lock:
            if not self.fetching:
                return
            self._tunings.enter_context(tuning)

    def end_tunings(self) -> None:
        """The fetch is over (verified, failed or dropped): its tunings are let go. Called
        after ``verified``, ``failure`` or ``cancel`` is set, so none is taken after."""
        with self._tunings_lock:
            self._tunings.close()
            if self.catch_up is not None:
                self.catch_up.end()

    def take_repair(self) -> list[int]:
        with self._repair_lock:
            pieces, self._repair = sorted(self._repair), set()
        return pieces

    @property
    def info_hash(self) -> str:
        return self.manifest.info_hash

    def complete_on_disk(self) -> bool:
        """Every piece is in the file, whoever wrote it (libtorrent, or the S3 reader)."""
        if self.direct is not None:
            return self.direct.complete()
        return self.sink.complete()

    def missing(self) -> list[int]:
        return self.direct.missing() if self.direct is not None else self.sink.missing()

    @property
    def final_path(self) -> Path:
        return self.dest if self.dest is not None else self.data_path


def data_path_for(home: Path, manifest: Manifest, dest: Path | None) -> Path:
    """Where a new artifact's bytes go while it downloads."""
    if dest is not None:
        return partial_path(dest)
    return home / "data" / manifest.info_hash / manifest.name


def save_record(
    home: Path, manifest: Manifest, path: Path, dest: Path | None, verified: bool = False
) -> FileIdentity | None:
    """Remember the artifact and where its data is (atomically: a crash leaves the old);
    for a verified one, which file that is (:func:`file_identity`, returned)."""
    folder = home / "artifacts"
    (folder / f"{manifest.info_hash}.swarm").write_bytes(manifest.dumps())
    record = folder / f"{manifest.info_hash}.json"
    tmp = record.with_name(record.name + ".tmp")
    body: dict[str, object] = {
        "path": str(path),
        "dest": str(dest) if dest else None,
        "verified": verified,
    }
    identity = None
    if verified:  # which file was verified: another one there later is not seeded
        identity = file_identity(path)
        if identity is None:
            raise FileNotFoundError(errno.ENOENT, "the verified file is gone", str(path))
        body["file"] = list(identity)
    tmp.write_text(json.dumps(body))
    os.replace(tmp, record)
    return identity


def load_record(home: Path, manifest: Manifest) -> tuple[Path, Path | None, bool]:
    """(data path, DEST, verified) of a held artifact; for records of older versions, the
    home's data dir, verified if libtorrent's resume data says complete."""
    record = home / "artifacts" / f"{manifest.info_hash}.json"
    default = home / "data" / manifest.info_hash / manifest.name
    try:
        body = json.loads(record.read_text())
        path = Path(body["path"])
        dest = Path(body["dest"]) if body.get("dest") else None
        verified = bool(body.get("verified"))
        if verified and body.get("file") is not None:
            identity = file_identity(path)
            if identity is None:
                raise FileNotFoundError(path)
            # a directory's identity is a prefix of what records of older versions hold
            if list(body["file"])[: len(identity)] != list(identity):
                raise FileReplacedError(path)
    except FileNotFoundError:
        return path if record.exists() else default, None, False
    except (ValueError, KeyError, TypeError):
        return default, None, False
    if not path.is_absolute() or (dest is not None and not dest.is_absolute()):
        return default, None, False
    return path, dest, verified


FileIdentity = tuple[int, ...]


def file_identity(path: Path) -> FileIdentity | None:
    """What tells the verified file from another later put at its path (None: nothing
    there). Not the inode number alone: a deleted file's number is handed to the next file
    created, and another fetch's artifact at DEST then passed for this one; a file
    rewritten in place (``cp other DEST``) keeps its number. A directory (a tree artifact)
    is its inode: an application's own files created inside it (a cache, a lock) change
    its mtime without replacing it, and its files are the manifest's, which libtorrent
    and the peers' piece checks guard."""
    try:
        found = path.stat()
    except OSError:
        return None
    if stat.S_ISDIR(found.st_mode):
        return (found.st_ino,)
    return (found.st_ino, found.st_size, found.st_mtime_ns)


class FileReplacedError(Exception):
    """A verified artifact's file was replaced while the daemon was not watching."""


def forget_record(home: Path, info_hash: str) -> None:
    for suffix in (".swarm", ".json"):
        (home / "artifacts" / f"{info_hash}{suffix}").unlink(missing_ok=True)
