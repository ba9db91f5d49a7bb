-- release.lua - end the lease of its current holder and say so on the
-- release channel.
-- KEYS: record, and the old layout's lease and history (see lib.lua).
-- ARGV: owner, token, channel, key (the message).
-- Returns 1 when released, 0 when owner and token are not the lease's.
-- Needs lib.lua in front.
-- Compared before ending: a blind write would end a successor's lease. The
-- end item above the grant ends it, and is all the AOF gets.
if not record(KEYS[1], KEYS[2], KEYS[3]) then return 0 end
local s = top(KEYS[1])
local now = now_ms()
local g = current(s, now)
if g and g.owner == ARGV[1] and g.token == ARGV[2] then
  redis.call('LPUSH', KEYS[1], end_item('r', g, now))
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
return 0
