"""The coordinator's soft state: who holds what, how fast nodes move bytes, and expiry.

Everything here is soft (ARCHITECTURE, "Scale beyond one machine"): peers re-announce
every ``interval`` and nodes report about once a second, so a restarted coordinator is
whole again within one announce interval. Clocks are passed in as ``now`` (seconds,
wall clock in production, any float in tests); nothing here imports time or random.

:class:`PeerStore` is the seam for a shared store (Redis) behind several coordinators:
an implementation provides the storage primitives, and the tracker logic (announce,
ranking, counts, completion detection, the snapshot) lives once in the base class.
"""

from __future__ import annotations

import base64
import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from swarm.coordinator.tracker import Announce, Peer, normalize_ip

ANNOUNCE_INTERVAL: Final = 30
"""Seconds between a client's re-announces (the reply's ``interval``). Short next to
BitTorrent's usual 30 minutes because fleets churn within minutes; a new node still
learns of old ones at once (they are in its first reply) and old ones learn of it when
it connects to them, so this only bounds how stale the tracker's view gets."""

PEER_TTL_INTERVALS: Final = 3
"""A peer missing this many announce intervals in a row is dropped: one lost announce
(a slow reply, a retry) must not evict a live seeder, three almost surely means it is
gone without sending ``stopped`` (a terminated instance never says goodbye)."""

PEER_TTL: Final = PEER_TTL_INTERVALS * ANNOUNCE_INTERVAL
"""Seconds after its last announce that a peer is dropped (3 x ``ANNOUNCE_INTERVAL``)."""

REPORT_INTERVAL: Final = 1.0
"""Seconds between a node's reports; returned to the node in every ``/v1/report`` reply."""

REPORT_TTL: Final = 10.0
"""Seconds after its last report that a node leaves the fleet view: ten missed reports,
so a node stalled by a busy disk for a few seconds does not flicker out of ``status``."""

SPARE_BUCKET: Final = 1 << 20
"""Spare upload capacities within the same MiB/s rank equal (see :func:`rank_peers`)."""

MAX_REPORT_ARTIFACTS: Final = 1024
"""Artifacts one report may list; far above real use, low enough to bound a bad client."""

MAX_NODE_ID: Final = 255
"""Longest node id accepted (a hostname is at most 253 characters)."""

MAX_NAME: Final = 1024
"""Longest artifact name accepted (an S3 key is at most 1,024 bytes)."""

MAX_SOURCES: Final = 16
"""Entries of one artifact's ``bytes_by_source`` (a daemon sends three: peers, s3, udp)."""

MAX_SOURCE_NAME: Final = 32
"""Longest key of ``bytes_by_source``."""

MAX_BYTES: Final = 2**63 - 1
"""Largest byte count (size, counters) accepted: what libtorrent's int64 holds."""

MAX_RATE: Final = 1e12
"""Largest rate (bytes/s) accepted: 8 Tbit/s, beyond any NIC; bounds the EMAs and the
spare-upload ranking a hostile report could otherwise skew without limit."""

MIN_PIECE_SIZE: Final = 16 << 10
"""Smallest piece size a report may carry: BEP 3 practice and ``swarm publish``'s own
minimum (:func:`swarm.pieces.validate_piece_size`). A report claiming ``piece_size: 1``
on a large ``size`` once cost 78 MB of state and a 9.7 MB reply (issue 15)."""

MAX_PIECE_SIZE: Final = 128 << 20
"""Largest piece size a report may carry: libtorrent 2.x refuses 256 MiB pieces
("invalid piece size", checked with libtorrent 2.1.1's ``create_torrent``)."""

MAX_PIECE_COUNT: Final = 1 << 20
"""Most pieces a report's bitfield may describe (128 KiB of bitfield): a 16 GiB artifact
at 16 KiB pieces. The default piece size keeps an artifact at 2,048 pieces up to 32 GiB
and at 65,536 up to 1 TiB (:func:`swarm.pieces.default_piece_size`)."""


class ReportError(ValueError):
    """A node report is malformed; the message names the field and the bad value."""


@dataclass(frozen=True, slots=True)
class PeerRecord:
    """What the tracker knows about one (info_hash, peer_id), from its latest announce."""

    info_hash: bytes
    peer_id: bytes
    ip: str
    port: int
    left: int
    uploaded: int
    downloaded: int
    first_seen: float
    last_seen: float
    completed: bool = False
    """Sent ``event=completed`` at some point (it downloaded the artifact while tracked)."""

    @property
    def seeder(self) -> bool:
        return self.left == 0

    @property
    def peer(self) -> Peer:
        return Peer(self.peer_id, self.ip, self.port)

    def to_json(self, now: float, node: str | None = None) -> dict[str, object]:
        return {
            "peer_id": self.peer_id.hex(),
            "ip": self.ip,
            "port": self.port,
            "node": node,
            "left": self.left,
            "uploaded": self.uploaded,
            "downloaded": self.downloaded,
            "seeder": self.seeder,
            "completed": self.completed,
            "age": round(now - self.last_seen, 3),
        }


@dataclass(frozen=True, slots=True)
class ArtifactReport:
    """One artifact in a node report. ``info_hash`` is 40 lowercase hex characters."""

    info_hash: str
    name: str
    size: int
    have_bytes: int
    complete: bool
    bytes_by_source: Mapping[str, int]
    down_rate: float
    up_rate: float
    elapsed: float | None = None
    """Optional: seconds the node spent fetching, for history when it completes."""
    piece_size: int | None = None
    piece_count: int | None = None
    pieces: bytes | None = None
    """Optional: the pieces held, as a BitTorrent bitfield (piece 0 = high bit of byte 0);
    with ``piece_size`` and ``piece_count`` it lets the coordinator stripe origin reads."""

    def to_json(self) -> dict[str, object]:
        return {
            "info_hash": self.info_hash,
            "name": self.name,
            "size": self.size,
            "have_bytes": self.have_bytes,
            "progress": _fraction(self.have_bytes, self.size),
            "complete": self.complete,
            "bytes_by_source": dict(self.bytes_by_source),
            "down_rate": self.down_rate,
            "up_rate": self.up_rate,
        }


@dataclass(frozen=True, slots=True)
class NodeReport:
    """A validated ``POST /v1/report`` body."""

    node: str
    addr: str
    """The node's peer address as ``ip:port`` (IPv6 as ``[ip]:port``), normalised."""
    artifacts: tuple[ArtifactReport, ...]


@dataclass(slots=True)
class NodeState:
    """A node's latest report plus what the coordinator remembers between reports."""

    report: NodeReport
    first_seen: float
    last_seen: float
    started: dict[str, float] = field(default_factory=dict)
    """info_hash -> when this node was first seen holding it incomplete."""
    completed: set[str] = field(default_factory=set)
    """info_hashes this node has been seen complete (a completion is recorded once)."""


@dataclass(frozen=True, slots=True)
class Completion:
    """A node finished an artifact: one row of history."""

    info_hash: str
    name: str
    node: str
    completed_at: float
    seconds: float | None
    """Fetch duration: the node's ``elapsed`` if it sent one, else the time since the
    coordinator first saw it incomplete, else ``None`` (it was complete when first seen,
    e.g. an origin seeder)."""
    bytes_by_source: Mapping[str, int]


def rank_peers(
    candidates: Iterable[PeerRecord],
    requester: bytes,
    limit: int,
    requester_addr: tuple[str, int] | None = None,
    spare: Mapping[tuple[str, int], float] | None = None,
) -> list[PeerRecord]:
    """Choose up to ``limit`` peers to hand to ``requester``. Pure; deterministic.

    Order, by sort key ``(not seeder, -spare_bucket, left, spread(requester, peer_id))``:

    1. seeders (``left == 0``) first: they can serve every piece;
    2. then by spare upload capacity (``spare``: bytes/s of headroom per ``(ip, port)``
       from the nodes' reports, peak upload EMA minus current; unknown peers count as
       0), in buckets of ``SPARE_BUCKET`` bytes/s so that noise between two similar
       peers does not decide; a peer with idle upload serves a newcomer sooner;
    3. then leechers by fewest bytes ``left``: the most progress, so the most pieces to
       share. ``left`` rather than ``downloaded``: ``downloaded`` restarts at zero when a
       client resumes and counts discarded bytes, ``left`` does neither;
    4. ties by ``spread``, a hash of the requester's and the candidate's peer ids: each
       requester sees its own stable order, so a hundred new nodes do not all dial the
       same first five seeders.

    ``uploaded`` is deliberately not a key: favouring the biggest uploader sends every
    requester to the peer that is already busiest.

    Edge cases: the requester itself (same peer id, or same ``requester_addr``, as after
    a client restart with a new id) is never returned; ``limit <= 0`` returns ``[]``.
    """
    if limit <= 0:
        return []
    eligible = [
        peer
        for peer in candidates
        if peer.peer_id != requester
        and (requester_addr is None or (peer.ip, peer.port) != requester_addr)
    ]
    headroom = spare or {}

    def key(peer: PeerRecord) -> tuple[bool, int, int, bytes]:
        bucket = int(headroom.get((peer.ip, peer.port), 0.0) // SPARE_BUCKET)
        return (not peer.seeder, -bucket, peer.left, _spread(requester, peer.peer_id))

    eligible.sort(key=key)
    return eligible[:limit]


def _spread(requester: bytes, candidate: bytes) -> bytes:
    return hashlib.blake2b(requester + candidate, digest_size=8).digest()


def count_peers(peers: Iterable[PeerRecord]) -> tuple[int, int]:
    """``(complete, incomplete)`` as a tracker reply reports them: seeders, leechers."""
    complete = incomplete = 0
    for peer in peers:
        if peer.seeder:
            complete += 1
        else:
            incomplete += 1
    return complete, incomplete


def parse_report(payload: object) -> NodeReport:
    """Validate a decoded ``/v1/report`` JSON body. Unknown keys are ignored, so nodes
    can send more than this coordinator understands.

    Raises:
        ReportError: a field is missing or has the wrong type or range.
    """
    body = _mapping(payload, "report")
    node = _str(body, "node", "report")
    if not node or len(node) > MAX_NODE_ID or not node.isprintable():
        raise ReportError(f"report.node must be 1..{MAX_NODE_ID} printable characters")
    addr = _addr(_str(body, "addr", "report"))
    items = body.get("artifacts")
    if not isinstance(items, list):
        raise ReportError("report.artifacts must be a list (empty if the node holds nothing)")
    if len(items) > MAX_REPORT_ARTIFACTS:
        raise ReportError(f"report.artifacts lists {len(items)}; at most {MAX_REPORT_ARTIFACTS}")
    artifacts = tuple(_artifact(item, f"report.artifacts[{i}]") for i, item in enumerate(items))
    return NodeReport(node=node, addr=addr, artifacts=artifacts)


class PeerStore(ABC):
    """Soft state of the swarm: peers by (info_hash, peer_id), node reports by node id.

    Subclasses implement storage (the abstract methods); readers must already hide
    entries older than ``peer_ttl``/``report_ttl`` so correctness never waits on
    :meth:`expire`, which only reclaims space.
    """

    def __init__(self, peer_ttl: float = PEER_TTL, report_ttl: float = REPORT_TTL) -> None:
        if peer_ttl <= 0 or report_ttl <= 0:
            raise ValueError(
                f"TTLs must be positive, got peer_ttl={peer_ttl} report_ttl={report_ttl}"
            )
        self.peer_ttl = peer_ttl
        self.report_ttl = report_ttl

    # -- storage primitives -------------------------------------------------------------

    @abstractmethod
    def get_peer(self, info_hash: bytes, peer_id: bytes, now: float) -> PeerRecord | None:
        """The live record, or ``None`` if absent or expired."""

    @abstractmethod
    def put_peer(self, record: PeerRecord) -> None: ...

    @abstractmethod
    def drop_peer(self, info_hash: bytes, peer_id: bytes) -> None: ...

    @abstractmethod
    def peers(self, info_hash: bytes, now: float) -> list[PeerRecord]:
        """Live peers of one artifact, in no particular order."""

    @abstractmethod
    def info_hashes(self, now: float) -> list[bytes]:
        """Artifacts with at least one live peer."""

    @abstractmethod
    def get_node(self, node: str, now: float) -> NodeState | None: ...

    @abstractmethod
    def put_node(self, state: NodeState) -> None: ...

    @abstractmethod
    def nodes(self, now: float) -> list[NodeState]:
        """Nodes that reported within ``report_ttl``."""

    @abstractmethod
    def expire(self, now: float) -> tuple[int, int]:
        """Drop stale peers and nodes; return how many of each were dropped."""

    # -- tracker logic (shared by every store) ------------------------------------------

    def announce(
        self,
        a: Announce,
        ip: str,
        now: float,
        spare: Mapping[tuple[str, int], float] | None = None,
    ) -> list[Peer]:
        """Record an announce from ``ip`` (already normalised) and return the peers to
        hand back: up to ``a.numwant`` others, ranked by :func:`rank_peers`.
        ``event=stopped`` forgets the peer and returns none (BEP 3)."""
        if a.event == "stopped":
            self.drop_peer(a.info_hash, a.peer_id)
            return []
        previous = self.get_peer(a.info_hash, a.peer_id, now)
        self.put_peer(
            PeerRecord(
                info_hash=a.info_hash,
                peer_id=a.peer_id,
                ip=ip,
                port=a.port,
                left=a.left,
                uploaded=a.uploaded,
                downloaded=a.downloaded,
                first_seen=previous.first_seen if previous else now,
                last_seen=now,
                completed=a.event == "completed" or (previous is not None and previous.completed),
            )
        )
        ranked = rank_peers(self.peers(a.info_hash, now), a.peer_id, a.numwant, (ip, a.port), spare)
        return [record.peer for record in ranked]

    def counts(self, info_hash: bytes, now: float) -> tuple[int, int]:
        """``(complete, incomplete)`` for a tracker reply."""
        return count_peers(self.peers(info_hash, now))

    def report(self, report: NodeReport, now: float) -> list[Completion]:
        """Keep ``report`` as the node's latest; return the artifacts it completed for the
        first time since this coordinator has known it (history records those)."""
        previous = self.get_node(report.node, now)
        state = (
            replace(previous, report=report, last_seen=now)
            if previous
            else NodeState(report=report, first_seen=now, last_seen=now)
        )
        completions = []
        for item in report.artifacts:
            if not item.complete:
                state.started.setdefault(item.info_hash, now)
                state.completed.discard(item.info_hash)  # re-fetching after a wipe
                continue
            if item.info_hash in state.completed:
                continue
            state.completed.add(item.info_hash)
            started = state.started.get(item.info_hash)
            seconds = item.elapsed
            if seconds is None and started is not None:
                seconds = now - started
            completions.append(
                Completion(
                    info_hash=item.info_hash,
                    name=item.name,
                    node=report.node,
                    completed_at=now,
                    seconds=seconds,
                    bytes_by_source=dict(item.bytes_by_source),
                )
            )
        self.put_node(state)
        return completions

    def snapshot(self, now: float) -> dict[str, object]:
        """The fleet as JSON-ready data for ``GET /v1/fleet``.

        ``artifacts`` merges both views of an artifact: the tracker's (``complete`` and
        ``incomplete`` peer counts, ``peers``) and the nodes' reports (``nodes``,
        ``nodes_complete``, ``progress`` = reported bytes held / bytes wanted over the
        reporting nodes, or ``None`` when no node reports it; summed rates and bytes by
        source). Rates are bytes per second, as the nodes report them.
        """
        nodes = sorted(self.nodes(now), key=lambda state: state.report.node)
        node_by_addr = {state.report.addr: state.report.node for state in nodes}
        views: dict[str, _ArtifactView] = {}
        for state in nodes:
            for item in state.report.artifacts:
                views.setdefault(item.info_hash, _ArtifactView(item.info_hash)).add_report(item)
        for raw_hash in self.info_hashes(now):
            view = views.setdefault(raw_hash.hex(), _ArtifactView(raw_hash.hex()))
            view.peers = sorted(self.peers(raw_hash, now), key=lambda peer: (peer.ip, peer.port))
        return {
            "nodes": [
                {
                    "node": state.report.node,
                    "addr": state.report.addr,
                    "age": round(now - state.last_seen, 3),
                    "up_for": round(now - state.first_seen, 3),
                    "artifacts": [item.to_json() for item in state.report.artifacts],
                }
                for state in nodes
            ],
            "artifacts": [
                view.to_json(now, node_by_addr)
                for view in sorted(views.values(), key=lambda view: (view.name, view.info_hash))
            ],
        }


@dataclass(slots=True)
class _ArtifactView:
    """Accumulates one artifact's entry in :meth:`PeerStore.snapshot`."""

    info_hash: str
    name: str = ""
    size: int | None = None
    nodes: int = 0
    nodes_complete: int = 0
    have_bytes: int = 0
    want_bytes: int = 0
    down_rate: float = 0.0
    up_rate: float = 0.0
    bytes_by_source: dict[str, int] = field(default_factory=dict)
    peers: list[PeerRecord] = field(default_factory=list)

    def add_report(self, item: ArtifactReport) -> None:
        self.name = self.name or item.name
        self.size = item.size
        self.nodes += 1
        self.nodes_complete += int(item.complete)
        self.have_bytes += item.have_bytes
        self.want_bytes += item.size
        self.down_rate += item.down_rate
        self.up_rate += item.up_rate
        for source, count in item.bytes_by_source.items():
            self.bytes_by_source[source] = self.bytes_by_source.get(source, 0) + count

    def to_json(self, now: float, node_by_addr: Mapping[str, str]) -> dict[str, object]:
        complete, incomplete = count_peers(self.peers)
        return {
            "info_hash": self.info_hash,
            "name": self.name,
            "size": self.size,
            "nodes": self.nodes,
            "nodes_complete": self.nodes_complete,
            "progress": _fraction(self.have_bytes, self.want_bytes) if self.nodes else None,
            "down_rate": round(self.down_rate, 3),
            "up_rate": round(self.up_rate, 3),
            "bytes_by_source": self.bytes_by_source,
            "complete": complete,
            "incomplete": incomplete,
            "peers": [
                peer.to_json(now, node_by_addr.get(_format_addr(peer.ip, peer.port)))
                for peer in self.peers
            ],
        }


class MemoryPeerStore(PeerStore):
    """In-process store: dictionaries, for a single coordinator."""

    def __init__(self, peer_ttl: float = PEER_TTL, report_ttl: float = REPORT_TTL) -> None:
        super().__init__(peer_ttl, report_ttl)
        self._peers: dict[bytes, dict[bytes, PeerRecord]] = {}
        self._nodes: dict[str, NodeState] = {}

    def _live(self, record: PeerRecord, now: float) -> bool:
        return now - record.last_seen <= self.peer_ttl

    def get_peer(self, info_hash: bytes, peer_id: bytes, now: float) -> PeerRecord | None:
        record = self._peers.get(info_hash, {}).get(peer_id)
        return record if record is not None and self._live(record, now) else None

    def put_peer(self, record: PeerRecord) -> None:
        self._peers.setdefault(record.info_hash, {})[record.peer_id] = record

    def drop_peer(self, info_hash: bytes, peer_id: bytes) -> None:
        swarm = self._peers.get(info_hash)
        if swarm is not None:
            swarm.pop(peer_id, None)
            if not swarm:
                del self._peers[info_hash]

    def peers(self, info_hash: bytes, now: float) -> list[PeerRecord]:
        return [r for r in self._peers.get(info_hash, {}).values() if self._live(r, now)]

    def info_hashes(self, now: float) -> list[bytes]:
        return [
            h for h, swarm in self._peers.items() if any(self._live(r, now) for r in swarm.values())
        ]

    def get_node(self, node: str, now: float) -> NodeState | None:
        state = self._nodes.get(node)
        return state if state is not None and now - state.last_seen <= self.report_ttl else None

    def put_node(self, state: NodeState) -> None:
        self._nodes[state.report.node] = state

    def nodes(self, now: float) -> list[NodeState]:
        return [s for s in self._nodes.values() if now - s.last_seen <= self.report_ttl]

    def expire(self, now: float) -> tuple[int, int]:
        dropped_peers = 0
        for info_hash in list(self._peers):
            swarm = self._peers[info_hash]
            for peer_id in [p for p, r in swarm.items() if not self._live(r, now)]:
                del swarm[peer_id]
                dropped_peers += 1
            if not swarm:
                del self._peers[info_hash]
        stale = [n for n, s in self._nodes.items() if now - s.last_seen > self.report_ttl]
        for node in stale:
            del self._nodes[node]
        return dropped_peers, len(stale)


# -- report validation helpers ------------------------------------------------------------


def _fraction(part: int, whole: int) -> float:
    # An empty artifact (or no reporting node) counts as done only if nothing is wanted.
    return 1.0 if whole <= 0 else round(min(part / whole, 1.0), 6)


def _format_addr(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _addr(text: str) -> str:
    host, sep, port_text = text.rpartition(":")
    try:
        if not sep or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError
        return _format_addr(normalize_ip(host), int(port_text))
    except ValueError:
        raise ReportError(
            f"report.addr must be 'ip:port' (IPv6 as '[ip]:port'), got {text!r}"
        ) from None


def _mapping(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise ReportError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _str(body: Mapping[str, object], key: str, where: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise ReportError(f"{where}.{key} must be a string, got {value!r}")
    return value


def _nonneg_int(body: Mapping[str, object], key: str, where: str) -> int:
    value = body.get(key)
    # bool is an int in Python but never a byte count in JSON.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_BYTES:
        shown = value if not isinstance(value, int) or value.bit_length() < 128 else "(huge)"
        raise ReportError(
            f"{where}.{key} must be a non-negative integer below 2**63, got {shown!r}"
        )
    return value


def _nonneg_float(value: object, name: str, limit: float = MAX_RATE) -> float:
    try:
        valid = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and 0 <= value <= limit
        )
    except OverflowError:  # a JSON integer beyond float range, like 10**400 (tests/fuzz)
        valid = False
    if not valid:
        shown = "(huge)" if isinstance(value, int) and value.bit_length() >= 128 else repr(value)
        raise ReportError(f"{name} must be a non-negative number up to {limit:g}, got {shown}")
    return float(value)


def _artifact(value: object, where: str) -> ArtifactReport:
    body = _mapping(value, where)
    info_hash = _str(body, "info_hash", where).lower()
    if len(info_hash) != 40 or any(c not in "0123456789abcdef" for c in info_hash):
        raise ReportError(f"{where}.info_hash must be 40 hex characters (SHA-1), got {info_hash!r}")
    size = _nonneg_int(body, "size", where)
    have = _nonneg_int(body, "have_bytes", where)
    if have > size:
        raise ReportError(f"{where}.have_bytes ({have}) exceeds size ({size})")
    complete = body.get("complete")
    if not isinstance(complete, bool):
        raise ReportError(f"{where}.complete must be true or false, got {complete!r}")
    name = _str(body, "name", where)
    if len(name) > MAX_NAME:
        raise ReportError(f"{where}.name is {len(name)} characters; at most {MAX_NAME}")
    sources = _mapping(body.get("bytes_by_source"), f"{where}.bytes_by_source")
    if len(sources) > MAX_SOURCES or any(len(key) > MAX_SOURCE_NAME for key in sources):
        raise ReportError(
            f"{where}.bytes_by_source must have at most {MAX_SOURCES} keys of at most "
            f"{MAX_SOURCE_NAME} characters"
        )
    by_source = {key: _nonneg_int(sources, key, f"{where}.bytes_by_source") for key in sources}
    elapsed = body.get("elapsed")
    pieces = piece_size = piece_count = None
    if body.get("pieces") is not None:
        piece_size, piece_count, pieces = _geometry(body, size, where)
    return ArtifactReport(
        info_hash=info_hash,
        name=name,
        size=size,
        have_bytes=have,
        complete=complete,
        bytes_by_source=by_source,
        down_rate=_nonneg_float(body.get("down_rate"), f"{where}.down_rate"),
        up_rate=_nonneg_float(body.get("up_rate"), f"{where}.up_rate"),
        elapsed=None
        if elapsed is None
        else _nonneg_float(elapsed, f"{where}.elapsed", MAX_ELAPSED),
        piece_size=piece_size,
        piece_count=piece_count,
        pieces=pieces,
    )


MAX_ELAPSED: Final = 10 * 365 * 86400.0
"""Longest fetch duration accepted (seconds): ten years, to keep history's sums finite."""


def _geometry(body: Mapping[str, object], size: int, where: str) -> tuple[int, int, bytes]:
    """``(piece_size, piece_count, bitfield)`` of a report that sends its pieces, checked
    against its ``size`` the way BitTorrent metainfo is: a power-of-two piece size
    within libtorrent's range, ``piece_count == ceil(size / piece_size)``, and a bitfield
    of exactly ``ceil(piece_count / 8)`` bytes. Checked before decoding, so a bogus
    geometry costs nothing (issue 15: ``piece_size: 1`` with a large ``size``)."""
    piece_size = _nonneg_int(body, "piece_size", where)
    if not MIN_PIECE_SIZE <= piece_size <= MAX_PIECE_SIZE or piece_size & (piece_size - 1):
        raise ReportError(
            f"{where}.piece_size must be a power of two from {MIN_PIECE_SIZE} to "
            f"{MAX_PIECE_SIZE} bytes, got {piece_size}"
        )
    piece_count = _nonneg_int(body, "piece_count", where)
    expected = -(-size // piece_size)
    if piece_count != expected:
        raise ReportError(
            f"{where}.piece_count must be ceil(size / piece_size) = {expected}, got {piece_count}"
        )
    if piece_count > MAX_PIECE_COUNT:
        raise ReportError(
            f"{where} has {piece_count} pieces; this coordinator tracks at most "
            f"{MAX_PIECE_COUNT} (publish with a larger --piece-size)"
        )
    text = _str(body, "pieces", where)
    if len(text) != 4 * -(-((piece_count + 7) // 8) // 3):
        raise ReportError(f"{where}.pieces must be base64 of {(piece_count + 7) // 8} bytes")
    try:
        pieces = base64.b64decode(text, validate=True)
    except ValueError:
        raise ReportError(f"{where}.pieces must be base64") from None
    if len(pieces) != (piece_count + 7) // 8:
        raise ReportError(f"{where}.pieces must hold {piece_count} bits")
    return piece_size, piece_count, pieces
