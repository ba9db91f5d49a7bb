-- put.lua - write a guarded value while a lease is held.
-- KEYS: lease, data. ARGV: owner, token, value.
-- Returns 1 when written, 0 when owner and token are not the lease's.
-- Uses no helper of lib.lua (it is sent in front all the same).
-- Applied only while the lease's owner and token are current (an expired
-- hash is gone).
local h = redis.call('HMGET', KEYS[1], 'owner', 'token')
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  redis.call('HSET', KEYS[2], 'value', ARGV[3], 'token', ARGV[2])
  return 1
end
return 0
