"""The in-process peer store (:class:`MemoryPeerStore`), for a single coordinator.

It implements :class:`swarm.coordinator.fleet.PeerStore` with insertion-ordered
dictionaries, so expiry pops stale entries from the front; the Redis store that several
coordinators share is :mod:`swarm.coordinator.redisstore`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field

from swarm.coordinator.fleet import (
    MAX_NODES,
    MAX_PEERS,
    MEMBERS_DELTA_MIN,
    MEMBERS_LOG,
    NODE_BUDGET,
    PEER_TTL,
    RANK_PERIOD,
    REPORT_TTL,
    Members,
    PeerStore,
    StoreFull,
    full_list_period,
    host_of,
    report_weight,
    split_addr,
)
from swarm.coordinator.ranking import build_ranking, rank_peers, serve_ranking
from swarm.coordinator.reports import NodeState, PeerRecord
from swarm.coordinator.tracker import Announce, Peer


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
        if full is None or (
            full[0] != self._seq and now - full[2] >= full_list_period(len(self._ip_refs))
        ):
            full = self._full = (self._seq, json.dumps(sorted(self._ip_refs)), now)
        return Members(f"{self.generation}.{full[0]}", members=full[1])
