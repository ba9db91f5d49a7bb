-- history_lost.lua - mark the grant whose renew was refused as lost.
-- KEYS: record, and the old layout's lease and history (see lib.lua).
-- ARGV: owner, token.
-- Returns 1 when the grant is (now) marked lost, 0 when there was nothing
-- to mark (pruned, released, another owner's, or still the lease).
-- Needs lib.lua in front.
-- Lost, unless released; its end time is when it expired (never later
-- than now). Not while it is still the lease, which only a stray call
-- could ask. Tokens are unique per key, so the walk (at most the kept
-- items) stops at the first; the end item goes right above the grant.
local s = head(KEYS[1], KEYS[2], KEYS[3])
if not s then return 0 end
local now = now_ms()
local g = current(s, now)
if g and g.owner == ARGV[1] and g.token == ARGV[2] then return 0 end
local ended = nil
for _, v in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local e = grant(v)
  if e and e.token == ARGV[2] then
    if e.owner ~= ARGV[1] or ended == 'r' then return 0 end
    if ended ~= 'l' then
      redis.call('LINSERT', KEYS[1], 'BEFORE', v,
                 end_item('l', e, ended_at(e, now)))
    end
    return 1
  elseif e then
    ended = nil
  else
    local kind = mark(v)
    if kind == 'r' or kind == 'l' then ended = kind end
  end
end
return 0
