-- release.lua - end the lease of its current holder and say so on the
-- release channel.
-- KEYS: lease, history. ARGV: owner, token, channel, key (the message).
-- Returns 1 when released, 0 when owner and token are not the lease's.
-- Needs lib.lua in front.
-- Compare before deleting: a plain DEL would remove a successor's lease.
-- The current lease's entry is the head (the newest grant).
local h = redis.call('HMGET', KEYS[1], 'owner', 'token')
if h[1] == ARGV[1] and h[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  local e = head(KEYS[2])
  if e and e.token == ARGV[2] and e.ended == 'held' then
    e.ended = 'released'
    e.ended_ms = now_ms()
    redis.call('LSET', KEYS[2], 0, cjson.encode(e))
  end
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
return 0
