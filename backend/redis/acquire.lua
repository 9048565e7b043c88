#!lua
-- acquire.lua takes or renews one concurrency lease for one identifier
-- under one concurrency limit, in one atomic step. It is
-- driver.AcquireLease (throttler/driver/lease.go) line for line, on a
-- sorted set where Go has a map; TestLeaseScriptsMirrorGo runs this script
-- and the Go function on the same random sequences and compares every
-- reply. It needs none of common.lua's helpers and is sent as it is.
--
-- The shebang (no flags) makes Redis 7 refuse the script up front when the
-- server is out of memory, instead of failing between two writes.
--
-- KEYS[1]  the identifier's leases under the limit: a sorted set of lease
--          IDs scored by their expiry in Unix ms. Another type answers
--          WRONGTYPE before anything is written.
-- ARGV     now_ms, ttl_ms, max, grace_ms, lease
-- reply    {acquired, held, in_flight, next_expiry}, integers; next_expiry
--          is the earliest expiry left, 0 when no lease is held
--
-- Every number stays below 2^53 (MaxQuota, MaxWindow, MaxUnixMilli), so
-- the arithmetic is exact in Lua's doubles; numbers go back to Redis
-- formatted with %d, since tostring would print 1.9e+12.

local key = KEYS[1]
local now_ms = tonumber(ARGV[1])
local ttl_ms = tonumber(ARGV[2])
local max = tonumber(ARGV[3])
local grace_ms = tonumber(ARGV[4])
local lease = ARGV[5]

-- dropExpired: every lease with expiry <= now
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now_ms))
-- old, held := leases[lease]
local old = redis.call('ZSCORE', key, lease)
local held = old ~= false
local in_flight = redis.call('ZCARD', key)
-- if held || len(leases) < l.Max
local acquired = false
if held or in_flight < max then
  acquired = true
  -- leases[lease] = max(old, nowMs+l.TTLMillis)
  local expiry = now_ms + ttl_ms
  if held then
    expiry = math.max(expiry, tonumber(old))
  else
    in_flight = in_flight + 1
  end
  redis.call('ZADD', key, string.format('%d', expiry), lease)
  -- Garbage collection only, as for windows: the set outlives its latest
  -- lease by the grace, counted from now so no two clocks need to agree.
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, string.format('%d', tonumber(last[2]) - now_ms + grace_ms))
end
-- earliest(leases)
local next_expiry = 0
local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
if #first == 2 then
  next_expiry = tonumber(first[2])
end
return {acquired and 1 or 0, held and 1 or 0, in_flight, next_expiry}
