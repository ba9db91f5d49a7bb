#!lua name=lease_fence
-- lease_fence.lua - the fencing check inside Redis itself (Redis >= 7.0
-- Functions): the mark and the write it guards change in one atomic call,
-- so a paused holder's late write is refused by Redis, whatever it sent.
--
-- Load it once (again after a FLUSHALL; REPLACE makes loading idempotent):
--   redis-cli -x FUNCTION LOAD REPLACE < lease_fence.lua
--
-- FCALL lease_fence_set 2 MARK_KEY DATA_KEY TOKEN VALUE
--   token >= the mark at MARK_KEY (none counts as 0; equality is accepted):
--   the mark becomes TOKEN, DATA_KEY is SET to VALUE, reply OK.
--   Otherwise the error "STALE token T < mark M" and nothing changes.
--   A DATA_KEY that exists while MARK_KEY does not is refused ("ERR mark
--   missing"): keep mark keys without a TTL, under a maxmemory-policy
--   that does not evict them (noeviction or volatile-*).
-- FCALL lease_fence_check 1 MARK_KEY TOKEN
--   the same check and advance, without a write: reply the mark (TOKEN).
-- FCALL_RO lease_fence_mark 1 MARK_KEY
--   the mark, or nil when the key has none.
-- A TOKEN that is not 1 .. 2^63-1 in decimal (as liblease issues them) is
-- the error "ERR bad token", and a MARK_KEY that holds something else the
-- error "ERR bad mark": neither changes anything.
--
-- In Redis Cluster the two keys must share a slot: give them one hash tag,
-- e.g. {tenant-42}:mark and {tenant-42}:data.

-- Decimal strings compare as numbers by length, then bytes: exact for
-- every 64-bit token, where Lua's numbers would round above 2^53. Byte by
-- byte, not with >=, which follows the server's collation locale.
local function ge(a, b)
  if #a ~= #b then return #a > #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return true
end

-- 1 .. 9223372036854775807 written in decimal, without sign or leading 0.
local function is_token(t)
  if type(t) ~= 'string' or not string.match(t, '^[1-9][0-9]*$') then
    return false
  end
  return #t < 19 or (#t == 19 and t <= '9223372036854775807')
end

local function usage(keys, args, nkeys, nargs, what)
  if #keys ~= nkeys or #args ~= nargs then
    return redis.error_reply('ERR wrong number of keys or arguments: ' .. what)
  end
  return nil
end

-- The check and the advance. Returns nil when the token is accepted (the
-- mark is the token now), else the error reply to give.
local function advance(mark_key, token)
  if not is_token(token) then
    return redis.error_reply('ERR bad token: 1 .. 2^63-1 in decimal')
  end
  local m = redis.call('GET', mark_key)
  if m and not is_token(m) then
    return redis.error_reply('ERR bad mark: the mark key holds no token')
  end
  m = m or '0'
  if not ge(token, m) then
    return redis.error_reply('STALE token ' .. token .. ' < mark ' .. m)
  end
  if token ~= m then redis.call('SET', mark_key, token) end
  return nil
end

-- The data written without a mark (evicted, expired, deleted, lost in a
-- failover) would let any token in: refuse until a mark is installed
-- again (lease_fence_check with the current holder's token).
local function fence_set(keys, args)
  local bad = usage(keys, args, 2, 2, 'lease_fence_set 2 MARK DATA TOKEN VALUE')
  if bad then return bad end
  if keys[1] == keys[2] then
    return redis.error_reply('ERR the mark key and the data key must differ')
  end
  if redis.call('EXISTS', keys[1]) == 0 and redis.call('EXISTS', keys[2]) == 1 then
    return redis.error_reply('ERR mark missing: the data key exists but the mark key ' ..
                             'has no mark (evicted, expired or deleted?); install one ' ..
                             'with lease_fence_check')
  end
  bad = advance(keys[1], args[1])
  if bad then return bad end
  redis.call('SET', keys[2], args[2])
  return redis.status_reply('OK')
end

local function fence_check(keys, args)
  local bad = usage(keys, args, 1, 1, 'lease_fence_check 1 MARK TOKEN')
    or advance(keys[1], args[1])
  if bad then return bad end
  return args[1]
end

local function fence_mark(keys, args)
  local bad = usage(keys, args, 1, 0, 'lease_fence_mark 1 MARK')
  if bad then return bad end
  local m = redis.call('GET', keys[1])
  if m and not is_token(m) then
    return redis.error_reply('ERR bad mark: the mark key holds no token')
  end
  return m
end

redis.register_function('lease_fence_set', fence_set)
redis.register_function('lease_fence_check', fence_check)
redis.register_function{function_name = 'lease_fence_mark', callback = fence_mark,
                        flags = {'no-writes'}}
