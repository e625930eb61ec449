"""The Lua scripts that make the batch state changes atomic in Redis.

Each check-then-write that two gateway processes could race on runs as one script: a quota
reservation, a tenant's batch limit, recording a line's result (exactly once, and the batch's
move to ``finalizing`` with its finalize entry when that was the last line), status moves, and
moving chunks parked over quota back to the queue.
"""

from __future__ import annotations

RESERVE_BYTES = """
-- KEYS: tenant files zset, tenant sizes hash
-- ARGV: file id, bytes, expires_at, now, limit (0 = no limit)
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[4])
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
end
local used = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do used = used + tonumber(v) end
local limit = tonumber(ARGV[5])
if limit > 0 and used + tonumber(ARGV[2]) > limit then return -used - 1 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return used + tonumber(ARGV[2])
"""

ADMIT_BATCH = """
-- KEYS: tenant active set, global active set.  ARGV: batch id, limit
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[1])
return 1
"""

RECORD = """
-- KEYS: batch hash, results hash, queue stream
-- ARGV: line index, marked line, counter (completed|failed), now, batch id, ttl ms
-- Returns 1 when recorded, 0 when the line already had a result, -1 when the batch no longer
-- takes results.
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'in_progress' and status ~= 'cancelling' then return -1 end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('HINCRBY', KEYS[1], ARGV[3], 1)
local done = tonumber(redis.call('HGET', KEYS[1], 'completed') or '0')
  + tonumber(redis.call('HGET', KEYS[1], 'failed') or '0')
if status == 'in_progress' and done >= tonumber(redis.call('HGET', KEYS[1], 'total')) then
  redis.call('HSET', KEYS[1], 'status', 'finalizing', 'finalizing_at', ARGV[4])
  redis.call('XADD', KEYS[3], '*', 'kind', 'finalize', 'batch', ARGV[5])
end
return 1
"""

TRANSITION = """
-- KEYS: batch hash.  ARGV: allowed current statuses (comma-separated), then field/value
-- pairs to set.  Returns the status before, or false when the batch is not in an allowed one.
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
local allowed = false
for s in string.gmatch(ARGV[1], '[^,]+') do
  if s == status then allowed = true end
end
if not allowed then return false end
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
return status
"""

PROMOTE = """
-- KEYS: delayed zset, queue stream.  ARGV: now, most to move
-- Chunks parked over quota whose time has come go back to the queue: each removed and added
-- in one step, so a chunk comes back once however many workers run this.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, chunk in ipairs(due) do
  redis.call('ZREM', KEYS[1], chunk)
  local batch, start, count = string.match(chunk, '^(.+):(%d+):(%d+)$')
  if batch then
    redis.call('XADD', KEYS[2], '*', 'kind', 'lines', 'batch', batch, 'start', start,
               'count', count)
  end
end
return #due
"""
