#!lua
-- decide_layout2.lua decides one request for the deploy that runs beside
-- processes of a release before layout 3 (Backend.Layout2Beside): it counts
-- where those processes count, in the strings of layouts 1 and 2, and in
-- the layout-3 hash, together and in one atomic step. Both layouts of one
-- identifier share its hash tag, so one script holds them on a Cluster too.
--
-- It reads the hash (read_request, common.lua) and every limit's string
-- ("used:end", "used:end:prev" for a sliding window, as peek_layout2.lua
-- reads them), and decides on what the two hold together, limit by limit:
-- the state that counts at now when only one does; when both count, for
-- the same End the larger Used and Prev (each side misses only the other's
-- units: the old release writes the strings alone, layout 3 alone the
-- hash, and this script both); else, as driver.Merge rules, a fixed window
-- keeps the hash's End with the larger Used, and GCRA and sliding windows
-- take the later End (TAT).
-- Then it decides as decide.lua does and, when allowed with a cost, writes
-- the states after the decision to both: the hash as write_states does,
-- every string with SET ... PX as layouts 1 and 2 did (the expiry policy_ttl
-- gives). Every read and check comes before the first write.
--
-- KEYS[1]      the layout-3 hash
-- KEYS[1 + i]  limit i's string (of key layout 1 or 2, as Go chose)
-- ARGV         as in common.lua; ARGV[3] is the cost (0: read, write nothing)
-- reply        as decide.lua's

local req, err = read_request()
if req == nil then
  return redis.error_reply(err)
end
local n = req.n

-- what state s of limit l counts at now, or nil when it counts nothing
local function counting(l, s)
  if l.Algorithm == GCRA then
    if s.End > req.now_us then
      return {Used = 0, End = s.End, Prev = 0}
    end
  elseif l.Algorithm == SLIDING_WINDOW then
    local cur, prev, e = sliding_counts(l, s, req.now_ms)
    if cur > 0 or prev > 0 then
      return {Used = cur, End = e, Prev = prev}
    end
  elseif s.End > req.now_ms then
    return {Used = math.max(s.Used, 0), End = s.End, Prev = 0}
  end
  return nil
end

for i = 1, n do
  local key = KEYS[1 + i]
  local l = req.limits[i]
  local given, err = read_layout2(key, l)
  if given == nil then
    return redis.error_reply(err)
  end
  local s = counting(l, given)
  local h = counting(l, req.states[i])
  if s ~= nil then
    if h == nil then
      req.states[i] = s
    elseif s.End == h.End then
      req.states[i] = {Used = math.max(s.Used, h.Used), End = s.End, Prev = math.max(s.Prev, h.Prev)}
    elseif l.Algorithm == GCRA or l.Algorithm == SLIDING_WINDOW then
      if s.End > h.End then
        req.states[i] = s
      end
    else
      -- a fixed window open on both sides with another End: the hash's
      -- stays, with the larger count (driver.Merge's rule)
      req.states[i] = {Used = math.max(s.Used, h.Used), End = h.End, Prev = 0}
    end
  end
end

local allowed, next = decide(req.limits, req.now_ms, req.now_us, req.cost, req.states)
if allowed and req.cost > 0 then
  local ttl = policy_ttl(req, next, nil)
  write_states(req, next, nil)
  for i = 1, n do
    local s = next[i]
    local value
    if req.limits[i].Algorithm == SLIDING_WINDOW then
      value = string.format('%d:%d:%d', s.Used, s.End, s.Prev)
    else
      value = string.format('%d:%d', s.Used, s.End)
    end
    redis.call('SET', KEYS[1 + i], value, 'PX', string.format('%d', ttl))
  end
end
return reply(allowed and 1 or 0, req.limits, next)
