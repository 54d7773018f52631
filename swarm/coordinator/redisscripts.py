"""The Lua scripts of the Redis stores, each with its KEYS / ARGV contract.

Every change that several coordinators could make at once to shared keys runs as one of
these scripts, so it is atomic (see :mod:`swarm.coordinator.redisstore` for the key
layout): the peer store's announce, trim, report, node expiry and membership
(:class:`swarm.coordinator.redisstore.RedisPeerStore`), and the planner's load, commit
and forget (:class:`swarm.coordinator.redisplan.RedisPlanState`).
"""

from __future__ import annotations

from typing import Final

from swarm.coordinator.fleet import MEMBERS_DELTA_MIN, MEMBERS_LOG

SWEEP_BATCH: Final = 1000
"""Entries one sweep script drops (Redis runs one script at a time: keep each short)."""

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
#       19 streaming (1: the node's S3 bytes grew since its last report)
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
local mine = redis.call('SCARD', KEYS[13])
if mine < tonumber(redis.call('HGET', KEYS[8], node) or '0') or (mine > 0 and ARGV[19] == '1') then
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
