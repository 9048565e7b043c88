#!lua flags=no-writes
-- peek.lua reads one identifier's policy without changing it, so that a
-- replica can serve it: it is run with EVALSHA_RO, and the no-writes flag
-- lets Redis 7 run it on a read-only replica. Its verdict is
-- driver.Decide (throttler/driver/algorithm.go) up to its first return, line for
-- line, for the request's cost; the helpers (common.lua) mirror the Go
-- functions they are named after.
--
-- A replica may still hold a window that has closed (the key's TTL runs a
-- grace second past the window's end, and a primary's expiry reaches its
-- replicas late). Nothing here trusts that: limit_allows counts a window
-- only while now < End, and the throttler's Evaluate applies the same rule
-- to every figure of the result. That is GitHub's fix for "rejected, but
-- Remaining: 5000". The states are returned as read, as throttler.Peeker
-- asks: rewriting a closed one as absent would change the GCRA arithmetic
-- for a clock before 1970, where an absent TAT (0) lies in the future.
--
-- KEYS, ARGV  see common.lua; ARGV[3] is the cost (0 for a plain peek)
-- reply       {allowed, then each limit's state as append_states (in
--             common.lua) lays it out}: the states as read

local req, err = read_request()
if req == nil then
  return redis.error_reply(err)
end
-- Decide, up to its first return: allowed only if every limit allows.
local allowed = #req.states == #req.limits and req.cost >= 0
for i = 1, #req.limits do
  if not limit_allows(req.limits[i], req.states[i], req.now_ms, req.now_us, req.cost) then
    allowed = false
    break
  end
end
return reply(allowed and 1 or 0, req.limits, req.states)
