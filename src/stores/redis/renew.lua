-- renew.lua - extend the lease of its current holder.
-- KEYS: lease, history. ARGV: owner, token, ttl_ms.
-- Returns 1 when extended, 0 when owner and token are not the lease's.
-- Needs lib.lua in front.
-- A missing (expired) hash is never revived. The entry keeps the new
-- expiry, to date the grant if it runs out.
local h = redis.call('HMGET', KEYS[1], 'owner', 'token')
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('HSET', KEYS[1], 'ttl_ms', ARGV[3])
  local e = head(KEYS[2])
  if e and e.token == ARGV[2] and e.ended == 'held' then
    e.expires_ms = plus(now_ms(), ARGV[3])
    redis.call('LSET', KEYS[2], 0, cjson.encode(e))
  end
  return 1
end
return 0
