#!lua
-- take.lua grants the largest k <= n units that every limit of one
-- identifier's policy allows, and charges k to every limit, in one atomic
-- step. take below is driver.Take (throttler/driver/algorithm.go) line for
-- line: k = min(n, headroom), which each algorithm allows exactly, then
-- decide (common.lua) with cost k. The shebang works as in decide.lua.
--
-- KEYS, ARGV  see common.lua; ARGV[3] is n
-- reply       {k, then each limit's state as append_states (in common.lua)
--             lays it out}: the units granted and the states after the
--             take (as read when k is 0)

-- Evaluate(l, s, now, 0, true).Remaining
local function remaining(l, s, now_ms, now_us)
  if l.Algorithm == GCRA then
    local t, b = l.Emission, l.Capacity
    local tat = math.max(s.End, now_us)
    -- Go truncates a negative quotient towards zero; the clamp makes
    -- floor_div agree.
    return math.min(math.max(floor_div(now_us - (tat - b * t), t), 0), b)
  end
  if l.Algorithm == SLIDING_WINDOW then
    local cur, prev, _, span = sliding_counts(l, s, now_ms)
    return sliding_remaining(l, cur, prev, span)
  end
  local used = 0
  if s.End > now_ms then
    used = math.min(math.max(s.Used, 0), l.Max)
  end
  return l.Max - used
end

-- Headroom
local function headroom(limits, now_ms, now_us, states)
  local room = limits[1].Capacity
  for i = 2, #limits do
    room = math.min(room, limits[i].Capacity)
  end
  for i = 1, #limits do
    room = math.min(room, remaining(limits[i], states[i], now_ms, now_us))
  end
  return math.max(room, 0)
end

-- Take
local function take(limits, now_ms, now_us, n, states)
  if n <= 0 or #states ~= #limits then
    return 0
  end
  local k = math.min(n, headroom(limits, now_ms, now_us, states))
  if k <= 0 then
    return 0
  end
  local allowed = decide(limits, now_ms, now_us, k, states)
  if not allowed then
    return 0
  end
  return k
end

local req, err = read_request()
if req == nil then
  return redis.error_reply(err)
end
local k = take(req.limits, req.now_ms, req.now_us, req.cost, req.states)
if k > 0 then
  write_states(req, req.states, nil)
end
return reply(k, req.limits, req.states)
