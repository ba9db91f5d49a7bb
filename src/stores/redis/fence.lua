-- fence.lua - advance a resource's fencing mark to a token.
-- KEYS: mark. ARGV: token (a decimal string).
-- Returns {1, token} when the token is at least the mark (equality is
-- accepted) and the mark is now the token, else {0, mark}.
-- Needs lib.lua in front (ge).
local m = redis.call('GET', KEYS[1]) or '0'
if ge(ARGV[1], m) then redis.call('SET', KEYS[1], ARGV[1]) return {1, ARGV[1]} end
return {0, m}
