-- renew.lua - extend the lease of its current holder.
-- KEYS: record, and the old layout's lease and history (see lib.lua).
-- ARGV: owner, token, ttl_ms.
-- Returns 1 when extended, 0 when owner and token are not the lease's.
-- Needs lib.lua in front.
-- An expired grant is never revived. The item keeps the new expiry, which
-- also dates the grant if it runs out.
if not ARGV[3]:find('^%d+$') then
  return redis.error_reply('ERR lease: ttl_ms malformed')
end
local s = head(KEYS[1], KEYS[2], KEYS[3])
if not s then return 0 end
local now = now_ms()
local g = current(s, now)
if g and g.owner == ARGV[1] and g.token == ARGV[2] then
  g.ttl, g.expires_ms = ARGV[3], plus(now, ARGV[3])
  redis.call('LSET', KEYS[1], s.i, item(g))
  return 1
end
return 0
