#!lua
-- release.lua frees one concurrency lease for one identifier under one
-- concurrency limit, in one atomic step. It is driver.ReleaseLease
-- (throttler/driver/lease.go) line for line, on a sorted set where Go has
-- a map; TestLeaseScriptsMirrorGo checks the two agree. Releasing a lease
-- that is not held changes nothing but dropping expired leases. It needs
-- none of common.lua's helpers; the shebang works as in acquire.lua.
--
-- KEYS[1]  the identifier's leases under the limit (see acquire.lua)
-- ARGV     now_ms, ttl_ms, max, grace_ms, lease (as acquire.lua; only
--          now_ms and lease are read)
-- reply    {0, held, in_flight, next_expiry}, integers
--
-- The set keeps the TTL its latest acquisition gave it: removing leases
-- can only make that TTL longer than needed, and Redis deletes a sorted
-- set when its last member goes.

local key = KEYS[1]
local now_ms = tonumber(ARGV[1])
local lease = ARGV[5]

-- dropExpired: every lease with expiry <= now
redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now_ms))
-- _, held := leases[lease]; delete(leases, lease)
local held = redis.call('ZREM', key, lease) == 1
local in_flight = redis.call('ZCARD', key)
-- earliest(leases)
local next_expiry = 0
local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
if #first == 2 then
  next_expiry = tonumber(first[2])
end
return {0, held and 1 or 0, in_flight, next_expiry}
