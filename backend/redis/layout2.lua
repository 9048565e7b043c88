-- layout2.lua holds what peek_layout2.lua and decide_layout2.lua share:
-- reading one limit's string of layouts 1 and 2 ("used:end", and
-- "used:end:prev" for a sliding window). redis.go splices it after
-- common.lua into those two scripts only, so the scripts of layout 3 do not
-- pay for a function they never call.

-- read_layout2 reads limit l's string under key: the zero State when there
-- is none, or nil and an error message for a value layout 2 could not have
-- written (another type, or another shape).
local function read_layout2(key, l)
  local stored = redis.pcall('GET', key)
  if type(stored) == 'table' and stored.err then
    return nil, 'THROTTLEKIT_FOREIGN_VALUE key ' .. key .. ': ' .. stored.err
  end
  if stored == false then
    return {Used = 0, End = 0, Prev = 0}
  end
  local used, ends, prev
  if l.Algorithm == SLIDING_WINDOW then
    used, ends, prev = string.match(stored, '^(%-?%d+):(%-?%d+):(%-?%d+)$')
  else
    used, ends = string.match(stored, '^(%-?%d+):(%-?%d+)$')
    prev = '0'
  end
  if used ~= nil then
    used, ends, prev = read_int(used), read_int(ends), read_int(prev)
  end
  if used == nil or ends == nil or prev == nil then
    return nil, 'THROTTLEKIT_FOREIGN_VALUE key ' .. key .. ' holds a value layout 2 did not write'
  end
  return {Used = used, End = ends, Prev = prev}
end
