-- history_lost.lua - mark the grant whose renew was refused as lost.
-- KEYS: history, lease. ARGV: owner, token.
-- Returns 1 when an entry was marked, 0 when there was nothing to mark
-- (pruned, released, another owner's, or still the lease).
-- Needs lib.lua in front.
-- Lost, unless released; an end time it already has (a successor's
-- takeover found it expired) is kept. Not while it is still the lease,
-- which only a stray call could ask. Tokens are unique per key, so the
-- walk (at most the kept entries) stops at the first.
local h = redis.call('HMGET', KEYS[2], 'owner', 'token')
if h[1] == ARGV[1] and h[2] == ARGV[2] then return 0 end
for i, v in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local e = decode(v)
  if e and e.token == ARGV[2] then
    if e.owner ~= ARGV[1] or e.ended == 'released' then return 0 end
    if not e.ended_ms or e.ended_ms == '0' then
      e.ended_ms = ended_at(e, now_ms())
    end
    e.ended = 'lost'
    redis.call('LSET', KEYS[1], i - 1, cjson.encode(e))
    return 1
  end
end
return 0
