-- inspect.lua - the state of one key, read atomically.
-- KEYS: lease, counter, history. No ARGV.
-- Returns {0} for a key never acquired, else {1, counter, owner, label,
-- token, pttl, ttl_ms, ended}: owner, label, token and ttl_ms are '' for
-- a free key, and ended is 'released' or 'expired' for a key without a
-- lease ('' while one exists).
-- Needs lib.lua in front.
-- The hash leaves no trace when it expires nor when it is released: for a
-- key without one, the last grant's history entry says whether it was
-- released.
local c = redis.call('GET', KEYS[2])
if not c then return {0} end
local h = redis.call('HMGET', KEYS[1], 'owner', 'label', 'token', 'ttl_ms')
local ended = ''
if not h[1] then
  local e = head(KEYS[3])
  ended = (e and e.token == c and e.ended == 'released') and 'released'
          or 'expired'
end
return {1, c, h[1] or '', h[2] or '', h[3] or '',
        tostring(redis.call('PTTL', KEYS[1])), h[4] or '', ended}
