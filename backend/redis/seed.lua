#!lua
-- seed.lua takes the states another store decided for one identifier's
-- policy: it merges them into the stored states, then decides the cost on
-- the merged states, in one atomic step. in_force, merge_one and merge below
-- are driver.InForce, mergeOne and Merge (throttler/driver/seed.go) line for
-- line, and seed is driver.Seed; decide and the helpers they call
-- (common.lua) mirror the Go functions they are named after.
-- TestSeedScriptMirrorsGo runs this script and driver.Seed on the same
-- random states and sequences and compares every reply. The shebang works
-- as in decide.lua: every read and check comes before the first write.
--
-- KEYS, ARGV  see common.lua; ARGV[3] is the cost (0: the merge alone), and
--             after the limits' six arguments come the given states,
--             three per limit: used, end, prev (Go has checked that they
--             are not negative and stay below 2^53)
-- reply       {allowed, each limit's state, then each limit's state held
--             before, both as append_states (common.lua) lays them out}:
--             the states after the step, as driver.Seed leaves them, and
--             the states as read

-- State{}: the zero state, which counts nothing
local function is_zero(s)
  return s.Used == 0 and s.End == 0 and s.Prev == 0
end

-- a == b for two states
local function same(a, b)
  return a.Used == b.Used and a.End == b.End and a.Prev == b.Prev
end

-- InForce
local function in_force(l, s, now_ms, now_us)
  if l.Algorithm == GCRA then
    if s.End > now_us then
      return {Used = 0, End = s.End, Prev = 0}
    end
  elseif l.Algorithm == SLIDING_WINDOW then
    local cur, prev, e = sliding_counts(l, s, now_ms)
    if cur > 0 or prev > 0 then
      return {Used = cur, End = e, Prev = prev}
    end
  elseif s.End > now_ms then -- fixed and aligned windows: Go's default
    return {Used = math.max(s.Used, 0), End = s.End, Prev = 0}
  end
  return {Used = 0, End = 0, Prev = 0}
end

-- mergeOne
local function merge_one(l, h, g)
  if l.Algorithm == GCRA then
    return {Used = 0, End = math.max(h.End, g.End), Prev = 0}
  elseif l.Algorithm == SLIDING_WINDOW then
    if g.End == h.End then
      return {Used = math.max(h.Used, g.Used), End = h.End, Prev = math.max(h.Prev, g.Prev)}
    elseif g.End > h.End then
      return g
    end
    return h
  end
  -- fixed windows: the held window stays, whatever End the given one has
  return {Used = math.max(h.Used, g.Used), End = h.End, Prev = 0}
end

-- Merge. held is updated in place, as in Go.
local function merge(limits, now_ms, now_us, held, given)
  if #held ~= #limits or #given ~= #limits then
    return false
  end
  local changed = false
  for i = 1, #limits do
    local l = limits[i]
    local g = in_force(l, given[i], now_ms, now_us)
    if not is_zero(g) then -- Go: continue when g is the zero State
      local h = in_force(l, held[i], now_ms, now_us)
      local next = g
      if not is_zero(h) then
        next = merge_one(l, h, g)
      end
      if not same(next, h) then
        held[i] = next
        changed = true
      end
    end
  end
  return changed
end

-- Seed
local function seed(limits, now_ms, now_us, cost, states, given)
  merge(limits, now_ms, now_us, states, given)
  return decide(limits, now_ms, now_us, cost, states)
end

local req, err = read_request()
if req == nil then
  return redis.error_reply(err)
end
local n = #req.limits
local given, prior = {}, {}
for i = 1, n do
  local a = 5 + 6 * n + 3 * (i - 1)
  given[i] = {Used = tonumber(ARGV[a + 1]), End = tonumber(ARGV[a + 2]), Prev = tonumber(ARGV[a + 3])}
  local s = req.states[i]
  prior[i] = {Used = s.Used, End = s.End, Prev = s.Prev}
end
local allowed = seed(req.limits, req.now_ms, req.now_us, req.cost, req.states, given)
-- As in refund.lua: only the states that changed are written. An allowed
-- decision with a cost changes every state, so then every limit is
-- written, as decide.lua writes them.
local changed, written = false, {}
for i = 1, n do
  written[i] = not same(req.states[i], prior[i])
  changed = changed or written[i]
end
if changed then
  write_states(req, req.states, written)
end
local out = reply(allowed and 1 or 0, req.limits, req.states)
append_states(out, #out, req.limits, prior)
return out
