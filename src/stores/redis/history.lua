-- history.lua - a key's grant history, newest first.
-- KEYS: record, and the old layout's lease and history (see lib.lua).
-- ARGV: max (the most entries to return).
-- Returns a list of {token, owner, label, ttl_ms, acquired_ms, ended,
-- ended_ms}, all strings.
-- Needs lib.lua in front.
-- A grant with no end item ended when it expired, unless it is the lease.
if not record(KEYS[1], KEYS[2], KEYS[3]) then return {} end
local now = now_ms()
local max = tonumber(ARGV[1])
local out, ended, ended_ms = {}, nil, nil
for _, v in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local g = grant(v)
  if g then
    local e, ms = 'held', '0'
    if ended then
      e, ms = ended == 'r' and 'released' or 'lost', plus(g.acquired_ms, ended_ms)
    elseif #out > 0 or tonumber(now) >= tonumber(expires(g)) then
      e, ms = 'expired', ended_at(g, now)
    end
    out[#out + 1] = {g.token, g.owner, g.label, g.ttl0, g.acquired_ms, e, ms}
    if #out >= max then break end
    ended = nil
  else
    local kind, n = mark(v)
    if kind == 'r' or kind == 'l' then ended, ended_ms = kind, n end
  end
end
return out
