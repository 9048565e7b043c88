-- common.lua holds what decide.lua, decide_many.lua, peek.lua, refund.lua,
-- take.lua and seed.lua share: the helpers of throttler/driver/algorithm.go and policy.go,
-- each named after the Go function it mirrors line for line, and the reading
-- and writing of states.
-- redis.go splices it into each script right after the script's first line,
-- its shebang, so every script Redis runs is whole in itself.
--
-- ARGV     now_ms, now_us, cost, grace_ms, n (the number of limits), then six
--          per limit: algorithm (0 fixed, 1 aligned, 2 gcra, 3 sliding), max,
--          window_ms, the limit's capacity and emission interval in µs,
--          which Go computes once per policy (driver.Limit.Capacity and
--          EmissionMicros), and the limit's key (driver.Limit.Key)
-- KEYS[1]  the identifier's state under the whole policy (layout 3): one
--          hash, every value a decimal integer, with for a limit of key K
--            eK  End: the window's end in Unix ms, or the TAT in Unix µs for GCRA
--            uK  Used (not for GCRA, whose Used is always 0)
--            pK  Prev, the count of the window before the one ending at End
--                (sliding windows only)
--          and the field x, the Unix ms (by the writer's clock) until which
--          the key's expiry was last set. A limit whose fields are absent
--          holds the zero State. One HMGET reads every limit, one HSET writes
--          them, whatever the number of limits; a limit that a redefined
--          policy dropped keeps its fields, untouched.
--
-- The numbers in ARGV come from redis.go, decimal integers always, so the
-- scripts read them with Lua's own coercion (ARGV[i] + 0), which parses a
-- string once where tonumber parses it twice (Lua 5.1 checks, then
-- converts). What a key holds may be foreign, so stored fields go through
-- tonumber and a check.
--
-- Lua numbers are doubles: every integer here stays below 2^53 (MaxQuota,
-- MaxWindow and the GCRA span bound see to it), so the arithmetic is exact.
-- Numbers go to Redis formatted with %d: how Redis turns a Lua number into a
-- string is its own business (7.0 prints %.17g), and tostring prints
-- 1.7e+15 (%.14g). tostring is no faster either: BenchmarkScriptCost
-- measured a guarded tostring for the integers below 1e14 at the same cost.

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
  if cost > l.Capacity then
    return false
  end
  if l.Algorithm == GCRA then
    local t = l.Emission
    local new_tat = math.max(s.End, now_us) + cost * t
    return new_tat - l.Capacity * t <= now_us
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
      s.End = math.max(s.End, now_us) + cost * l.Emission
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

-- read_limits parses n limits of ARGV, six values each starting at
-- ARGV[a0 + 6], into limits with the hash fields of each: l.E, l.U and l.P
-- name them, and l.je, l.ju and l.jp are their places in limits.fields,
-- the list read_states reads (x last, at limits.jx). A policy's list is
-- built once per script call, however many of its decisions it carries.
local function read_limits(a0, n)
  local limits = {}
  local fields = {}
  for i = 1, n do
    local a = a0 + 5 + (i - 1) * 6
    local alg, k, m = ARGV[a + 1] + 0, ARGV[a + 6], #fields
    -- one constructor names every field, so the table is sized once rather
    -- than grown field by field
    local l = {
      Algorithm = alg, Max = ARGV[a + 2] + 0, Window = ARGV[a + 3] + 0,
      Capacity = ARGV[a + 4] + 0, Emission = ARGV[a + 5] + 0,
      E = 'e' .. k, je = m + 1,
      U = alg ~= GCRA and 'u' .. k or nil, ju = alg ~= GCRA and m + 2 or nil,
      P = alg == SLIDING_WINDOW and 'p' .. k or nil, jp = alg == SLIDING_WINDOW and m + 3 or nil,
    }
    fields[m + 1] = l.E
    if l.U then
      fields[m + 2] = l.U
    end
    if l.P then
      fields[m + 3] = l.P
    end
    limits[i] = l
  end
  fields[#fields + 1] = 'x'
  limits.fields, limits.jx = fields, #fields
  return limits
end

-- read_int reads one stored field: 0 when absent, nil when it is not an
-- integer this script could have written.
local function read_int(v)
  if not v then
    return 0
  end
  local n = tonumber(v)
  if n == nil or n % 1 ~= 0 or n > MAX_EXACT or n < -MAX_EXACT then
    return nil
  end
  return n
end

-- read_states reads every limit's state of req with one HMGET on req.key,
-- all before any write, so that a foreign value stops a script before it
-- changes anything. It returns nil and an error message for a foreign value
-- (the key holds another type, or a field that is not an integer). The
-- values read stay in req.ints, in the order of limits.fields, so that
-- write_states writes only the fields that changed.
--
-- The states go into the tables req.states already holds, if any:
-- decide_many.lua decides request after request with one req per policy,
-- so a decision of a batch makes two tables: the HMGET's reply and its own
-- reply.
local function read_states(req)
  local limits = req.limits
  local fields = limits.fields
  local ints = redis.pcall('HMGET', req.key, unpack(fields))
  if ints.err then
    if string.find(ints.err, 'WRONGTYPE', 1, true) then
      return nil, 'THROTTLEKIT_FOREIGN_VALUE key ' .. req.key .. ': ' .. ints.err
    end
    -- a Cluster node that does not serve the key (decide_many.lua)
    return nil, 'THROTTLEKIT_ELSEWHERE key ' .. req.key .. ': ' .. ints.err
  end
  -- read_int, inline, in place: this runs for every field of every decision
  for j = 1, limits.jx do
    local v = ints[j]
    if v then
      local n = tonumber(v)
      if n == nil or n % 1 ~= 0 or n > MAX_EXACT or n < -MAX_EXACT then
        return nil, 'THROTTLEKIT_FOREIGN_VALUE key ' .. req.key .. ' field ' .. fields[j] ..
            ' holds a value this script did not write'
      end
      ints[j] = n
    else
      ints[j] = 0
    end
  end
  local states = req.states
  for i = 1, req.n do
    local l, s = limits[i], states[i]
    if s == nil then
      states[i] = {Used = l.ju and ints[l.ju] or 0, End = ints[l.je], Prev = l.jp and ints[l.jp] or 0}
    else
      s.Used, s.End, s.Prev = l.ju and ints[l.ju] or 0, ints[l.je], l.jp and ints[l.jp] or 0
    end
  end
  req.ints, req.expires = ints, ints[limits.jx]
  return req
end

-- new_request is a request on key under limits, read_states not yet run.
-- args is write_states' list of HSET arguments, kept for the next request.
local function new_request(key, now_ms, now_us, cost, grace_ms, limits)
  return {
    now_ms = now_ms, now_us = now_us, cost = cost, grace_ms = grace_ms,
    n = #limits, key = key, limits = limits,
    states = {}, args = {},
  }
end

-- read_request parses ARGV, laid out as above, and reads the states of
-- KEYS[1] (read_states).
local function read_request()
  local req = new_request(KEYS[1], ARGV[1] + 0, ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0, read_limits(0, ARGV[5] + 0))
  return read_states(req)
end

-- policy_ttl is the expiry the key needs, for garbage collection only:
-- grace_ms after the last of the written states stops mattering (a
-- window's end, a bucket's TAT), counted from now, so no two clocks need to
-- agree.
--
-- written[i] says whether limit i will be stored after this script; nil
-- means every limit.
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

-- write_states stores the states of the limits written[i] marks (nil: all)
-- with one HSET of the fields whose value changed, and moves the key's
-- expiry on when they need it past x, the expiry last set. The expiry never
-- moves back: the fields of limits a redefined policy dropped live on as
-- long as they were set to. A key's expiry is moved on by a whole grace past
-- what the states need, so that a GCRA bucket, whose TAT moves with every
-- decision, pays the PEXPIRE about once per grace rather than once per
-- decision.
local function write_states(req, states, written)
  -- args may hold a previous request's fields past m: HSET takes the first m
  local args, m = req.args, 0
  local ints = req.ints
  for i = 1, #states do
    if written == nil or written[i] then
      local l, s = req.limits[i], states[i]
      if s.End ~= ints[l.je] then
        args[m + 1], args[m + 2], m = l.E, string.format('%d', s.End), m + 2
      end
      if l.U and s.Used ~= ints[l.ju] then
        args[m + 1], args[m + 2], m = l.U, string.format('%d', s.Used), m + 2
      end
      if l.P and s.Prev ~= ints[l.jp] then
        args[m + 1], args[m + 2], m = l.P, string.format('%d', s.Prev), m + 2
      end
    end
  end
  local ttl = policy_ttl(req, states, written)
  local extend = req.expires == 0 or req.now_ms + ttl > req.expires
  if extend then
    ttl = ttl + req.grace_ms
    -- An End near 2^53 (a window of 400 days that ends far ahead) would
    -- carry x past what a double holds exactly: x then stays at the bound,
    -- and the expiry is set again by the next write, which is harmless.
    args[m + 1], args[m + 2], m = 'x', string.format('%d', math.min(req.now_ms + ttl, MAX_EXACT)), m + 2
  end
  if m > 0 then
    redis.call('HSET', req.key, unpack(args, 1, m))
  end
  if extend then
    redis.call('PEXPIRE', req.key, ttl)
  end
end

-- append_states appends to out, after its first m elements, the fields of
-- each limit's state that its algorithm keeps: Used (not for GCRA, whose
-- Used is always 0), End, and Prev (sliding windows only; it is always 0
-- for the others). redis.go reads them back by the policy (parseStates).
local function append_states(out, m, limits, states)
  for i = 1, #states do
    local alg, s = limits[i].Algorithm, states[i]
    if alg ~= GCRA then
      m = m + 1
      out[m] = s.Used
    end
    m = m + 1
    out[m] = s.End
    if alg == SLIDING_WINDOW then
      m = m + 1
      out[m] = s.Prev
    end
  end
  return m
end

-- reply is what every script returns: {first, then each limit's state as
-- append_states lays it out}, integers only; first is the verdict (1 or
-- 0), or for take.lua the units granted. A fixed window's reply is
-- {first, used, end}, a GCRA bucket's {first, tat}.
local function reply(first, limits, states)
  local out = {first}
  append_states(out, 1, limits, states)
  return out
end

-- decide_request decides a request read by read_request, writes the new
-- states when it is allowed (and costs something), and returns the reply:
-- the body of decide.lua, which decide_many.lua runs once per request.
local function decide_request(req)
  local allowed, next = decide(req.limits, req.now_ms, req.now_us, req.cost, req.states)
  if allowed and req.cost > 0 then
    write_states(req, next, nil)
  end
  return reply(allowed and 1 or 0, req.limits, next)
end
