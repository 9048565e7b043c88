#!lua
-- refund.lua gives back up to n units of one identifier's current windows,
-- atomically for the whole policy. refund below is driver.Refund
-- (throttler/driver/algorithm.go) line for line, and the helpers it calls
-- (common.lua) mirror the Go functions they are named after. Only the
-- states the refund changed are written; the shebang works as in
-- decide.lua.
--
-- KEYS, ARGV  see common.lua; ARGV[3] is n
-- reply       {1, then each limit's state as append_states (in common.lua)
--             lays it out}: the states after the refund

-- Refund
local function refund(limits, now_ms, now_us, n, states)
  local next = {}
  for i = 1, #states do
    next[i] = {Used = states[i].Used, End = states[i].End, Prev = states[i].Prev}
  end
  if #next ~= #limits or n <= 0 then
    return next
  end
  for i = 1, #limits do
    local l = limits[i]
    local s = next[i]
    if l.Algorithm == GCRA then
      if s.End > now_us then
        local t = l.Emission
        local back = s.End - now_us -- never refund below now
        if n <= floor_div(back, t) then
          back = n * t
        end
        s.End = s.End - back
      end
    elseif l.Algorithm == SLIDING_WINDOW then -- Go: continue after each branch
      if s.End >= sliding_end(l, now_ms) then
        s.Used = math.max(s.Used - n, 0)
      end
    elseif s.End > now_ms then
      s.Used = math.max(s.Used - n, 0)
    end
  end
  return next
end

local req, err = read_request()
if req == nil then
  return redis.error_reply(err)
end
local next = refund(req.limits, req.now_ms, req.now_us, req.cost, req.states)
-- Only the states that changed are written (write_states, common.lua).
local changed, written = false, {}
for i = 1, #next do
  written[i] = next[i].Used ~= req.states[i].Used or next[i].End ~= req.states[i].End or next[i].Prev ~= req.states[i].Prev
  changed = changed or written[i]
end
if changed then
  write_states(req, next, written)
end
return reply(1, req.limits, next)
