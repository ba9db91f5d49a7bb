-- acquire.lua - grant the lease to an owner, or say who holds it.
-- KEYS: record, and the old layout's lease and history (see migrate in
-- lib.lua). ARGV: owner, label, ttl_ms, keep (the fewest grants the
-- record keeps), tokens ('clock' or 'counter').
-- A new grant's token is the newest token + 1, or with 'clock' the
-- server's clock in microseconds when that is greater: a promoted replica
-- that lost the last grants (and the record's head with them) still issues
-- newer tokens.
-- Returns {1, token, clock_us} for a new grant (clock_us: the server's
-- clock, so the caller sees how far it is behind the token), {1, token}
-- for a retry by the holder (its own token again), or
-- {0, owner, label, token, pttl, ttl_ms} of the holder.
-- Needs lib.lua in front.
if not ARGV[1]:find('^%S+$') or not ARGV[3]:find('^%d+$') then
  return redis.error_reply('ERR lease: owner or ttl_ms malformed')
end
local s = head(KEYS[1], KEYS[2], KEYS[3]) or {last = '0'}
local now, us = clock()
local g = current(s, now)
if g then
  if g.owner == ARGV[1] then
    -- A retry by the holder is no new grant: the same item, extended like
    -- a renew, with the label and ttl asked now.
    g.label, g.ttl, g.expires_ms = ARGV[2], ARGV[3], plus(now, ARGV[3])
    redis.call('LSET', KEYS[1], s.i, item(g))
    return {1, g.token}
  end
  return {0, g.owner, g.label, g.token,
          string.format('%d', tonumber(expires(g)) - tonumber(now)), g.ttl}
end
local t = succ(s.last)
if ARGV[5] == 'clock' and not ge(t, us) then t = us end
-- Tokens end at 2^63 - 1: past it nothing is written (the caller answers
-- that the store failed), never a grant the caller would refuse to hold.
if not ge('9223372036854775807', t) then
  return redis.error_reply('ERR lease: fencing tokens are exhausted for this key')
end
-- One command for the grant: the lease, the counter and the history entry
-- at once (item's grammar, written out: its life is the ttl, its TTL
-- field empty). A grant before it with no end item expired: nothing to
-- write.
local n = redis.call('LPUSH', KEYS[1], table.concat({t, ARGV[1], ARGV[3], now,
  ARGV[3], '', ARGV[2]}, ' '))
-- Trimmed in batches, once every 20 grants or so, not by every grant: at
-- most two items a grant (and one floor), so 2 * keep + 1 items hold the
-- newest keep grants at least. LPUSH's answer is the length.
local keep = tonumber(ARGV[4])
if n > 2 * keep + 40 then
  redis.call('LTRIM', KEYS[1], 0, 2 * keep)
end
return {1, t, us}
