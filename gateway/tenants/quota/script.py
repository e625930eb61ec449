"""The shared limiter's Lua script: gateway/tenants/quota/gcra.py's arithmetic, atomically in Redis.

One call checks every limit it is given and charges them all or none (a request refused by its
daily budget does not use its rate). Time is Redis's own (``TIME``), so gateways on hosts whose
clocks differ still agree; Redis 5+ replicates the script's writes, not the script, so reading
the time is allowed.

Keys (one tenant's share a hash tag, so a cluster keeps them in one slot; the tenant id is
never stored, only ``scope_tag``, 16 hex characters of its xxh3_64)::

    {prefix}:quota:{<tag>}/requests   string: the requests limit's TAT, Unix microseconds
    {prefix}:quota:{<tag>}/texts      string: the texts limit's TAT, Unix microseconds
    {prefix}:quota:{<tag>}/daily      hash: d = UTC day number, n = texts charged that day

(One colon fewer after the prefix than a cache key, so an admin purge never matches them.)

A TAT key expires when its limit is whole again (an absent key is a whole limit); the daily
hash a minute after its day ends. ``ARGV``: the number of limits, then per limit (in ``KEYS``
order) its kind (``r`` rate, ``d`` day), the cost, the interval in microseconds (rate) or the
budget (day), and the burst (rate; 0 for a day). The answer: ``[allowed, then per limit:
allowed, remaining, reset_ms, retry_ms]``.
"""

from __future__ import annotations

SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = tonumber(ARGV[1])
local out = {1}
local writes = {}
for i = 1, n do
  local at = 1 + (i - 1) * 4
  local kind = ARGV[at + 1]
  local cost = tonumber(ARGV[at + 2])
  local a = tonumber(ARGV[at + 3])
  local burst = tonumber(ARGV[at + 4])
  local ok, remaining, reset, retry
  if kind == 'r' then
    local tat = tonumber(redis.call('GET', KEYS[i])) or now
    if tat < now then tat = now end
    local new_tat = tat + cost * a
    local allow_at = new_tat - burst * a
    if now >= allow_at or (cost > 0 and tat <= now) then
      ok, remaining, reset, retry = 1, math.floor((now - allow_at) / a), new_tat - now, 0
      if cost > 0 then
        writes[#writes + 1] = {'SET', KEYS[i], string.format('%.17g', new_tat), 'PX',
                               math.floor((new_tat - now) / 1000) + 1000}
      end
    else
      ok, remaining = 0, math.floor((now - tat) / a + burst)
      reset, retry = tat - now, allow_at - now
    end
  else
    local day = math.floor(now / 86400000000)
    local got = redis.call('HMGET', KEYS[i], 'd', 'n')
    local used = 0
    if tonumber(got[1]) == day then used = tonumber(got[2]) or 0 end
    reset = (day + 1) * 86400000000 - now
    if cost > 0 and used + cost > a then
      ok, remaining, retry = 0, math.floor(a - used), reset
    else
      ok, remaining, retry = 1, math.floor(a - used - cost), 0
      if cost > 0 then
        writes[#writes + 1] = {'HSET', KEYS[i], 'd', string.format('%d', day), 'n',
                               string.format('%.17g', used + cost)}
        writes[#writes + 1] = {'PEXPIRE', KEYS[i], math.floor(reset / 1000) + 60000}
      end
    end
  end
  if ok == 0 then out[1] = 0 end
  if remaining < 0 then remaining = 0 end
  out[#out + 1] = ok
  out[#out + 1] = remaining
  out[#out + 1] = math.ceil(reset / 1000)
  out[#out + 1] = math.ceil(retry / 1000)
end
if out[1] == 1 then
  for _, w in ipairs(writes) do redis.call(unpack(w)) end
end
return out
"""
