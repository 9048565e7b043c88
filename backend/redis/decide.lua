#!lua
-- decide.lua decides one request for one identifier's whole policy in one
-- atomic step. decide (common.lua) is driver.Decide
-- (throttler/driver/algorithm.go) line for line, and the helpers it calls
-- mirror the Go functions they are named after. TestScriptsMirrorGo runs this script and
-- the Go function on the same random sequences and compares every reply.
--
-- The shebang (no flags) makes Redis 7 refuse the script up front when the
-- server is out of memory, instead of failing between two writes: with
-- every read and check done before the first write, a decision is all or
-- nothing.
--
-- KEYS, ARGV  see common.lua; ARGV[3] is the cost
-- reply       {allowed, then each limit's state as append_states (in
--             common.lua) lays it out}: the states after the decision, as
--             driver.Decide returns them

local req, err = read_request()
if req == nil then
  return redis.error_reply(err)
end
return decide_request(req)
