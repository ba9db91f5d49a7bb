-- inspect.lua - the state of one key, read atomically.
-- KEYS: record, and the old layout's lease and history (see lib.lua). No
-- ARGV.
-- Returns {0} for a key never acquired, else {1, last token, owner, label,
-- token, pttl, ttl_ms, ended}: owner, label, token, pttl and ttl_ms are ''
-- for a free key, and ended is 'released' or 'expired' for a key without a
-- lease ('' while one exists).
-- Needs lib.lua in front.
local s = head(KEYS[1], KEYS[2], KEYS[3])
if not s then return {0} end
local now = now_ms()
local g = current(s, now)
if g then
  return {1, s.last, g.owner, g.label, g.token,
          string.format('%d', tonumber(expires(g)) - tonumber(now)),
          g.ttl, ''}
end
-- Released only when the newest token's grant was: a floor above it, a
-- lost or an expired grant say expired, as the old layout did.
local released = s.g and s.ended == 'r' and s.g.token == s.last
return {1, s.last, '', '', '', '-2', '', released and 'released' or 'expired'}
