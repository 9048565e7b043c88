#!lua flags=allow-cross-slot-keys
-- decide_many.lua decides several requests in one call, each exactly as
-- decide.lua would, one after the other: WithBatching sends the decisions
-- queued for a standalone server (or one group's primary) together this
-- way, so that Redis runs one script call for many decisions instead of one
-- each. TestDecideManyMirrorsDecide runs both on the same random requests
-- and compares every reply and every stored state.
--
-- A request whose key holds a foreign value (another type, or a field that
-- is not an integer) fails alone: its part of the reply is the error
-- decide.lua would return, and the requests after it are still decided.
-- Each request reads all its states before its first write, as in
-- decide.lua; the shebang makes Redis refuse the whole call up front when
-- it is out of memory.
--
-- On a Cluster one call carries the decisions of every slot its node
-- serves: the flag allow-cross-slot-keys lets the script touch keys of
-- several of the node's slots, provided they are not declared (declared
-- keys must share a slot), so the keys travel in ARGV and only the first
-- is declared, for routing. A key the node does not serve (its slot moved
-- away, or is migrating and the key is not here yet) fails its HMGET
-- before anything is written for it: that request's element is a
-- THROTTLEKIT_ELSEWHERE error, the requests after it are still decided, and
-- the backend sends it again alone, through the Cluster client, which
-- follows the redirect.
--
-- ARGV  the expiry grace in ms; the number P of distinct policies, then for
--       each its number n of limits and its limits' six values each (as in
--       decide.lua); the number of requests, then for each the index of its
--       policy (1 to P), now_ms, now_us, its cost and its key
-- KEYS  the first request's key alone
-- reply flat: for each request, the elements of decide.lua's reply, or
--       its error alone
--
-- A batch's decisions mostly share a few policies: each is parsed once, and
-- a request carries four numbers and its key. Each policy has one request
-- table, filled again for each of its requests (read_states reuses its
-- states, write_states its list of fields), and the reply is one flat
-- array, so a decision makes no table but the HMGET's reply.

local grace_ms = tonumber(ARGV[1])
local policies = {}
local a = 2
for i = 1, tonumber(ARGV[2]) do
  local n = tonumber(ARGV[a + 1])
  policies[i] = new_request(nil, 0, 0, 0, grace_ms, read_limits(a - 4, n))
  a = a + 1 + 6 * n
end
local out, m = {}, 0
local count = tonumber(ARGV[a + 1])
a = a + 1
for _ = 1, count do
  local req = policies[ARGV[a + 1] + 0]
  req.key, req.now_ms, req.now_us, req.cost = ARGV[a + 5], ARGV[a + 2] + 0, ARGV[a + 3] + 0, ARGV[a + 4] + 0
  local _, err = read_states(req)
  m = m + 1
  if err ~= nil then
    out[m] = redis.error_reply(err)
  else
    -- decide_request, its reply laid into out
    local allowed, next = decide(req.limits, req.now_ms, req.now_us, req.cost, req.states)
    if allowed and req.cost > 0 then
      write_states(req, next, nil)
    end
    out[m] = allowed and 1 or 0
    m = append_states(out, m, req.limits, next)
  end
  a = a + 5
end
return out
