"""The coordinator's soft state: who holds what, how fast nodes move bytes, and expiry.

Everything here is soft (ARCHITECTURE, "Scale beyond one machine"): peers re-announce
every ``interval`` and nodes report every few seconds, so a restarted coordinator is
whole again within one announce interval. Clocks are passed in as ``now`` (seconds,
wall clock in production, any float in tests); nothing here imports time or random.

:class:`PeerStore` is the seam for a shared store (Redis) behind several coordinators.
Its per-request operations do work independent of the fleet's size (issue 12): expiry
pops stale entries from the front of insertion-ordered tables, an announce ranks a
window of a cached ranking, membership is an epoch plus a log of changes. Every input is
bounded (issue 15): a report's geometry must agree with its size, names and counters
are capped, and peers, nodes and stored bytes have maxima past which a request is
refused (:class:`StoreFull`) rather than the process grown.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
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
"""Seconds between a node's reports in a small fleet: the shortest interval a
``/v1/report`` reply asks for (the coordinator lengthens it with the fleet's size, see
:func:`swarm.coordinator.app.report_interval`)."""

REPORT_TTL: Final = 10.0
"""Seconds after its last report that a node leaves the fleet view: ten missed reports,
so a node stalled by a busy disk for a few seconds does not flicker out of ``status``."""

REPORT_TTL_INTERVALS: Final = 3
"""...or this many report intervals, if longer (the interval grows with the fleet)."""

MAX_PEERS: Final = 100_000
"""Tracker entries (artifact, peer) kept at once, about 30 MB; an announce from a new
peer past it gets a failure reason and retries at the next interval."""

MAX_NODES: Final = 50_000
"""Nodes tracked at once (Kraken runs 8,000 hosts per cluster); a report from a new node
past it is refused (503) until nodes expire."""

NODE_BUDGET: Final = 64 << 20
"""Bytes of stored node reports (:func:`report_weight`): 5,000 daemons with one artifact
take about 6 MB; a flood of 1,024-artifact reports stops here instead of at the OOM
killer (issue 15)."""

RANK_PERIOD: Final = 1.0
"""Seconds a swarm's peer ranking is reused. Ranking sorts the swarm; redoing that on
every announce cost O(N log N) per announce, most of a core at 1,000 nodes (issue 12)."""

MEMBERS_LOG: Final = 65_536
"""Membership changes kept for deltas; a node further behind gets the whole list."""

MEMBERS_DELTA_MIN: Final = 64
"""A delta is sent instead of the whole list while it is at most this long or at most
as long as the list."""

MEMBERS_FULL_PERIOD: Final = 1.0
"""Seconds the whole member list (sorted, encoded) is reused before it is rebuilt, so a
thousand nodes joining in a second do not each sort the fleet; a node given it gets the
changes since as a delta on its next report."""

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
    uploaded: int | None = None
    """Optional: payload bytes uploaded to peers so far (a counter). The coordinator
    measures the node's upload capacity from it; ``up_rate`` is libtorrent's 5-second
    average, which takes seconds to show a saturated uplink."""

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
    expires_at: float = math.inf
    """When the node leaves the fleet unless it reports again (a few of the report
    intervals it was told, at least ``REPORT_TTL``)."""
    started: dict[str, float] = field(default_factory=dict)
    """info_hash -> when this node was first seen holding it incomplete."""
    completed: set[str] = field(default_factory=set)
    """info_hashes this node has been seen complete (a completion is recorded once)."""
    weight: int = 0
    """Bytes this state takes, about (:func:`report_weight`), for the store's budget."""


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


class StoreFull(Exception):
    """The store is at a bound (peers, nodes, or bytes of node state); the message says
    which. Reported to the client as retryable: state expires, and room comes back."""


@dataclass(frozen=True, slots=True)
class Members:
    """The membership part of a report reply (:meth:`PeerStore.members`).

    ``epoch`` names the list the node holds once it applied this reply; ``members`` (the
    whole list) or ``delta`` (ops to apply in order) are JSON array texts, ready to embed
    in the reply; both ``None`` means the node's list is current."""

    epoch: str
    members: str | None = None
    delta: str | None = None


def report_weight(report: NodeReport) -> int:
    """Bytes a node's stored report takes, about (Python objects, measured with
    tracemalloc for the daemon's report: ~0.9 KB for one artifact of three sources)."""
    return NODE_WEIGHT + sum(
        ARTIFACT_WEIGHT + 2 * len(item.name) + SOURCE_WEIGHT * len(item.bytes_by_source)
        for item in report.artifacts
    )


NODE_WEIGHT: Final = 512
ARTIFACT_WEIGHT: Final = 512
SOURCE_WEIGHT: Final = 128


class PeerStore(ABC):
    """Soft state of the swarm: peers by (info_hash, peer_id), node reports by node id,
    and the fleet's membership (the addresses of the nodes that report).

    Subclasses implement storage; readers must already hide entries older than
    ``peer_ttl`` / a node's own TTL so correctness never waits on :meth:`expire`, which
    only reclaims space. Every per-request operation (announce, report, members) does
    work independent of the fleet's size; only the fleet view (:meth:`snapshot`) and the
    sweep walk the fleet.
    """

    def __init__(self, peer_ttl: float = PEER_TTL, report_ttl: float = REPORT_TTL) -> None:
        if peer_ttl <= 0 or report_ttl <= 0:
            raise ValueError(
                f"TTLs must be positive, got peer_ttl={peer_ttl} report_ttl={report_ttl}"
            )
        self.peer_ttl = peer_ttl
        self.report_ttl = report_ttl

    # -- tracker ------------------------------------------------------------------------

    @abstractmethod
    def announce(self, a: Announce, ip: str, now: float) -> list[Peer]:
        """Record an announce from ``ip`` (already normalised) and return the peers to
        hand back: up to ``a.numwant`` others, ranked by :func:`rank_peers` (a large
        swarm from a ranking at most ``RANK_PERIOD`` old, see :func:`pick_candidates`).
        ``event=stopped`` forgets the peer and returns none (BEP 3).

        Raises:
            StoreFull: a new peer past ``MAX_PEERS``.
        """

    @abstractmethod
    def counts(self, info_hash: bytes, now: float) -> tuple[int, int]:
        """``(complete, incomplete)`` for a tracker reply."""

    @abstractmethod
    def get_peer(self, info_hash: bytes, peer_id: bytes, now: float) -> PeerRecord | None:
        """The live record, or ``None`` if absent or expired."""

    @abstractmethod
    def peers(self, info_hash: bytes, now: float) -> list[PeerRecord]:
        """Live peers of one artifact, in no particular order (the fleet view's)."""

    @abstractmethod
    def info_hashes(self, now: float) -> list[bytes]:
        """Artifacts with at least one live peer."""

    @abstractmethod
    def set_spare(self, addr: str, spare: float) -> None:
        """Upload headroom (bytes/s) of the node listening at ``addr``, for ranking."""

    # -- nodes --------------------------------------------------------------------------

    @abstractmethod
    def get_node(self, node: str, now: float) -> NodeState | None: ...

    @abstractmethod
    def put_node(self, state: NodeState) -> None:
        """Keep ``state`` as the node's latest (its ``expires_at`` set).

        Raises:
            StoreFull: a new node past ``MAX_NODES``, or more node state than the budget.
        """

    @abstractmethod
    def nodes(self, now: float) -> list[NodeState]:
        """Nodes whose last report has not expired (the fleet view's)."""

    @abstractmethod
    def node_count(self, now: float) -> int:
        """About how many nodes report (stale ones count until the next sweep)."""

    @abstractmethod
    def members(self, epoch: str | None, now: float, legacy: bool = False) -> Members:
        """The membership a node holding list ``epoch`` (``None``: none yet) needs: nothing
        if it is current, else the changes since (``delta``), or the whole list when
        the changes are not kept or would be longer. ``legacy``: the node sends no epoch
        and wants the whole list every time (daemons before issue 12)."""

    @abstractmethod
    def expire(self, now: float) -> tuple[int, int]:
        """Drop stale peers and nodes; return how many of each were dropped since the
        last call (readers may drop stale peers on the way, and those count too)."""

    @abstractmethod
    def departed(self) -> list[str]:
        """Node ids dropped since the last call (the planner forgets them)."""

    def coordinators(self, now: float) -> int:
        """Coordinators sharing this store's fleet (1 unless the store is shared)."""
        return 1

    # -- shared logic -------------------------------------------------------------------

    def report(self, report: NodeReport, now: float, ttl: float | None = None) -> list[Completion]:
        """Keep ``report`` as the node's latest until ``now + ttl`` (default the store's
        ``report_ttl``); return the artifacts it completed for the first time since this
        coordinator has known it (history records those). Bitfields are not kept: the
        planner holds them.

        Raises:
            StoreFull: see :meth:`put_node`; nothing is recorded then.
        """
        report = slim(report)
        previous = self.get_node(report.node, now)
        expires = now + (self.report_ttl if ttl is None else ttl)
        state = (
            replace(
                previous,
                report=report,
                last_seen=now,
                expires_at=expires,
                started=dict(previous.started),
                completed=set(previous.completed),
            )
            if previous
            else NodeState(report=report, first_seen=now, last_seen=now, expires_at=expires)
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
        # forget artifacts the node no longer lists, so its state stays bounded
        listed = {item.info_hash for item in report.artifacts}
        state.started = {k: v for k, v in state.started.items() if k in listed}
        state.completed &= listed
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


def slim(report: NodeReport) -> NodeReport:
    """``report`` without its bitfields (the planner keeps those, as ints)."""
    if all(item.pieces is None for item in report.artifacts):
        return report
    return replace(report, artifacts=tuple(replace(item, pieces=None) for item in report.artifacts))


def host_of(addr: str) -> str:
    """The IP of an ``ip:port`` / ``[ip]:port`` address (as normalised by parse_report)."""
    return addr.rpartition(":")[0].strip("[]")


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def parse_epoch(epoch: object) -> str | None:
    """A node's ``members_epoch`` as sent: a short string, or None for anything else."""
    return epoch if isinstance(epoch, str) and 0 < len(epoch) <= MAX_EPOCH else None


MAX_EPOCH: Final = 64


def pick_candidates(
    ranked: Sequence[PeerRecord],
    runs: Sequence[tuple[int, int]],
    requester: bytes,
    want: int,
) -> list[PeerRecord]:
    """Up to ``want`` peers from ``ranked`` (a swarm sorted by :func:`class_key`, with
    ``runs`` the ``[start, end)`` spans of equal keys): whole classes from the best down,
    then, from the first class that does not fit, a window of it that starts at an
    offset given by the requester's id. So each requester still gets its own stable
    slice of a thousand equal seeders (the spread of :func:`rank_peers`) without the
    whole swarm being sorted for it."""
    out: list[PeerRecord] = []
    for start, end in runs:
        size = end - start
        room = want - len(out)
        if size <= room:
            out.extend(ranked[start:end])
        else:
            offset = int.from_bytes(_spread(requester, b"window"), "big") % size
            picked = [ranked[start + (offset + k) % size] for k in range(room)]
            out.extend(picked)
        if len(out) >= want:
            break
    return out


def class_key(peer: PeerRecord, spare: Mapping[tuple[str, int], float]) -> tuple[bool, int, int]:
    """:func:`rank_peers`' order without its per-requester tie-break."""
    bucket = int(spare.get((peer.ip, peer.port), 0.0) // SPARE_BUCKET)
    return (not peer.seeder, -bucket, peer.left)


def build_ranking(
    peers: Iterable[PeerRecord], spare: Mapping[tuple[str, int], float]
) -> tuple[list[PeerRecord], list[tuple[int, int]]]:
    """A swarm sorted by :func:`class_key` (then peer id), and the spans of equal keys."""
    ranked = sorted(peers, key=lambda p: (*class_key(p, spare), p.peer_id))
    keys = [class_key(p, spare) for p in ranked]
    runs: list[tuple[int, int]] = []
    start = 0
    for index in range(1, len(ranked) + 1):
        if index == len(ranked) or keys[index] != keys[start]:
            runs.append((start, index))
            start = index
    return ranked, runs


def serve_ranking(
    ranked: Sequence[PeerRecord],
    runs: Sequence[tuple[int, int]],
    live: Mapping[bytes, PeerRecord],
    a: Announce,
    ip: str,
) -> list[PeerRecord]:
    """``a.numwant`` peers for ``a``'s sender from a ranking (:func:`pick_candidates`),
    each as its current record in ``live`` (the ranking may be a second old), never the
    sender itself (by id or by address)."""
    out = []
    for peer in pick_candidates(ranked, runs, a.peer_id, a.numwant + 2):
        record = live.get(peer.peer_id)
        if (
            record is None
            or record.peer_id == a.peer_id
            or (record.ip, record.port)
            == (
                ip,
                a.port,
            )
        ):
            continue
        out.append(record)
        if len(out) == a.numwant:
            break
    return out


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


@dataclass(slots=True)
class _Swarm:
    """One artifact's peers, oldest announce first (expiry pops from the front), with a
    ranking rebuilt at most every ``RANK_PERIOD`` seconds."""

    peers: OrderedDict[bytes, PeerRecord] = field(default_factory=OrderedDict)
    seeders: int = 0
    ranked: list[PeerRecord] = field(default_factory=list)
    runs: list[tuple[int, int]] = field(default_factory=list)
    ranked_at: float | None = None


class MemoryPeerStore(PeerStore):
    """In-process store for a single coordinator. Peers and nodes sit in insertion-ordered
    dictionaries refreshed on each announce or report, so expiry pops stale entries
    from the front; membership is a reference count per IP plus a log of changes."""

    def __init__(
        self,
        peer_ttl: float = PEER_TTL,
        report_ttl: float = REPORT_TTL,
        *,
        generation: str = "0",
        max_peers: int = MAX_PEERS,
        max_nodes: int = MAX_NODES,
        node_budget: int = NODE_BUDGET,
    ) -> None:
        super().__init__(peer_ttl, report_ttl)
        self.generation = generation
        self.max_peers = max_peers
        self.max_nodes = max_nodes
        self.node_budget = node_budget
        self._swarms: dict[bytes, _Swarm] = {}
        self._peer_count = 0
        self._dropped_peers = 0
        self._nodes: OrderedDict[str, NodeState] = OrderedDict()
        self._weight = 0
        self._departed: list[str] = []
        self._spare: dict[tuple[str, int], float] = {}
        self._ip_refs: dict[str, int] = {}
        self._seq = 0
        self._log = bytearray()
        """Membership ops ("+ip" / "-ip") as JSON strings, each followed by a comma; the op
        at ``_log[_offsets[i]:]`` made epoch ``_log_first + i``. One buffer, appended in
        place, so that a delta is one slice rather than a join of thousands of ops."""
        self._offsets: list[int] = []
        self._log_first = 1
        self._full: tuple[int, str, float] | None = None
        """(seq, JSON text of the sorted list, built at)."""

    # -- peers --------------------------------------------------------------------------

    def _trim(self, info_hash: bytes, swarm: _Swarm, now: float) -> None:
        peers = swarm.peers
        while peers:
            oldest = next(iter(peers.values()))
            if now - oldest.last_seen <= self.peer_ttl:
                break
            self._remove_peer(info_hash, swarm, oldest.peer_id)
            self._dropped_peers += 1

    def _remove_peer(self, info_hash: bytes, swarm: _Swarm, peer_id: bytes) -> None:
        record = swarm.peers.pop(peer_id, None)
        if record is None:
            return
        self._peer_count -= 1
        swarm.seeders -= record.seeder
        if not swarm.peers:
            del self._swarms[info_hash]

    def announce(self, a: Announce, ip: str, now: float) -> list[Peer]:
        swarm = self._swarms.get(a.info_hash)
        if a.event == "stopped":
            if swarm is not None:
                self._remove_peer(a.info_hash, swarm, a.peer_id)
            return []
        if swarm is not None:
            self._trim(a.info_hash, swarm, now)
            swarm = self._swarms.get(a.info_hash)
        previous = swarm.peers.get(a.peer_id) if swarm is not None else None
        if previous is None and self._peer_count >= self.max_peers:
            raise StoreFull(f"the tracker holds {self._peer_count} peers, its maximum")
        if swarm is None:
            swarm = self._swarms[a.info_hash] = _Swarm()
        record = PeerRecord(
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
        if previous is None:
            self._peer_count += 1
        else:
            swarm.seeders -= previous.seeder
            swarm.peers.move_to_end(a.peer_id)
        swarm.peers[a.peer_id] = record
        swarm.seeders += record.seeder
        return [peer.peer for peer in self._ranked(swarm, a, ip, now)]

    def _ranked(self, swarm: _Swarm, a: Announce, ip: str, now: float) -> list[PeerRecord]:
        """Up to ``a.numwant`` peers for ``a``'s sender. A swarm that fits in one reply is
        ranked exactly (:func:`rank_peers`); a larger one is served from its ranking,
        rebuilt every ``RANK_PERIOD`` s or when the swarm doubled since
        (:func:`pick_candidates`), so an announce costs O(numwant) however large the
        swarm (amortised: a rebuild sorts the swarm)."""
        if a.numwant <= 0:
            return []
        if len(swarm.peers) <= a.numwant + 2:  # the requester, by id and by address
            return rank_peers(swarm.peers.values(), a.peer_id, a.numwant, (ip, a.port), self._spare)
        if (
            swarm.ranked_at is None
            or not 0 <= now - swarm.ranked_at < RANK_PERIOD
            or len(swarm.peers) > 2 * len(swarm.ranked)  # a scale-out doubled it
        ):
            swarm.ranked, swarm.runs = build_ranking(swarm.peers.values(), self._spare)
            swarm.ranked_at = now
        return serve_ranking(swarm.ranked, swarm.runs, swarm.peers, a, ip)

    def counts(self, info_hash: bytes, now: float) -> tuple[int, int]:
        swarm = self._swarms.get(info_hash)
        if swarm is None:
            return 0, 0
        self._trim(info_hash, swarm, now)
        return swarm.seeders, len(swarm.peers) - swarm.seeders

    def get_peer(self, info_hash: bytes, peer_id: bytes, now: float) -> PeerRecord | None:
        swarm = self._swarms.get(info_hash)
        record = swarm.peers.get(peer_id) if swarm is not None else None
        return record if record is not None and now - record.last_seen <= self.peer_ttl else None

    def peers(self, info_hash: bytes, now: float) -> list[PeerRecord]:
        swarm = self._swarms.get(info_hash)
        if swarm is None:
            return []
        self._trim(info_hash, swarm, now)
        return list(swarm.peers.values())

    def info_hashes(self, now: float) -> list[bytes]:
        for info_hash, swarm in list(self._swarms.items()):
            self._trim(info_hash, swarm, now)
        return list(self._swarms)

    def set_spare(self, addr: str, spare: float) -> None:
        self._spare[split_addr(addr)] = spare

    # -- nodes --------------------------------------------------------------------------

    def get_node(self, node: str, now: float) -> NodeState | None:
        state = self._nodes.get(node)
        return state if state is not None and now <= state.expires_at else None

    def put_node(self, state: NodeState) -> None:
        node = state.report.node
        old = self._nodes.get(node)
        weight = report_weight(state.report)
        grows = weight - (old.weight if old is not None else 0)
        if old is None and len(self._nodes) >= self.max_nodes:
            raise StoreFull(f"the coordinator tracks {len(self._nodes)} nodes, its maximum")
        if grows > 0 and self._weight + grows > self.node_budget:
            raise StoreFull(f"node state is at its budget ({self.node_budget} bytes)")
        state.weight = weight
        self._weight += grows
        if old is None:
            self._ref(host_of(state.report.addr), 1)
        else:
            self._nodes.move_to_end(node)
            if old.report.addr != state.report.addr:
                self._spare.pop(split_addr(old.report.addr), None)
                self._ref(host_of(state.report.addr), 1)
                self._ref(host_of(old.report.addr), -1)
        self._nodes[node] = state

    def nodes(self, now: float) -> list[NodeState]:
        return [s for s in self._nodes.values() if now <= s.expires_at]

    def node_count(self, now: float) -> int:
        return len(self._nodes)

    def expire(self, now: float) -> tuple[int, int]:
        for info_hash, swarm in list(self._swarms.items()):
            self._trim(info_hash, swarm, now)
        dropped_peers, self._dropped_peers = self._dropped_peers, 0
        # Nodes sit in report order; their TTLs differ a little (they follow the interval
        # each was told), so a node may outlive its TTL behind an older one by as much.
        # Readers hide it meanwhile.
        dropped_nodes = 0
        while self._nodes:
            node, state = next(iter(self._nodes.items()))
            if now <= state.expires_at:
                break
            del self._nodes[node]
            self._weight -= state.weight
            self._spare.pop(split_addr(state.report.addr), None)
            self._ref(host_of(state.report.addr), -1)
            self._departed.append(node)
            dropped_nodes += 1
        return dropped_peers, dropped_nodes

    def departed(self) -> list[str]:
        gone, self._departed = self._departed, []
        return gone

    # -- membership ---------------------------------------------------------------------

    def _ref(self, ip: str, delta: int) -> None:
        count = self._ip_refs.get(ip, 0) + delta
        if count > 0:
            self._ip_refs[ip] = count
            if count == delta:  # 0 -> positive: a new member
                self._log_op("+" + ip)
        else:
            self._ip_refs.pop(ip, None)
            self._log_op("-" + ip)

    def _log_op(self, op: str) -> None:
        self._seq += 1
        self._offsets.append(len(self._log))
        self._log += json.dumps(op).encode() + b","
        if len(self._offsets) > 2 * MEMBERS_LOG:
            cut = self._offsets[MEMBERS_LOG]
            del self._log[:cut]
            self._offsets = [offset - cut for offset in self._offsets[MEMBERS_LOG:]]
            self._log_first += MEMBERS_LOG

    def members(self, epoch: str | None, now: float, legacy: bool = False) -> Members:
        current = f"{self.generation}.{self._seq}"
        if not legacy and epoch == current:
            return Members(current)
        if not legacy and epoch is not None:
            generation, _, seq_text = epoch.rpartition(".")
            seq = int(seq_text) if seq_text.isdigit() and len(seq_text) < 19 else -1
            behind = self._seq - seq
            if (
                generation == self.generation
                and seq + 1 >= self._log_first
                and 0 < behind <= max(MEMBERS_DELTA_MIN, len(self._ip_refs))
            ):
                ops = self._log[self._offsets[seq + 1 - self._log_first] : -1]
                return Members(current, delta="[" + ops.decode() + "]")
        full = self._full
        if full is None or (full[0] != self._seq and now - full[2] >= MEMBERS_FULL_PERIOD):
            full = self._full = (self._seq, json.dumps(sorted(self._ip_refs)), now)
        return Members(f"{self.generation}.{full[0]}", members=full[1])


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
    return float(value)  # type: ignore[arg-type]  # checked above: an int or a float


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
        uploaded=None if body.get("uploaded") is None else _nonneg_int(body, "uploaded", where),
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
