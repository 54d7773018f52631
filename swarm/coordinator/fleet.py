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

The rest of the soft state sits beside this interface, a room per role: report types and
their parsing in :mod:`swarm.coordinator.reports`, peer ranking in
:mod:`swarm.coordinator.ranking`, the in-process store in
:mod:`swarm.coordinator.memorystore` and the Redis one in
:mod:`swarm.coordinator.redisstore`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from swarm.coordinator.reports import (
    ArtifactReport,
    Completion,
    NodeReport,
    NodeState,
    PeerRecord,
    format_addr,
    fraction,
)
from swarm.coordinator.tracker import Announce, Peer

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
:func:`swarm.coordinator.load.report_interval`)."""

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
changes since as a delta on its next report. That is for :data:`MEMBERS_FULL_NODES`
members or more; a shorter list is rebuilt sooner (:func:`full_list_period`)."""

MEMBERS_FULL_NODES: Final = 10_000
"""Members from which a stale whole list is reused for :data:`MEMBERS_FULL_PERIOD`."""


def full_list_period(members: int) -> float:
    """Seconds a stale whole member list of ``members`` is reused: in proportion to its
    length (the cost of a rebuild), so that the rebuilds cost about the same each second
    whatever the fleet's size. A node's first list is its peer filter until its next
    report: far-region's four nodes joined within 0.1 s, got lists up to a second old
    that lacked each other, and refused each other's connections (each refusal a report
    and a dial-back later)."""
    return MEMBERS_FULL_PERIOD * min(1.0, members / MEMBERS_FULL_NODES)


def count_peers(peers: Iterable[PeerRecord]) -> tuple[int, int]:
    """``(complete, incomplete)`` as a tracker reply reports them: seeders, leechers."""
    complete = incomplete = 0
    for peer in peers:
        if peer.seeder:
            complete += 1
        else:
            incomplete += 1
    return complete, incomplete


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
            "progress": fraction(self.have_bytes, self.want_bytes) if self.nodes else None,
            "down_rate": round(self.down_rate, 3),
            "up_rate": round(self.up_rate, 3),
            "bytes_by_source": self.bytes_by_source,
            "complete": complete,
            "incomplete": incomplete,
            "peers": [
                peer.to_json(now, node_by_addr.get(format_addr(peer.ip, peer.port)))
                for peer in self.peers
            ],
        }
