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
  local stored = redis.pcall('GET', KEYS[i])
  if type(stored) == 'table' and stored.err then
    return redis.error_reply('THROTTLEKIT_FOREIGN_VALUE key ' .. KEYS[i] .. ': ' .. stored.err)
  end
  req.states[i] = {Used = 0, End = 0, Prev = 0}
  if stored ~= false then
    local used, ends, prev
    if req.limits[i].Algorithm == SLIDING_WINDOW then
      used, ends, prev = string.match(stored, '^(%-?%d+):(%-?%d+):(%-?%d+)$')
    else
      used, ends = string.match(stored, '^(%-?%d+):(%-?%d+)$')
      prev = '0'
    end
    if used ~= nil then
      used, ends, prev = read_int(used), read_int(ends), read_int(prev)
    end
    if used == nil or ends == nil or prev == nil then
      return redis.error_reply('THROTTLEKIT_FOREIGN_VALUE key ' .. KEYS[i] .. ' holds a value layout 2 did not write')
    end
    req.states[i] = {Used = used, End = ends, Prev = prev}
  end
end
local allowed = req.cost >= 0
for i = 1, n do
  if not limit_allows(req.limits[i], req.states[i], req.now_ms, req.now_us, req.cost) then
    allowed = false
    break
  end
end
return reply(allowed and 1 or 0, req.limits, req.states)
