-- release.lua - end the lease of its current holder and say so on the
-- release channel.
-- KEYS: record, and the old layout's lease and history (see lib.lua).
-- ARGV: owner, token, channel, key (the message).
-- Returns 1 when released, 0 when owner and token are not the lease's.
-- Needs lib.lua in front.
-- Compared before ending: a blind write would end a successor's lease. The
-- end item above the grant ends it, and is all the AOF gets.
-- current() and end_item() in one: the ms since the grant, compared with
-- its life (the item's LIFE_MS is the last extension's), are the end
-- item's number too.
local s = head(KEYS[1], KEYS[2], KEYS[3])
local g = s and not s.ended and s.g
if g and g.owner == ARGV[1] and g.token == ARGV[2] then
  local since = tonumber(now_ms()) - tonumber(g.acquired_ms)
  if since < tonumber(g.life) then
    redis.call('LPUSH', KEYS[1], 'r ' .. string.format('%d', since))
    redis.call('PUBLISH', ARGV[3], ARGV[4])
    return 1
  end
end
return 0
