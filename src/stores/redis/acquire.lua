-- acquire.lua - grant the lease to an owner, or say who holds it.
-- KEYS: lease, counter, history. ARGV: owner, label, ttl_ms, keep (the
-- most history entries to keep), tokens ('clock' or 'counter').
-- A new grant's token is the counter + 1, or with 'clock' the server's
-- clock in microseconds when that is greater: a promoted replica that lost
-- the last grants (and the counter with them) still issues newer tokens.
-- The counter always holds the last token issued.
-- Returns {1, token, clock_us} for a new grant (clock_us: the server's
-- clock, so the caller sees how far it is behind the token), {1, token}
-- for a retry by the holder (its own token again), or
-- {0, owner, label, token, pttl, ttl_ms} of the holder.
-- Needs lib.lua in front.
local cur = redis.call('HGET', KEYS[1], 'owner')
if cur then
  if cur == ARGV[1] then
    redis.call('HSET', KEYS[1], 'label', ARGV[2], 'ttl_ms', ARGV[3])
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    local t = redis.call('HGET', KEYS[1], 'token')
    -- A retry by the holder is no new grant: no entry, but it extends
    -- the lease like a renew, so the entry's expiry follows.
    local e = head(KEYS[3])
    if e and e.token == t and e.ended == 'held' then
      e.expires_ms = plus(now_ms(), ARGV[3])
      redis.call('LSET', KEYS[3], 0, cjson.encode(e))
    end
    return {1, t}
  end
  local h = redis.call('HMGET', KEYS[1], 'owner', 'label', 'token', 'ttl_ms')
  return {0, h[1], h[2], h[3], tostring(redis.call('PTTL', KEYS[1])), h[4]}
end
-- GET after INCR: Lua numbers are doubles, the string is exact (so is
-- ge on two decimal strings, also above 2^53).
redis.call('INCR', KEYS[2])
local t = redis.call('GET', KEYS[2])
local us = now_us()
if ARGV[5] == 'clock' and not ge(t, us) then
  redis.call('SET', KEYS[2], us)
  t = us
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'label', ARGV[2],
           'token', t, 'ttl_ms', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
-- No unexpired lease existed, so a previous grant still marked held ran
-- out. Only the head can be: every grant made here pushes its entry, and
-- every earlier one was ended by the grant after it.
local now = now_ms()
local p = head(KEYS[3])
if p and p.ended == 'held' then
  p.ended = 'expired'
  p.ended_ms = ended_at(p, now)
  redis.call('LSET', KEYS[3], 0, cjson.encode(p))
end
redis.call('LPUSH', KEYS[3], cjson.encode({token = t, owner = ARGV[1],
  label = ARGV[2], ttl_ms = ARGV[3], acquired_ms = now, ended = 'held',
  ended_ms = '0', expires_ms = plus(now, ARGV[3])}))
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[4]) - 1)
return {1, t, us}
