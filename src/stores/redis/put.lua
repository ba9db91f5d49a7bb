-- put.lua - write a guarded value while a lease is held.
-- KEYS: record, the old layout's lease and history (see lib.lua), data.
-- ARGV: owner, token, value.
-- Returns 1 when written, 0 when owner and token are not the lease's.
-- Needs lib.lua in front.
-- Applied only while the lease's owner and token are current and it has
-- not expired, by the server's clock.
local s = head(KEYS[1], KEYS[2], KEYS[3])
if not s then return 0 end
local g = current(s, now_ms())
if g and g.owner == ARGV[1] and g.token == ARGV[2] then
  redis.call('HSET', KEYS[4], 'value', ARGV[3], 'token', ARGV[2])
  return 1
end
return 0
