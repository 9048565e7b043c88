-- common.lua holds what decide.lua, decide_many.lua, peek.lua, refund.lua,
-- take.lua and seed.lua share: the helpers of throttler/driver/algorithm.go and policy.go,
-- each named after the Go function it mirrors line for line, and the reading
-- and writing of states.
-- redis.go splices it into each script right after the script's first line,
-- its shebang, so every script Redis runs is whole in itself.
--
-- ARGV     now_ms, now_us, cost, grace_ms, then five per limit:
--          algorithm (0 fixed, 1 aligned, 2 gcra, 3 sliding), max, window_ms, and the
--          limit's capacity and emission interval in µs, which Go computes
--          once per policy (driver.Limit.Capacity and EmissionMicros)
-- KEYS[i]  limit i's state: a string "used:end" of two decimal integers (End
--          in Unix ms for fixed windows, the TAT in Unix µs for GCRA), or
--          "used:end:prev" for a sliding window (Prev, the count of the
--          window before the one ending at End). A
--          string, not a hash: one SET ... PX writes the value and its expiry
--          together, one GET reads it, and it is the smallest encoding. A
--          foreign value is still caught: GET answers WRONGTYPE for any other
--          type, and a string not in this exact format is refused.
--
-- Lua numbers are doubles: every integer here stays below 2^53 (MaxQuota,
-- MaxWindow and the GCRA span bound see to it), so the arithmetic is exact.
-- Numbers are formatted with %d: tostring would print 1.7e+15.

local FIXED_WINDOW, ALIGNED_WINDOW, GCRA, SLIDING_WINDOW = 0, 1, 2, 3
local MAX_EXACT = 9007199254740991 -- 2^53 - 1

-- floorDiv: Go's truncating a / b, made a floor when the signs differ.
-- math.fmod truncates like Go's %, and (a - r) / b is an exact integer.
local function floor_div(a, b)
  local r = math.fmod(a, b)
  local q = (a - r) / b
  if r ~= 0 and (a < 0) ~= (b < 0) then
    q = q - 1
  end
  return q
end

-- Limit.Capacity, from ARGV
local function capacity(l)
  return l.Capacity
end

-- Limit.EmissionMicros, from ARGV
local function emission_micros(l)
  return l.Emission
end

-- slidingEnd
local function sliding_end(l, now_ms)
  local w = l.Window
  return (floor_div(now_ms, w) + 1) * w
end

-- slidingCounts: cur, prev, end, span
local function sliding_counts(l, s, now_ms)
  local e = sliding_end(l, now_ms)
  if s.End > e then
    return math.max(s.Used, 0), math.max(s.Prev, 0), s.End, l.Window
  elseif s.End == e then
    return math.max(s.Used, 0), math.max(s.Prev, 0), e, e - now_ms
  elseif s.End == e - l.Window then
    return 0, math.max(s.Used, 0), e, e - now_ms
  end
  return 0, 0, e, e - now_ms
end

-- slidingRemaining
local function sliding_remaining(l, cur, prev, span)
  local w = l.Window
  local weighted = floor_div(prev * span + w - 1, w)
  return math.min(math.max(l.Max - cur - weighted, 0), l.Max)
end

-- limitAllows
local function limit_allows(l, s, now_ms, now_us, cost)
  if cost > capacity(l) then
    return false
  end
  if l.Algorithm == GCRA then
    local t = emission_micros(l)
    local new_tat = math.max(s.End, now_us) + cost * t
    return new_tat - capacity(l) * t <= now_us
  end
  if l.Algorithm == SLIDING_WINDOW then
    local cur, prev, _, span = sliding_counts(l, s, now_ms)
    local w = l.Window
    return (cur + cost) * w + prev * span <= l.Max * w
  end
  local used = 0
  if s.End > now_ms then
    used = math.max(s.Used, 0)
  end
  return used + cost <= l.Max
end

-- windowOpening
local function window_opening(l, now_ms)
  local w = l.Window
  if l.Algorithm == ALIGNED_WINDOW or l.Algorithm == SLIDING_WINDOW then
    return (floor_div(now_ms, w) + 1) * w
  end
  return now_ms + w
end

-- Decide. The states are updated in place: the script needs no copy of
-- what it read (Go's Decide updates them in place too).
local function decide(limits, now_ms, now_us, cost, states)
  local next = states
  if #next ~= #limits or cost < 0 then
    return false, next
  end
  for i = 1, #limits do
    if not limit_allows(limits[i], next[i], now_ms, now_us, cost) then
      return false, next
    end
  end
  if cost == 0 then
    return true, next
  end
  for i = 1, #limits do
    local l = limits[i]
    local s = next[i]
    if l.Algorithm == GCRA then
      s.Used = 0
      s.End = math.max(s.End, now_us) + cost * emission_micros(l)
    elseif l.Algorithm == SLIDING_WINDOW then -- Go: continue after each branch
      local cur, prev, e = sliding_counts(l, s, now_ms)
      s.Used, s.End, s.Prev = cur + cost, e, prev
    elseif s.End > now_ms then
      s.Used = math.max(s.Used, 0) + cost
    else
      s.Used, s.End = cost, window_opening(l, now_ms)
    end
  end
  return true, next
end

-- read_request parses ARGV and reads every limit's state, all before any
-- write, so that a foreign value stops a script before it changes anything.
-- It returns nil and an error message for a foreign value.
--
-- Called without arguments it reads the whole of KEYS and ARGV. decide_many.lua,
-- which decides several requests in one call, passes where one request's
-- part starts: its keys are KEYS[k0 + 1] to KEYS[k0 + n] and its arguments
-- ARGV[a0 + 1] onwards, laid out as above.
local function read_request(k0, a0, n)
  k0, a0, n = k0 or 0, a0 or 0, n or #KEYS
  local req = {
    now_ms = tonumber(ARGV[a0 + 1]),
    now_us = tonumber(ARGV[a0 + 2]),
    cost = tonumber(ARGV[a0 + 3]),
    grace_ms = tonumber(ARGV[a0 + 4]),
    k0 = k0,
    limits = {},
    states = {},
    present = {}, -- present[i]: KEYS[k0 + i] was stored
  }
  for i = 1, n do
    local a = a0 + 4 + (i - 1) * 5
    req.limits[i] = {
      Algorithm = tonumber(ARGV[a + 1]),
      Max = tonumber(ARGV[a + 2]),
      Window = tonumber(ARGV[a + 3]),
      Capacity = tonumber(ARGV[a + 4]),
      Emission = tonumber(ARGV[a + 5]),
    }
    local stored = redis.call('GET', KEYS[k0 + i])
    req.present[i] = stored ~= false
    if stored == false then
      req.states[i] = {Used = 0, End = 0, Prev = 0}
    else
      local used, ends, prev
      if req.limits[i].Algorithm == SLIDING_WINDOW then
        used, ends, prev = string.match(stored, '^(%-?%d+):(%-?%d+):(%-?%d+)$')
      else
        used, ends = string.match(stored, '^(%-?%d+):(%-?%d+)$')
        prev = '0'
      end
      used, ends, prev = tonumber(used), tonumber(ends), tonumber(prev)
      if used == nil or ends == nil or prev == nil or math.abs(used) > MAX_EXACT or math.abs(ends) > MAX_EXACT
          or math.abs(prev) > MAX_EXACT then
        return nil, 'THROTTLEKIT_FOREIGN_VALUE key ' .. KEYS[k0 + i] .. ' holds a value this script did not write'
      end
      req.states[i] = {Used = used, End = ends, Prev = prev}
    end
  end
  return req
end

-- policy_ttl is the TTL every key of the policy gets, for garbage
-- collection only: grace_ms after the last of the states stops mattering
-- (a window's end, a bucket's TAT), counted from now, so no two clocks need
-- to agree. One TTL for all keys makes them exist and vanish together: a
-- multi-key script never finds some keys of a policy gone and others there,
-- which a Cluster slot in migration answers with TRYAGAIN.
--
-- written[i] says whether KEYS[i] will be stored after this script; nil
-- means every key.
local function policy_ttl(req, states, written)
  local ttl = req.grace_ms
  for i = 1, #states do
    if written == nil or written[i] then
      local s = states[i]
      local live = s.End - req.now_ms
      if req.limits[i].Algorithm == GCRA then
        live = floor_div(s.End - req.now_us + 999, 1000)
      elseif req.limits[i].Algorithm == SLIDING_WINDOW then
        live = live + req.limits[i].Window -- the next window weighs this one
      end
      ttl = math.max(ttl, live + req.grace_ms)
    end
  end
  return ttl
end

-- write_state stores limit i's state s with the policy's TTL (an integer
-- well below 2^53, which Redis receives in full digits).
local function write_state(req, i, s, ttl)
  local value
  if req.limits[i].Algorithm == SLIDING_WINDOW then
    value = string.format('%d:%d:%d', s.Used, s.End, s.Prev)
  else
    value = string.format('%d:%d', s.Used, s.End)
  end
  redis.call('SET', KEYS[req.k0 + i], value, 'PX', ttl)
end

-- reply is what every script returns: {first, used_1, end_1, prev_1,
-- used_2, end_2, prev_2, ...}, integers only; first is the verdict (1 or
-- 0), or for take.lua the units granted.
local function reply(first, states)
  local out = {first}
  for i = 1, #states do
    out[3 * i - 1] = states[i].Used
    out[3 * i] = states[i].End
    out[3 * i + 1] = states[i].Prev
  end
  return out
end

-- decide_request decides a request read by read_request, writes the new
-- states when it is allowed (and costs something), and returns the reply:
-- the body of decide.lua, which decide_many.lua runs once per request.
local function decide_request(req)
  local allowed, next = decide(req.limits, req.now_ms, req.now_us, req.cost, req.states)
  if allowed and req.cost > 0 then
    local ttl = policy_ttl(req, next, nil)
    for i = 1, #next do
      write_state(req, i, next[i], ttl)
    end
  end
  return reply(allowed and 1 or 0, next)
end
