-- lib.lua - the local helpers the lease scripts share. redis.c sends it
-- in front of every script (LEASE_REDIS_LIB LEASE_REDIS_ACQUIRE ...);
-- run a script alone the same way:
--   cat lib.lua fence.lua > /tmp/f.lua && redis-cli --eval /tmp/f.lua KEY , ARG
-- No KEYS, no ARGV, no reply: it only defines locals.

-- Decimal strings compare as numbers by length, then bytes: exact for
-- every 64-bit token, where Lua's numbers would round above 2^53.
local function ge(a, b)
  if #a ~= #b then return #a > #b end
  return a >= b
end

-- The server's wall clock from TIME (allowed in Redis >= 5 scripts, which
-- replicate their effects, and the only mode of Redis 7), as a decimal
-- string built with %d: Lua's tostring would print large numbers in
-- exponent form.
local function now_ms()
  local t = redis.call('TIME')
  return string.format('%d', tonumber(t[1]) * 1000 +
                             math.floor(tonumber(t[2]) / 1000))
end

-- The same clock in microseconds since the epoch, the floor of a new
-- grant's token in clock mode (acquire.lua). Exact: about 1.8e15 today,
-- far below 2^53.
local function now_us()
  local t = redis.call('TIME')
  return string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
end

-- a + b for two decimal strings of ms, as a decimal string (see now_ms).
local function plus(a, b)
  return string.format('%d', tonumber(a) + tonumber(b))
end

-- A history entry, decoded, or nil (also for an entry that does not
-- decode: the history is best kept, never a reason to refuse a grant).
local function decode(v)
  if not v then return nil end
  local ok, e = pcall(cjson.decode, v)
  if ok and type(e) == 'table' then return e end
  return nil
end

-- The newest entry of history list k, decoded, or nil.
local function head(k) return decode(redis.call('LINDEX', k, 0)) end

-- When a held entry that is no longer the lease ended: its recorded expiry,
-- but never later than now (the hash can also vanish before its expiry,
-- e.g. deleted by hand or by a client without history; then the time it
-- was found gone is the best bound).
local function ended_at(e, now)
  local x = tonumber(e.expires_ms or '')
  if x and x > 0 and x <= tonumber(now) then return e.expires_ms end
  return now
end
