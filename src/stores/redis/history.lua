-- history.lua - a key's grant history, newest first.
-- KEYS: history, lease. ARGV: max (the most entries to return).
-- Returns a list of {token, owner, label, ttl_ms, acquired_ms, ended,
-- ended_ms}, all strings.
-- Needs lib.lua in front.
-- A held entry that is not the lease in the same atomic read ran out: say
-- expired here, where its recorded expiry is at hand.
local now = now_ms()
local h = redis.call('HMGET', KEYS[2], 'owner', 'token')
local out = {}
for _, v in ipairs(redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)) do
  local e = decode(v)
  if e and e.token then
    local ended, ended_ms = e.ended or 'held', e.ended_ms or '0'
    if ended == 'held' and not (h[1] == e.owner and h[2] == e.token) then
      ended, ended_ms = 'expired', ended_at(e, now)
    end
    out[#out + 1] = {e.token, e.owner or '', e.label or '',
                     e.ttl_ms or '0', e.acquired_ms or '0', ended, ended_ms}
  end
end
return out
