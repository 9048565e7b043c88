#!lua
-- decide_many.lua decides several requests in one call, each exactly as
-- decide.lua would, one after the other: WithBatching sends the decisions
-- queued for a standalone server (or one group's primary) together this
-- way, so that Redis runs one script call for many decisions instead of one
-- each. TestDecideManyMirrorsDecide runs both on the same random requests
-- and compares every reply and every stored state.
--
-- A request whose keys hold a foreign value fails alone: its element of
-- the reply is the error decide.lua would return, and the requests after it
-- are still decided.
-- Each request reads all its states before its first write, as in
-- decide.lua; the shebang makes Redis refuse the whole call up front when
-- it is out of memory.
--
-- ARGV  the number of requests, then for each request the number n of its
--       keys followed by its ARGV of decide.lua (4 + 5n values)
-- KEYS  the requests' keys, one request's after another's
-- reply one element per request: decide.lua's reply, or its error

local out = {}
local k0, p = 0, 2
for j = 1, tonumber(ARGV[1]) do
  local n = tonumber(ARGV[p])
  local req, err = read_request(k0, p, n)
  if req == nil then
    out[j] = redis.error_reply(err)
  else
    out[j] = decide_request(req)
  end
  k0 = k0 + n
  p = p + 5 + 5 * n
end
return out
