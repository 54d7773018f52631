"""The coordinator's soft state in Redis, so that several coordinators serve one fleet
(``swarm coordinator --store redis://HOST:PORT/DB``, issue 12).

Two stores with the same contracts as the in-memory ones: :class:`RedisPeerStore`
(tracker peers, node reports, membership; :class:`swarm.coordinator.fleet.PeerStore`) and
:class:`RedisPlanState` (availability counts, stripes, rates, modes;
:class:`swarm.coordinator.origin.PlanState`). Every change that several coordinators could
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
    MEMBERS_DELTA_MIN,
    MEMBERS_FULL_PERIOD,
    MEMBERS_LOG,
    NODE_BUDGET,
    PEER_TTL,
    RANK_PERIOD,
    REPORT_TTL,
    ArtifactReport,
    Completion,
    Members,
    NodeReport,
    NodeState,
    PeerRecord,
    PeerStore,
    StoreFull,
    build_ranking,
    host_of,
    rank_peers,
    report_weight,
    serve_ranking,
    slim,
)
from swarm.coordinator.origin import (
    _COUNT_BYTES,
    ESTIMATE_SAMPLE,
    MAX_ARTIFACTS,
    STATE_BUDGET,
    ArtifactView,
    Commit,
    Committed,
    GeometryError,
    PlanState,
    set_bits,
)
from swarm.coordinator.rates import NodeRates, spare_upload
from swarm.coordinator.tracker import Announce, Peer
from swarm.errors import UsageError
from swarm.policy import MixState, Mode

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

SWEEP_BATCH: Final = 1000
"""Entries one sweep script drops (Redis runs one script at a time: keep each short)."""


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


# -- Lua --------------------------------------------------------------------------------------

_SPLIT = """
local function split(s)
  local t = {}
  for part in string.gmatch(s, '[^|]+') do t[#t + 1] = part end
  return t
end
"""

_TRIM = """
local function trim(peers, seen, count, npeers, cutoff)
  local dropped = 0
  local stale = redis.call('ZRANGEBYSCORE', seen, '-inf', '(' .. cutoff, 'LIMIT', 0, SWEEP_BATCH)
  for _, pid in ipairs(stale) do
    local rec = redis.call('HGET', peers, pid)
    if rec then
      redis.call('HDEL', peers, pid)
      redis.call('HINCRBY', count, 'total', -1)
      if string.sub(rec, 1, 1) == '1' then redis.call('HINCRBY', count, 'seeders', -1) end
      redis.call('DECR', npeers)
      dropped = dropped + 1
    end
    redis.call('ZREM', seen, pid)
  end
  return dropped
end
""".replace("SWEEP_BATCH", str(SWEEP_BATCH))

# KEYS: peers seen count npeers swarms
# ARGV: peer_id ih now cutoff max_peers event ip port left uploaded downloaded
# -> {dropped, status (1 ok, -1 stopped, -2 full), seeders, total}
ANNOUNCE = (
    _SPLIT
    + _TRIM
    + """
local dropped = trim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[4])
local pid = ARGV[1]
local prev = redis.call('HGET', KEYS[1], pid)
local function counts()
  local c = redis.call('HMGET', KEYS[3], 'seeders', 'total')
  local total = tonumber(c[2]) or 0
  if total <= 0 then
    redis.call('DEL', KEYS[3]); redis.call('DEL', KEYS[1]); redis.call('DEL', KEYS[2])
    redis.call('SREM', KEYS[5], ARGV[2])
  end
  return {tonumber(c[1]) or 0, total}
end
if ARGV[6] == 'stopped' then
  if prev then
    redis.call('HDEL', KEYS[1], pid); redis.call('ZREM', KEYS[2], pid)
    redis.call('HINCRBY', KEYS[3], 'total', -1)
    if string.sub(prev, 1, 1) == '1' then redis.call('HINCRBY', KEYS[3], 'seeders', -1) end
    redis.call('DECR', KEYS[4])
  end
  local c = counts()
  return {dropped, -1, c[1], c[2]}
end
local first_seen = ARGV[3]
local completed = '0'
if ARGV[6] == 'completed' then completed = '1' end
if prev then
  local f = split(prev)
  first_seen = f[7]
  if f[9] == '1' then completed = '1' end
  if f[1] == '1' then redis.call('HINCRBY', KEYS[3], 'seeders', -1) end
else
  if tonumber(redis.call('GET', KEYS[4]) or '0') >= tonumber(ARGV[5]) then
    local c = counts()
    return {dropped, -2, c[1], c[2]}
  end
  redis.call('INCR', KEYS[4])
  redis.call('HINCRBY', KEYS[3], 'total', 1)
end
local seeder = '0'
if ARGV[9] == '0' then seeder = '1'; redis.call('HINCRBY', KEYS[3], 'seeders', 1) end
redis.call('HSET', KEYS[1], pid, table.concat({seeder, ARGV[7], ARGV[8], ARGV[9], ARGV[10],
  ARGV[11], first_seen, ARGV[3], completed}, '|'))
redis.call('ZADD', KEYS[2], ARGV[3], pid)
redis.call('SADD', KEYS[5], ARGV[2])
local c = counts()
return {dropped, 1, c[1], c[2]}
"""
)

# KEYS: peers seen count npeers swarms   ARGV: ih cutoff -> dropped
TRIM = (
    _TRIM
    + """
local dropped = trim(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[2])
if (tonumber(redis.call('HGET', KEYS[3], 'total') or '0')) <= 0 then
  redis.call('DEL', KEYS[3]); redis.call('SREM', KEYS[5], ARGV[1])
end
return dropped
"""
)

_MEMBERS_LOG = """
local function log_op(mlog, mseq, op)
  redis.call('INCR', mseq)
  redis.call('RPUSH', mlog, '"' .. op .. '"')
  if redis.call('LLEN', mlog) > LOG_MAX then redis.call('LTRIM', mlog, -LOG_KEEP, -1) end
end
local function ref(ips, mlog, mseq, ip, delta)
  local c = redis.call('HINCRBY', ips, ip, delta)
  if delta > 0 and c == delta then log_op(mlog, mseq, '+' .. ip)
  elseif c <= 0 then redis.call('HDEL', ips, ip); log_op(mlog, mseq, '-' .. ip) end
end
""".replace("LOG_MAX", str(2 * MEMBERS_LOG)).replace("LOG_KEEP", str(MEMBERS_LOG))

# A node's report in one round trip: its state, the fleet's membership, and which of its
# artifacts it completed for the first time (history), from per-node marks.
# KEYS: node nodes nodeinfo ips mlog mseq weight spare nodefirst nodemeta
# ARGV: id json expires weight ip max_nodes budget addr now, then per artifact:
#       info_hash complete(0/1) elapsed('' if unknown)
# -> {-1} too many nodes, {-2} over budget, or {1, first_seen, (info_hash, seconds)...}
REPORT = (
    _SPLIT
    + _MEMBERS_LOG
    + """
local info = redis.call('HGET', KEYS[3], ARGV[1])
local old_w, old_ip, old_addr = 0, nil, nil
if info then
  local f = split(info)
  old_w, old_ip, old_addr = tonumber(f[1]), f[2], f[3]
elseif redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[6]) then
  return {-1}
end
local grows = tonumber(ARGV[4]) - old_w
if grows > 0 and tonumber(redis.call('GET', KEYS[7]) or '0') + grows > tonumber(ARGV[7]) then
  return {-2}
end
redis.call('INCRBY', KEYS[7], grows)
if not info then
  ref(KEYS[4], KEYS[5], KEYS[6], ARGV[5], 1)
elseif old_addr ~= ARGV[8] then
  redis.call('HDEL', KEYS[8], old_addr)
  if old_ip ~= ARGV[5] then
    ref(KEYS[4], KEYS[5], KEYS[6], ARGV[5], 1)
    ref(KEYS[4], KEYS[5], KEYS[6], old_ip, -1)
  end
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4] .. '|' .. ARGV[5] .. '|' .. ARGV[8])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSETNX', KEYS[9], ARGV[1], ARGV[9])
local out = {1, redis.call('HGET', KEYS[9], ARGV[1])}
local now = tonumber(ARGV[9])
for i = 10, #ARGV, 3 do
  local ih, complete, elapsed = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if complete == '0' then
    redis.call('HSETNX', KEYS[10], 's' .. ih, ARGV[9])
    redis.call('HDEL', KEYS[10], 'c' .. ih)  -- re-fetching after a wipe
  elseif redis.call('HSETNX', KEYS[10], 'c' .. ih, '1') == 1 then
    local seconds = elapsed
    if seconds == '' then
      local started = redis.call('HGET', KEYS[10], 's' .. ih)
      if started then seconds = tostring(now - tonumber(started)) end
    end
    out[#out + 1] = ih
    out[#out + 1] = seconds
  end
end
return out
"""
)

# KEYS: nodes nodeinfo ips mlog mseq weight spare nodefirst
# ARGV: now node_key_prefix nodemeta_key_prefix -> ids
EXPIRE_NODES = (
    _SPLIT
    + _MEMBERS_LOG
    + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1], 'LIMIT', 0, SWEEP_BATCH)
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local info = redis.call('HGET', KEYS[2], id)
  if info then
    local f = split(info)
    redis.call('INCRBY', KEYS[6], -tonumber(f[1]))
    ref(KEYS[3], KEYS[4], KEYS[5], f[2], -1)
    redis.call('HDEL', KEYS[7], f[3])
    redis.call('HDEL', KEYS[2], id)
  end
  redis.call('DEL', ARGV[2] .. id)
  redis.call('DEL', ARGV[3] .. id)
  redis.call('HDEL', KEYS[8], id)
end
return ids
""".replace("SWEEP_BATCH", str(SWEEP_BATCH))
)

# KEYS: mseq mlog ips   ARGV: seq of the node's epoch (-1: none), full (1: the whole list)
# -> {seq, kind (0 current, 1 delta, 2 full), items...}
MEMBERS = """
local seq = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if ARGV[2] ~= '1' and want >= 0 then
  if want == seq then return {seq, 0} end
  local len = redis.call('LLEN', KEYS[2])
  local first = seq - len + 1
  local behind = seq - want
  local members = redis.call('HLEN', KEYS[3])
  if want + 1 >= first and behind > 0 and behind <= math.max(DELTA_MIN, members) then
    local ops = redis.call('LRANGE', KEYS[2], want + 1 - first, -1)
    table.insert(ops, 1, 1)
    table.insert(ops, 1, seq)
    return ops
  end
end
local ips = redis.call('HKEYS', KEYS[3])
table.insert(ips, 1, 2)
table.insert(ips, 1, seq)
return ips
""".replace("DELTA_MIN", str(MEMBERS_DELTA_MIN))


# -- planning scripts -------------------------------------------------------------------------

_PLAN_HELPERS = """
local function release(owner_key, assigned, owners, progress, sprefix, n)
  local key = sprefix .. n
  for _, p in ipairs(redis.call('SMEMBERS', key)) do
    redis.call('HDEL', owner_key, p)
    redis.call('SETBIT', assigned, p, 0)
  end
  redis.call('DEL', key)
  redis.call('SREM', owners, n)
  redis.call('HDEL', progress, n)
end
local function count_bits(avail, union, added, removed)
  for p in string.gmatch(added, '%d+') do
    local c = redis.call('BITFIELD', avail, 'INCRBY', 'u32', '#' .. p, 1)[1]
    if c == 1 then redis.call('SETBIT', union, p, 1) end
  end
  for p in string.gmatch(removed, '%d+') do
    local c = redis.call('BITFIELD', avail, 'INCRBY', 'u32', '#' .. p, -1)[1]
    if c == 0 then redis.call('SETBIT', union, p, 0) end
  end
end
"""

# What planning one report reads, in one command (a pipeline of nine cost four times the
# client CPU of one script on the benchmark machine).
# KEYS: art union held rec s3 arts(node) artifacts planbytes   ARGV: node info_hash sample
# -> {piece_size, count, estimate, estimated_at, union, held, rec, own s3 rate, holding,
#     artifacts, planbytes, (node, s3 rate)...}  (false where absent)
LOAD = """
local art = redis.call('HMGET', KEYS[1], 'piece_size', 'count', 'estimate', 'estimated_at')
local out = {art[1] or false, art[2] or false, art[3] or false, art[4] or false,
  redis.call('GET', KEYS[2]) or false, redis.call('GET', KEYS[3]) or false,
  redis.call('HGET', KEYS[4], ARGV[1]) or false, redis.call('HGET', KEYS[5], ARGV[1]) or false,
  redis.call('SISMEMBER', KEYS[6], ARGV[2]), redis.call('SCARD', KEYS[7]),
  redis.call('GET', KEYS[8]) or '0'}
for _, v in ipairs(redis.call('HRANDFIELD', KEYS[5], tonumber(ARGV[3]), 'WITHVALUES')) do
  out[#out + 1] = v
end
return out
"""

# KEYS: 1 art 2 avail 3 union 4 assigned 5 owner 6 owners 7 progress 8 stripelen 9 wide
#       10 s3 11 rec 12 held 13 stripe(node) 14 arts(node) 15 planbytes 16 tmp
# ARGV: 1 node 2 ih 3 now 4 stall 5 max_readers 6 complete 7 wide 8 want 9 held bytes
#       10 rec json 11 estimate ('' = none) 12 s3 rate 13 count 14 entry cost
#       15 added pieces 16 removed pieces 17 stripe key prefix 18 kept pieces
# -> {spread, stripe pieces...}
COMMIT = (
    _PLAN_HELPERS
    + """
local node = ARGV[1]
local now = tonumber(ARGV[3])
local count = tonumber(ARGV[13])
local sprefix = ARGV[17]
local added, removed = ARGV[15], ARGV[16]
if redis.call('SADD', KEYS[14], ARGV[2]) == 1 then
  -- a new entry (or one a sweep just dropped): nothing of the old bitfield is counted
  redis.call('INCRBY', KEYS[15], tonumber(ARGV[14]))
  redis.call('HINCRBY', KEYS[1], 'holders', 1)
  added, removed = added .. ',' .. ARGV[18], ''
end
redis.call('SET', KEYS[12], ARGV[9])
count_bits(KEYS[2], KEYS[3], added, '')
for p in string.gmatch(added, '%d+') do
  if redis.call('GETBIT', KEYS[4], p) == 1 then
    local o = redis.call('HGET', KEYS[5], p)
    redis.call('HDEL', KEYS[5], p)
    redis.call('SETBIT', KEYS[4], p, 0)
    if o then
      redis.call('SREM', sprefix .. o, p)
      if redis.call('SCARD', sprefix .. o) == 0 then redis.call('SREM', KEYS[6], o) end
    end
  end
end
count_bits(KEYS[2], KEYS[3], '', removed)
if redis.call('SCARD', KEYS[13]) < tonumber(redis.call('HGET', KEYS[8], node) or '0') then
  redis.call('HSET', KEYS[7], node, ARGV[3])
end
for _, n in ipairs(redis.call('SMEMBERS', KEYS[6])) do
  local at = tonumber(redis.call('HGET', KEYS[7], n) or ARGV[3])
  if now - at > tonumber(ARGV[4]) then
    release(KEYS[5], KEYS[4], KEYS[6], KEYS[7], sprefix, n)
    if redis.call('SISMEMBER', KEYS[9], n) == 0 then redis.call('HDEL', KEYS[10], n) end
  end
end
redis.call('HSET', KEYS[11], node, ARGV[10])
if ARGV[11] ~= '' then
  redis.call('HSET', KEYS[1], 'estimate', ARGV[11], 'estimated_at', ARGV[3])
end
local function spread()
  redis.call('BITOP', 'OR', KEYS[16], KEYS[3], KEYS[4])
  local n = redis.call('BITCOUNT', KEYS[16])
  redis.call('DEL', KEYS[16])
  if n >= count then return 1 end
  return 0
end
if ARGV[6] == '1' then
  release(KEYS[5], KEYS[4], KEYS[6], KEYS[7], sprefix, node)
  redis.call('SREM', KEYS[9], node)
  redis.call('HDEL', KEYS[10], node)
  redis.call('HDEL', KEYS[8], node)
  return {spread()}
end
if ARGV[7] == '1' then redis.call('SADD', KEYS[9], node) else redis.call('SREM', KEYS[9], node) end
local mine = redis.call('SCARD', KEYS[13])
local wide = redis.call('SISMEMBER', KEYS[9], node) == 1
local readers = redis.call('SCARD', KEYS[9]) + redis.call('SCARD', KEYS[6])
  - redis.call('SINTERCARD', 2, KEYS[9], KEYS[6])
if mine > 0 or wide or readers < tonumber(ARGV[5]) then
  local want = tonumber(ARGV[8]) - mine
  if want > 0 then
    redis.call('BITOP', 'OR', KEYS[16], KEYS[3], KEYS[4])
    local claimed, start = 0, 0
    while claimed < want do
      local p = redis.call('BITPOS', KEYS[16], 0, math.floor(start / 8))
      if p < 0 or p >= count then break end
      redis.call('SETBIT', KEYS[16], p, 1)
      redis.call('SETBIT', KEYS[4], p, 1)
      redis.call('HSET', KEYS[5], p, node)
      redis.call('SADD', KEYS[13], p)
      claimed = claimed + 1
      start = p
    end
    redis.call('DEL', KEYS[16])
    if claimed > 0 then
      if mine == 0 or redis.call('HEXISTS', KEYS[7], node) == 0 then
        redis.call('HSET', KEYS[7], node, ARGV[3])
      end
      redis.call('SADD', KEYS[6], node)
    end
  end
end
mine = redis.call('SCARD', KEYS[13])
redis.call('HSET', KEYS[8], node, mine)
if mine > 0 or wide then redis.call('HSET', KEYS[10], node, ARGV[12])
else redis.call('HDEL', KEYS[10], node) end
local stripe = redis.call('SMEMBERS', KEYS[13])
table.insert(stripe, 1, spread())
return stripe
"""
)

# KEYS: 1 art 2 avail 3 union 4 assigned 5 owner 6 owners 7 progress 8 stripelen 9 wide
#       10 s3 11 rec 12 held 13 arts(node) 14 planbytes 15 artifacts
# ARGV: 1 node 2 ih 3 held pieces 4 entry cost 5 stripe key prefix 6 artifact cost
#       7 artifact key prefixes (space-separated, for deleting an artifact nobody holds)
FORGET = (
    _PLAN_HELPERS
    + """
local node = ARGV[1]
if redis.call('SREM', KEYS[13], ARGV[2]) == 0 then return 0 end
count_bits(KEYS[2], KEYS[3], '', ARGV[3])
release(KEYS[5], KEYS[4], KEYS[6], KEYS[7], ARGV[5], node)
redis.call('HDEL', KEYS[8], node)
redis.call('HDEL', KEYS[10], node)
redis.call('HDEL', KEYS[11], node)
redis.call('SREM', KEYS[9], node)
redis.call('DEL', KEYS[12])
redis.call('INCRBY', KEYS[14], -tonumber(ARGV[4]))
if redis.call('HINCRBY', KEYS[1], 'holders', -1) <= 0 then
  for key in string.gmatch(ARGV[7], '%S+') do redis.call('DEL', key) end
  redis.call('SREM', KEYS[15], ARGV[2])
  redis.call('INCRBY', KEYS[14], -tonumber(ARGV[6]))
end
return 1
"""
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
        self._full: tuple[int, str, float] | None = None
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
        fresh = full is not None and 0 <= now - full[2] < MEMBERS_FULL_PERIOD
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
        self._full = (current, text, now)
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


# -- the plan state ---------------------------------------------------------------------------


def _to_bitfield(value: int, count: int) -> bytes:
    """bit i = piece i -> BitTorrent order (piece 0 = high bit of byte 0), as Redis'
    SETBIT/BITPOS number bits."""
    if not count:
        return b""
    text = format(value, f"0{count}b")[::-1]
    pad = -count % 8
    return int(text + "0" * pad, 2).to_bytes((count + 7) // 8, "big")


def _from_bitfield(blob: bytes | None, count: int) -> int:
    if not blob or not count:
        return 0
    blob = blob[: (count + 7) // 8].ljust((count + 7) // 8, b"\0")
    text = format(int.from_bytes(blob, "big"), f"0{len(blob) * 8}b")[:count]
    return int(text[::-1], 2)


def _mix_to_json(state: MixState | None) -> dict[str, object] | None:
    return None if state is None else {"mode": state.mode.value, "since": state.pending_since}


def _mix_from_json(data: dict[str, object] | None) -> MixState | None:
    if not data:
        return None
    return MixState(Mode(data["mode"]), data.get("since"))  # type: ignore[arg-type]


class RedisPlanState(PlanState):
    """The planner's state in Redis: :meth:`load` is one pipelined round trip, and
    :meth:`commit` one Lua script (the same algorithm as
    :class:`swarm.coordinator.origin.MemoryPlanState`)."""

    def __init__(
        self, client: redis.Redis, max_artifacts: int = MAX_ARTIFACTS, budget: int = STATE_BUDGET
    ) -> None:
        self.redis = client
        self.max_artifacts = max_artifacts
        self.budget = budget
        self._load = client.register_script(LOAD)
        self._commit = client.register_script(COMMIT)
        self._forget = client.register_script(FORGET)
        self._geometries: dict[str, tuple[int, int]] = {}
        self._loaded: dict[tuple[str, str], tuple[int, int]] = {}
        """(node, info_hash) -> (its bitfield as of :meth:`load`, piece count), for
        :meth:`commit`'s diff."""

    @staticmethod
    def _k(*parts: str) -> str:
        return PREFIX + ":".join(parts)

    def _geometry(self, info_hash: str) -> tuple[int, int] | None:
        piece_size, count = self.redis.hmget(self._k("art", info_hash), ["piece_size", "count"])
        if piece_size is None or count is None:
            return None
        return int(piece_size), int(count)

    def check(self, info_hash: str, piece_size: int, count: int) -> None:
        # an info-hash names its geometry: a cached one is right unless the artifact was
        # forgotten and started again, which a mismatch re-reads
        known = self._geometries.get(info_hash)
        if known is None or known != (piece_size, count):
            known = self._geometry(info_hash)
            if known is not None:
                if len(self._geometries) >= MAX_ARTIFACTS:
                    self._geometries.clear()
                self._geometries[info_hash] = known
        if known is not None and known != (piece_size, count):
            raise GeometryError(
                f"artifact {info_hash} has {known[1]} pieces of {known[0]} bytes "
                f"here, not {count} of {piece_size}"
            )

    def load(self, node: str, info_hash: str, piece_size: int, count: int) -> ArtifactView | None:
        k = self._k
        reply = self._load(
            keys=[
                k("art", info_hash),
                k("union", info_hash),
                k("held", info_hash, node),
                k("rec", info_hash),
                k("s3", info_hash),
                k("arts", node),
                k("artifacts"),
                k("planbytes"),
            ],
            args=[node, info_hash, ESTIMATE_SAMPLE],
        )
        art = reply[0:4]
        union, held, rec, own_s3 = reply[4:8]
        holding, artifacts, used = int(reply[8]), int(reply[9]), int(reply[10] or 0)
        sample = reply[11:]
        if art[0] is None:
            cost = count * _COUNT_BYTES + (count + 7) // 8 + 64
            if artifacts >= self.max_artifacts or used + cost > self.budget:
                return None
            pipe = self.redis.pipeline(transaction=False)
            pipe.hsetnx(k("art", info_hash), "count", count)
            pipe.hsetnx(k("art", info_hash), "piece_size", piece_size)
            pipe.sadd(k("artifacts"), info_hash)
            created = pipe.execute()[0]
            if created:
                self.redis.incrby(k("planbytes"), count * _COUNT_BYTES)
            self.check(info_hash, piece_size, count)  # another coordinator's first report
        elif not holding and used + (count + 7) // 8 + 64 > self.budget:
            return None
        self._loaded[(node, info_hash)] = (_from_bitfield(held, count), count)
        pairs = list(zip(sample[::2], sample[1::2], strict=True)) if sample else []
        readers = tuple((n.decode(), float(v)) for n, v in pairs)
        if own_s3 is not None:
            readers = ((node, float(own_s3)), *[r for r in readers if r[0] != node])
        record = json.loads(rec) if rec else {}
        return ArtifactView(
            _from_bitfield(union, count),
            float(art[2]) if art[2] is not None else None,
            float(art[3]) if art[3] is not None else None,
            readers,
            NodeRates.from_json(record["rates"]) if record.get("rates") else None,
            _mix_from_json(record.get("mode")),
        )

    def commit(self, change: Commit) -> Committed:
        node, ih = change.node, change.info_hash
        old, count = self._loaded.pop((node, ih), (0, 0))
        new = change.held & ((1 << count) - 1)
        k = self._k
        record = {"rates": change.rates.to_json(), "mode": _mix_to_json(change.mode)}
        if change.complete:
            record["mode"] = None
        reply = self._commit(
            keys=[
                k("art", ih),
                k("avail", ih),
                k("union", ih),
                k("assigned", ih),
                k("owner", ih),
                k("owners", ih),
                k("progress", ih),
                k("stripelen", ih),
                k("wide", ih),
                k("s3", ih),
                k("rec", ih),
                k("held", ih, node),
                k("stripe", ih, node),
                k("arts", node),
                k("planbytes"),
                k("tmp", ih),
            ],
            args=[
                node,
                ih,
                repr(change.now),
                repr(change.stall_seconds),
                change.max_readers,
                int(change.complete),
                int(change.wide),
                change.want,
                _to_bitfield(new, count),
                json.dumps(record),
                "" if change.estimate is None else repr(change.estimate),
                repr(change.rates.down.get("s3", 0.0)),
                count,
                (count + 7) // 8 + 64,
                ",".join(map(str, set_bits(new & ~old))),
                ",".join(map(str, set_bits(old & ~new))),
                k("stripe", ih, ""),
                ",".join(map(str, set_bits(old & new))),
            ],
        )
        return Committed(sorted(int(p) for p in reply[1:]), bool(reply[0]))

    def forget(self, nodes: Iterable[str]) -> None:
        k = self._k
        for node in nodes:
            for raw in self.redis.smembers(k("arts", node)):
                ih = raw.decode()
                geometry = self._geometry(ih)
                count = geometry[1] if geometry else 0
                held = _from_bitfield(self.redis.get(k("held", ih, node)), count)
                per_artifact = [
                    k(name, ih)
                    for name in (
                        "art", "avail", "union", "assigned", "owner", "owners", "progress",
                        "stripelen", "wide", "s3", "rec",
                    )
                ]  # fmt: skip
                self._forget(
                    keys=[
                        *per_artifact,
                        k("held", ih, node),
                        k("arts", node),
                        k("planbytes"),
                        k("artifacts"),
                    ],
                    args=[
                        node,
                        ih,
                        ",".join(map(str, set_bits(held))),
                        (count + 7) // 8 + 64,
                        k("stripe", ih, ""),
                        count * _COUNT_BYTES,
                        " ".join(per_artifact),
                    ],
                )

    def known_nodes(self) -> set[str]:
        return set()  # departed nodes come from the peer store's sweep (forget)

    def availability(self, info_hash: str) -> list[int]:
        geometry = self._geometry(info_hash)
        if geometry is None:
            return []
        count = geometry[1]
        raw = (self.redis.get(self._k("avail", info_hash)) or b"").ljust(4 * count, b"\0")
        return [int.from_bytes(raw[4 * i : 4 * i + 4], "big") for i in range(count)]

    def _record(self, node: str, info_hash: str) -> dict:  # type: ignore[type-arg]
        raw = self.redis.hget(self._k("rec", info_hash), node)
        return json.loads(raw) if raw else {}

    def node_rates(self, node: str, info_hash: str) -> NodeRates | None:
        record = self._record(node, info_hash)
        return NodeRates.from_json(record["rates"]) if record.get("rates") else None

    def node_mode(self, node: str, info_hash: str) -> MixState | None:
        return _mix_from_json(self._record(node, info_hash).get("mode"))

    def spare_upload(self, node: str) -> float:
        arts = [a.decode() for a in self.redis.smembers(self._k("arts", node))]
        rates = (self.node_rates(node, ih) for ih in arts)
        return spare_upload(r for r in rates if r is not None)
