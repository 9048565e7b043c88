#!lua flags=no-writes
-- peek_layout2.lua reads one identifier's policy as layout 2 stored it, the
-- layout of the releases before one hash per policy: a string per limit,
-- "used:end", or "used:end:prev" for a sliding window, under the keys
-- Backend.Layout2 names. It writes nothing; a layout upgrade (see
-- Backend.Layout2) reads the old state with it and seeds the new layout.
-- Its verdict and reply are peek.lua's.
--
-- KEYS   limit i's layout-2 key, one per limit in the policy's order
-- ARGV   as in common.lua (the limits' keys are not read)

local n = tonumber(ARGV[5])
local req = {
  now_ms = tonumber(ARGV[1]),
  now_us = tonumber(ARGV[2]),
  cost = tonumber(ARGV[3]),
  limits = read_limits(0, n),
  states = {},
}
for i = 1, n do
  local s, err = read_layout2(KEYS[i], req.limits[i])
  if s == nil then
    return redis.error_reply(err)
  end
  req.states[i] = s
end
local allowed = req.cost >= 0
for i = 1, n do
  if not limit_allows(req.limits[i], req.states[i], req.now_ms, req.now_us, req.cost) then
    allowed = false
    break
  end
end
return reply(allowed and 1 or 0, req.limits, req.states)
