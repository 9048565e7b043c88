#!lua
-- decide.lua decides one request for one identifier's whole policy in one
-- atomic step. decide below is driver.Decide (throttler/driver/algorithm.go)
-- line for line, and the helpers it calls (common.lua) mirror the Go
-- functions they are named after. TestScriptsMirrorGo runs this script and
-- the Go function on the same random sequences and compares every reply.
--
-- The shebang (no flags) makes Redis 7 refuse the script up front when the
-- server is out of memory, instead of failing between two writes: with
-- every read and check done before the first write, a decision is all or
-- nothing.
--
-- KEYS, ARGV  see common.lua; ARGV[3] is the cost
-- reply       {allowed, used_1, end_1, ...}: the states after the decision,
--             as driver.Decide returns them

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
    elseif s.End > now_ms then -- Go: continue after the GCRA branch
      s.Used = math.max(s.Used, 0) + cost
    else
      s.Used, s.End = cost, window_opening(l, now_ms)
    end
  end
  return true, next
end

local req, err = read_request()
if req == nil then
  return redis.error_reply(err)
end
local allowed, next = decide(req.limits, req.now_ms, req.now_us, req.cost, req.states)
if allowed and req.cost > 0 then
  local ttl = policy_ttl(req, next, nil)
  for i = 1, #next do
    write_state(i, next[i], ttl)
  end
end
return reply(allowed, next)
