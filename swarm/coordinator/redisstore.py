"""The coordinator's soft state in Redis, so that several coordinators serve one fleet
(``swarm coordinator --store redis://HOST:PORT/DB``, issue 12).

Two stores with the same contracts as the in-memory ones: :class:`RedisPeerStore`
(tracker peers, node reports, membership; :class:`swarm.coordinator.fleet.PeerStore`) and
:class:`RedisPlanState` (availability counts, stripes, rates, modes;
:class:`swarm.coordinator.planstate.PlanState`). Every change that several coordinators could
make at once to shared keys runs as one Lua script, so it is atomic: an announce, a
node's report, a planning commit (bitfield change, stripe claims), a sweep. A report
costs a handful of round trips whatever the fleet's size.

Layout (all keys under ``PREFIX``; ``{ih}`` is an info-hash in hex):

- tracker: ``peers:{ih}`` hash peer id -> ``seeder|ip|port|left|up|down|first|last|completed``,
  ``seen:{ih}`` zset by last announce (expiry), ``count:{ih}`` hash ``seeders``/``total``,
  ``swarms`` set, ``npeers`` counter, ``spare`` hash ``ip:port`` -> bytes/s;
- nodes: ``node:{id}`` JSON of the node's state, ``nodes`` zset by expiry, ``nodeinfo``
  hash id -> ``weight|ip|addr``, ``weight`` counter; membership: ``ips`` hash ip ->
  nodes there, ``mlog`` list of ops, ``mseq`` epoch counter, ``generation``;
- planning: ``art:{ih}`` hash (geometry, estimate, holders), ``avail:{ih}`` (BITFIELD
  u32 per piece), ``union:{ih}`` and ``assigned:{ih}`` bitmaps (bit i = piece i, the
  BitTorrent order), ``held:{ih}:{node}`` bitmaps, ``owner:{ih}`` piece -> node,
  ``stripe:{ih}:{node}`` sets, ``owners:{ih}``, ``wide:{ih}``, ``progress:{ih}``,
  ``stripelen:{ih}``, ``s3:{ih}``, ``rec:{ih}`` (rates and mode per node),
  ``arts:{node}``, ``artifacts``, ``planbytes``;
- ``coordinators`` zset: each coordinator's last sweep (how many share the fleet).

Scripts touch keys they derive (another node's stripe set), which a single Redis
allows; Redis Cluster would need hash tags per artifact (not supported here).

Calls are synchronous on the event loop, like the SQLite history: a loopback or LAN
round trip is a fraction of a millisecond, and a coordinator has nothing else to do
meanwhile than answer the next request, which needs the same store. A Redis that does
not answer within ``SOCKET_TIMEOUT`` fails the request (503 / failure reason), never
the coordinator.

The Lua scripts are in :mod:`swarm.coordinator.redisscripts`, :class:`RedisPlanState` in
:mod:`swarm.coordinator.redisplan`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlparse

import redis

from swarm.coordinator.fleet import (
    MAX_NODES,
    MAX_PEERS,
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
    slim,
)
from swarm.coordinator.ranking import build_ranking, rank_peers, serve_ranking
from swarm.coordinator.redisscripts import ANNOUNCE, EXPIRE_NODES, MEMBERS, REPORT, TRIM
from swarm.coordinator.reports import ArtifactReport, Completion, NodeReport, NodeState, PeerRecord
from swarm.coordinator.tracker import Announce, Peer
from swarm.errors import UsageError

PREFIX: Final = "swarm:"
SOCKET_TIMEOUT: Final = 2.0
"""Seconds a Redis call may take before the request fails (a node retries at its next
interval; a tracker client at its next announce)."""

COORDINATOR_TTL: Final = 3.0
"""A coordinator that has not swept for this long no longer counts as sharing the load."""

NODE_COUNT_PERIOD: Final = 0.5
"""Seconds the fleet's size (for the report interval) is reused before asking Redis."""

SEQ_PERIOD: Final = 0.25
"""Seconds the membership epoch read from Redis is taken as current (a node whose list
is current then costs no round trip for it)."""


def connect(url: str) -> redis.Redis:
    """A client for ``redis://HOST:PORT/DB``.

    Raises:
        UsageError: the URL is not a redis:// URL.
    """
    parsed = urlparse(url)
    if parsed.scheme != "redis" or not parsed.hostname:
        raise UsageError(f"--store must be redis://HOST:PORT/DB, got {url!r}")
    return redis.Redis.from_url(
        url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
    )


# -- the peer store ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Ranking:
    at: float
    ranked: list[PeerRecord]
    runs: list[tuple[int, int]]
    live: dict[bytes, PeerRecord]


def _record(info_hash: bytes, peer_id: bytes, raw: bytes) -> PeerRecord:
    f = raw.decode().split("|")
    return PeerRecord(
        info_hash=info_hash,
        peer_id=peer_id,
        ip=f[1],
        port=int(f[2]),
        left=int(f[3]),
        uploaded=int(f[4]),
        downloaded=int(f[5]),
        first_seen=float(f[6]),
        last_seen=float(f[7]),
        completed=f[8] == "1",
    )


class RedisPeerStore(PeerStore):
    """Peers, node reports and membership in Redis, shared by every coordinator that
    points at it. Rankings and the encoded member list are cached per process for
    ``RANK_PERIOD`` / ``MEMBERS_FULL_PERIOD`` seconds, as in memory."""

    def __init__(
        self,
        client: redis.Redis,
        peer_ttl: float = PEER_TTL,
        report_ttl: float = REPORT_TTL,
        *,
        name: str = "",
        max_peers: int = MAX_PEERS,
        max_nodes: int = MAX_NODES,
        node_budget: int = NODE_BUDGET,
        generation: str | None = None,
    ) -> None:
        super().__init__(peer_ttl, report_ttl)
        self.redis = client
        self.name = name or f"{time.time_ns():x}"
        self.max_peers = max_peers
        self.max_nodes = max_nodes
        self.node_budget = node_budget
        self._announce = client.register_script(ANNOUNCE)
        self._trim = client.register_script(TRIM)
        self._report = client.register_script(REPORT)
        self._expire_nodes = client.register_script(EXPIRE_NODES)
        self._members = client.register_script(MEMBERS)
        client.set(PREFIX + "generation", generation or f"{time.time_ns():x}", nx=True)
        self.generation = (client.get(PREFIX + "generation") or b"0").decode()
        self._rankings: dict[bytes, _Ranking] = {}
        self._full: tuple[int, str, float, int] | None = None
        self._count: tuple[float, int] | None = None
        self._coordinators: tuple[float, int] | None = None
        self._dropped_peers = 0
        self._departed: list[str] = []
        self._spare: dict[str, float] = {}
        """Upload headroom by address, written to Redis with the next sweep: rankings are
        rebuilt once a second anyway, and a report spares a round trip."""
        self._seq: tuple[float, int] | None = None
        """(when, the membership epoch's counter) as last read: a node whose epoch is
        current costs no round trip (at worst it hears of a change one report later)."""

    @staticmethod
    def _k(*parts: str) -> str:
        return PREFIX + ":".join(parts)

    def _swarm_keys(self, info_hash: bytes) -> list[str]:
        h = info_hash.hex()
        return [
            self._k("peers", h),
            self._k("seen", h),
            self._k("count", h),
            self._k("npeers"),
            self._k("swarms"),
        ]

    # -- tracker ------------------------------------------------------------------------

    def announce(self, a: Announce, ip: str, now: float) -> list[Peer]:
        dropped, status, _, total = self._announce(
            keys=self._swarm_keys(a.info_hash),
            args=[
                a.peer_id,
                a.info_hash.hex(),
                repr(now),
                repr(now - self.peer_ttl),
                self.max_peers,
                a.event,
                ip,
                a.port,
                a.left,
                a.uploaded,
                a.downloaded,
            ],
        )
        self._dropped_peers += int(dropped)
        if status == -1:
            return []
        if status == -2:
            raise StoreFull(f"the tracker holds {self.max_peers} peers, its maximum")
        if a.numwant <= 0:
            return []
        ranking = self._rankings.get(a.info_hash)
        small = int(total) <= a.numwant + 2
        if (
            small
            or ranking is None
            or not 0 <= now - ranking.at < RANK_PERIOD
            or int(total) > 2 * len(ranking.ranked)
        ):
            live = {p.peer_id: p for p in self.peers(a.info_hash, now)}
            spare = self._spares(live.values())
            if small:
                ranked = rank_peers(live.values(), a.peer_id, a.numwant, (ip, a.port), spare)
                return [p.peer for p in ranked]
            ordered, runs = build_ranking(live.values(), spare)
            ranking = self._rankings[a.info_hash] = _Ranking(now, ordered, runs, live)
        picked = serve_ranking(ranking.ranked, ranking.runs, ranking.live, a, ip)
        return [p.peer for p in picked]

    def _spares(self, peers: Iterable[PeerRecord]) -> dict[tuple[str, int], float]:
        keys = [(p.ip, p.port) for p in peers]
        if not keys:
            return {}
        addrs = [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip, port in keys]
        values = self.redis.hmget(self._k("spare"), addrs)
        return {k: float(v) for k, v in zip(keys, values, strict=True) if v is not None}

    def counts(self, info_hash: bytes, now: float) -> tuple[int, int]:
        keys = self._swarm_keys(info_hash)
        self._dropped_peers += int(
            self._trim(keys=keys, args=[info_hash.hex(), repr(now - self.peer_ttl)])
        )
        seeders, total = self.redis.hmget(keys[2], ["seeders", "total"])
        s, t = int(seeders or 0), int(total or 0)
        return s, t - s

    def get_peer(self, info_hash: bytes, peer_id: bytes, now: float) -> PeerRecord | None:
        raw = self.redis.hget(self._k("peers", info_hash.hex()), peer_id)
        if raw is None:
            return None
        record = _record(info_hash, peer_id, raw)
        return record if now - record.last_seen <= self.peer_ttl else None

    def peers(self, info_hash: bytes, now: float) -> list[PeerRecord]:
        raw = self.redis.hgetall(self._k("peers", info_hash.hex()))
        records = (_record(info_hash, pid, value) for pid, value in raw.items())
        return [r for r in records if now - r.last_seen <= self.peer_ttl]

    def info_hashes(self, now: float) -> list[bytes]:
        hashes = sorted(bytes.fromhex(h.decode()) for h in self.redis.smembers(self._k("swarms")))
        return [h for h in hashes if self.peers(h, now)]

    def set_spare(self, addr: str, spare: float) -> None:
        self._spare[addr] = spare

    # -- nodes --------------------------------------------------------------------------

    def report(self, report: NodeReport, now: float, ttl: float | None = None) -> list[Completion]:
        """As :meth:`PeerStore.report`, in one script: the node's state, its membership
        and its first completions (per-node marks in Redis, so a node that fails over to
        another coordinator is not recorded twice)."""
        report = slim(report)
        expires = now + (self.report_ttl if ttl is None else ttl)
        weight = report_weight(report)
        items: list[object] = []
        for item in report.artifacts:
            elapsed = "" if item.elapsed is None else repr(item.elapsed)
            items += [item.info_hash, int(item.complete), elapsed]
        reply = self._report(
            keys=self._node_keys(report.node),
            args=[
                report.node,
                json.dumps(_report_to_json(report, now, expires, weight)),
                repr(expires),
                weight,
                host_of(report.addr),
                self.max_nodes,
                self.node_budget,
                report.addr,
                repr(now),
                *items,
            ],
        )
        if reply[0] == -1:
            raise StoreFull(f"the coordinators track {self.max_nodes} nodes, their maximum")
        if reply[0] == -2:
            raise StoreFull(f"node state is at its budget ({self.node_budget} bytes)")
        by_hash = {item.info_hash: item for item in report.artifacts}
        completions = []
        for raw_hash, raw_seconds in zip(reply[2::2], reply[3::2], strict=True):
            item = by_hash[raw_hash.decode()]
            completions.append(
                Completion(
                    info_hash=item.info_hash,
                    name=item.name,
                    node=report.node,
                    completed_at=now,
                    seconds=float(raw_seconds) if raw_seconds else None,
                    bytes_by_source=dict(item.bytes_by_source),
                )
            )
        return completions

    def _node_keys(self, node: str) -> list[str]:
        return [
            self._k("node", node),
            self._k("nodes"),
            self._k("nodeinfo"),
            self._k("ips"),
            self._k("mlog"),
            self._k("mseq"),
            self._k("weight"),
            self._k("spare"),
            self._k("nodefirst"),
            self._k("nodemeta", node),
        ]

    def get_node(self, node: str, now: float) -> NodeState | None:
        raw, first = (
            self.redis.get(self._k("node", node)),
            self.redis.hget(self._k("nodefirst"), node),
        )
        if raw is None:
            return None
        state = _node_from_json(json.loads(raw), first)
        return state if now <= state.expires_at else None

    def put_node(self, state: NodeState) -> None:
        """Only through :meth:`report` (one script keeps the marks with the state)."""
        raise NotImplementedError("RedisPeerStore keeps node state through report()")

    def nodes(self, now: float) -> list[NodeState]:
        ids = [i.decode() for i in self.redis.zrangebyscore(self._k("nodes"), now, "+inf")]
        if not ids:
            return []
        raws = self.redis.mget([self._k("node", i) for i in ids])
        firsts = self.redis.hmget(self._k("nodefirst"), ids)
        states = [
            _node_from_json(json.loads(raw), first)
            for raw, first in zip(raws, firsts, strict=True)
            if raw is not None
        ]
        return [s for s in states if now <= s.expires_at]

    def node_count(self, now: float) -> int:
        if self._count is None or not 0 <= now - self._count[0] < NODE_COUNT_PERIOD:
            self._count = (now, int(self.redis.zcard(self._k("nodes"))))
        return self._count[1]

    def coordinators(self, now: float) -> int:
        if self._coordinators is None or not 0 <= now - self._coordinators[0] < 1.0:
            key = self._k("coordinators")
            count = self.redis.zcount(key, now - COORDINATOR_TTL, "+inf")
            self._coordinators = (now, max(1, int(count)))
        return self._coordinators[1]

    def heartbeat(self, now: float) -> None:
        """Count this coordinator as sharing the fleet (called by the sweep, every second)."""
        key = self._k("coordinators")
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(key, {self.name: now})
        pipe.zremrangebyscore(key, "-inf", now - 10 * COORDINATOR_TTL)
        pipe.execute()

    def expire(self, now: float) -> tuple[int, int]:
        self.heartbeat(now)
        spare, self._spare = self._spare, {}
        if spare:
            self.redis.hset(self._k("spare"), mapping={k: repr(v) for k, v in spare.items()})
        dropped = self._dropped_peers
        self._dropped_peers = 0
        for raw in self.redis.smembers(self._k("swarms")):
            info_hash = bytes.fromhex(raw.decode())
            keys = self._swarm_keys(info_hash)
            dropped += int(self._trim(keys=keys, args=[raw.decode(), repr(now - self.peer_ttl)]))
        gone = self._expire_nodes(
            keys=[
                self._k("nodes"),
                self._k("nodeinfo"),
                self._k("ips"),
                self._k("mlog"),
                self._k("mseq"),
                self._k("weight"),
                self._k("spare"),
                self._k("nodefirst"),
            ],
            args=[repr(now), self._k("node", ""), self._k("nodemeta", "")],
        )
        ids = [g.decode() for g in gone]
        self._departed.extend(ids)
        return dropped, len(ids)

    def departed(self) -> list[str]:
        gone, self._departed = self._departed, []
        return gone

    # -- membership ---------------------------------------------------------------------

    def members(self, epoch: str | None, now: float, legacy: bool = False) -> Members:
        seq = -1
        if not legacy and epoch is not None:
            generation, _, seq_text = epoch.rpartition(".")
            if generation == self.generation and seq_text.isdigit() and len(seq_text) < 19:
                seq = int(seq_text)
        known = self._seq
        fresh_seq = known is not None and 0 <= now - known[0] < SEQ_PERIOD
        if seq >= 0 and fresh_seq and known is not None and seq == known[1]:
            return Members(epoch)  # type: ignore[arg-type]
        full = self._full
        fresh = full is not None and 0 <= now - full[2] < full_list_period(full[3])
        if seq < 0 and fresh and full is not None:
            return Members(f"{self.generation}.{full[0]}", members=full[1])
        reply = self._members(
            keys=[self._k("mseq"), self._k("mlog"), self._k("ips")],
            args=[seq, 1 if seq < 0 else 0],
        )
        current, kind, items = int(reply[0]), int(reply[1]), reply[2:]
        self._seq = (now, current)
        epoch_now = f"{self.generation}.{current}"
        if kind == 0:
            return Members(epoch_now)
        if kind == 1:
            return Members(epoch_now, delta="[" + b",".join(items).decode() + "]")
        text = json.dumps(sorted(i.decode() for i in items))
        self._full = (current, text, now, len(items))
        return Members(epoch_now, members=text)


def _report_to_json(
    report: NodeReport, now: float, expires: float, weight: int
) -> dict[str, object]:
    return {
        "node": report.node,
        "addr": report.addr,
        "artifacts": [
            {
                "info_hash": i.info_hash,
                "name": i.name,
                "size": i.size,
                "have_bytes": i.have_bytes,
                "complete": i.complete,
                "bytes_by_source": dict(i.bytes_by_source),
                "down_rate": i.down_rate,
                "up_rate": i.up_rate,
                "elapsed": i.elapsed,
                "piece_size": i.piece_size,
                "piece_count": i.piece_count,
            }
            for i in report.artifacts
        ],
        "last_seen": now,
        "expires_at": expires,
        "weight": weight,
    }


def _node_from_json(data: dict, first: bytes | None) -> NodeState:  # type: ignore[type-arg]
    report = NodeReport(
        node=data["node"],
        addr=data["addr"],
        artifacts=tuple(ArtifactReport(**item) for item in data["artifacts"]),
    )
    return NodeState(
        report=report,
        first_seen=float(first) if first is not None else data["last_seen"],
        last_seen=data["last_seen"],
        expires_at=data["expires_at"],
        weight=data["weight"],
    )
