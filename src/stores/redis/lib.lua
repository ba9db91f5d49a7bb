-- lib.lua - the local helpers the lease scripts share. redis.c sends it
-- in front of every script (LEASE_REDIS_LIB LEASE_REDIS_ACQUIRE ...);
-- run a script alone the same way:
--   cat lib.lua fence.lua > /tmp/f.lua && redis-cli --eval /tmp/f.lua KEY , ARG
-- No KEYS, no ARGV, no reply: it only defines locals.
--
-- A key's record (KEYS[1] of every lease script, <prefix>{K}:token) is one
-- list, newest first, of three kinds of items:
--   grant   'TOKEN OWNER TTL0 ACQUIRED_MS LIFE_MS TTL LABEL': a grant,
--           TTL0 the ttl it was granted with, TTL (empty while it is TTL0)
--           and ACQUIRED_MS + LIFE_MS (its expiry) the ones of its last
--           extension; the label is last, so it may hold any byte (spaces,
--           newlines) but NUL;
--   end     'r MS' (released) or 'l MS' (lost): how the grant just below
--           it ended, MS after its ACQUIRED_MS (so a few digits);
--   floor   'c TOKEN': a token issued before without a grant item (the
--           counter of the old layout, see migrate).
-- One list for the lease, its counter and its history, because Redis 7
-- writes a script's effects to the AOF: each command costs its key name and
-- framing, and more than one command adds MULTI/EXEC. So a grant is one
-- LPUSH, a release one LPUSH of an end item, a renew one LSET. The newest
-- grant is the lease while it has no end item and the server's clock
-- (TIME) is before its EXPIRES_MS; otherwise it ended then (expired). The
-- newest token (grant or floor) is the counter: the list is never expired,
-- and trimmed (in batches) to the newest grants only.

-- Decimal strings compare as numbers by length, then bytes: exact for
-- every 64-bit token, where Lua's numbers would round above 2^53.
local function ge(a, b)
  if #a ~= #b then return #a > #b end
  return a >= b
end

-- a + 1 for a decimal string, exactly (tokens go above 2^53).
local function succ(a)
  local i = #a
  while i > 0 and a:sub(i, i) == '9' do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #a) end
  return a:sub(1, i - 1) .. string.char(a:byte(i) + 1) ..
         string.rep('0', #a - i)
end

-- The server's wall clock from TIME (allowed in Redis >= 5 scripts, which
-- replicate their effects, and the only mode of Redis 7): ms and us since
-- the epoch, as decimal strings. One TIME for both: every redis.call costs
-- the server about a microsecond of a script's run. Made of TIME's two
-- decimal strings (seconds, microseconds of up to 6 digits) by
-- concatenation, exact, without tonumber and string.format, which cost
-- more than the rest of the clock. The us (about 1.8e15 today) are the
-- floor of a new grant's token in clock mode (acquire.lua).
local function clock()
  local t = redis.call('TIME')
  local u = t[2]
  if #u < 6 then u = string.rep('0', 6 - #u) .. u end
  return t[1] .. u:sub(1, 3), t[1] .. u
end

-- The clock in ms alone.
local function now_ms()
  return (clock())
end

-- a + b for two decimal strings of ms, as a decimal string (see now_ms).
local function plus(a, b)
  return string.format('%d', tonumber(a) + tonumber(b))
end

-- A grant item as a table of strings (ttl in full), or nil for another
-- item. The short forms save AOF bytes on every grant. Its expiry is
-- expires(g): most calls never need it as a string.
local function grant(v)
  local t, o, t0, a, d, l, lab = string.match(v,
    '^(%d+) (%S+) (%d+) (%d+) (%-?%d+) (%d*) (.*)$')
  if not t then return nil end
  return {token = t, owner = o, ttl0 = t0, acquired_ms = a, life = d,
          ttl = l == '' and t0 or l, label = lab}
end

-- The expiry of grant g in ms, a decimal string: the one set on g (a
-- renew, a migration), else ACQUIRED_MS + LIFE_MS of its item.
local function expires(g)
  if not g.expires_ms then g.expires_ms = plus(g.acquired_ms, g.life) end
  return g.expires_ms
end

-- The grant item of table g.
local function item(g)
  return table.concat({g.token, g.owner, g.ttl0, g.acquired_ms,
    g.expires_ms and plus(g.expires_ms, -tonumber(g.acquired_ms)) or g.life,
    g.ttl == g.ttl0 and '' or g.ttl, g.label}, ' ')
end

-- An end or floor item: its kind ('r', 'l' or 'c') and number, or nil.
local function mark(v)
  return string.match(v, '^([rlc]) (%-?%d+)$')
end

-- The end item of kind 'r' or 'l' for grant g, ended at ms.
local function end_item(kind, g, ms)
  return kind .. ' ' .. plus(ms, -tonumber(g.acquired_ms))
end

-- When a grant that is no longer the lease ended: its last expiry, but
-- never later than now (a grant migrated from the old layout may have
-- lost its hash before its expiry; then the time it was found gone is the
-- best bound).
local function ended_at(g, now)
  local x = tonumber(expires(g))
  if x > 0 and x <= tonumber(now) then return g.expires_ms end
  return now
end

-- The head of record k from its first items (LRANGE k 0 2): {g = the
-- newest grant (or nil), i = its index, ended = 'r' or 'l' when an end
-- item is above it, ended_ms, last = the newest token ('0' for none)}.
-- Only the first three items can matter: a floor and an end item at most
-- above the newest grant. An item of no kind there is an error, not a
-- guess: the newest token is the counter.
local function top(k, items)
  local s = {last = '0'}
  for i, v in ipairs(items) do
    local g = grant(v)
    if g then
      s.g, s.i = g, i - 1
      if ge(g.token, s.last) then s.last = g.token end
      return s
    end
    local kind, n = mark(v)
    if not kind then
      return error({err = 'ERR lease: malformed item at the head of ' .. k})
    end
    if kind == 'c' then
      if ge(n, s.last) then s.last = n end
    else
      s.ended, s.ended_ms = kind, n
    end
  end
  return s
end

-- The grant of s while it is the lease: no end item, not yet expired.
-- Compared as numbers (ms since the epoch, exact in a double), the
-- expiry as its item has it unless one was set.
local function current(s, now)
  local g = s.g
  if not g or s.ended then return nil end
  local n = tonumber(now)
  if g.expires_ms then
    if n < tonumber(g.expires_ms) then return g end
  elseif n - tonumber(g.acquired_ms) < tonumber(g.life) then
    return g
  end
  return nil
end

-- The record of a key written by the old layout (of 0.1): ck the
-- counter (a string), lk the lease hash with its own expiry, hk a list of
-- cjson entries. Rewritten once, by the first script that touches the key,
-- into the list at ck (the old keys deleted): its newest token stays the
-- counter, so tokens keep increasing across the change. A lease held then
-- stays held, with its remaining time, and its holder's renew and release
-- go on. A client of the old layout fails on the list (WRONGTYPE) instead
-- of granting beside it.
-- Its helpers are made inside it, when a key of that layout is met: as
-- locals of this file they would be closures made again on every call of
-- every script (each costs the server allocations on the hot path).
local function migrate(ck, lk, hk)
  -- An entry of the old layout's cjson history, decoded, or nil.
  local function decode(v)
    local ok, e = pcall(cjson.decode, v)
    if ok and type(e) == 'table' then return e end
    return nil
  end

  local function digits(v) return type(v) == 'string' and v:find('^%d+$') end

  -- The items of one old history entry (end item, then grant), appended to
  -- out; h is the old lease hash {owner, label, token, ttl_ms} and pttl its
  -- PTTL. Returns 1 when the entry was the unexpired lease. An entry whose
  -- fields are not what that layout wrote is skipped, as it was then.
  local function convert(out, e, h, pttl, now)
    if not (digits(e.token) and type(e.owner) == 'string' and
            e.owner:find('^%S+$') and digits(e.ttl_ms) and
            digits(e.acquired_ms)) then return 0 end
    local g = {token = e.token, owner = e.owner, ttl0 = e.ttl_ms,
               acquired_ms = e.acquired_ms, ttl = e.ttl_ms,
               expires_ms = digits(e.expires_ms) and e.expires_ms or '0',
               label = type(e.label) == 'string' and e.label or ''}
    local ended = e.ended or 'held'
    local ended_ms = digits(e.ended_ms) and e.ended_ms or now
    local live = 0
    if ended == 'held' and h[1] == e.owner and h[3] == e.token and
       digits(h[4]) and pttl > 0 then
      g.expires_ms, g.ttl, g.label, live = plus(now, pttl), h[4], h[2], 1
    elseif ended == 'held' then
      g.expires_ms = ended_at(g, now)
    elseif ended == 'expired' then
      g.expires_ms = ended_ms
    else
      out[#out + 1] = end_item(ended == 'released' and 'r' or 'l', g, ended_ms)
    end
    out[#out + 1] = item(g)
    return live
  end

  local c = redis.call('GET', ck)
  if not digits(c) then
    return error({err = 'ERR lease: the counter ' .. ck .. ' is no number'})
  end
  local now = now_ms()
  local h = redis.call('HMGET', lk, 'owner', 'label', 'token', 'ttl_ms')
  local pttl = redis.call('PTTL', lk)
  local out, live = {}, 0
  for _, v in ipairs(redis.call('LRANGE', hk, 0, -1)) do
    local e = decode(v)
    if e then live = live + convert(out, e, h, pttl, now) end
  end
  -- A lease granted before the store kept a history: its acquisition time
  -- is not known, the latest bound is its last extension.
  if live == 0 and pttl > 0 and digits(h[3]) and digits(h[4]) and h[1] and
     h[1]:find('^%S+$') then
    local x = plus(now, pttl)
    table.insert(out, 1, item({token = h[3], owner = h[1], ttl0 = h[4],
      acquired_ms = plus(x, -tonumber(h[4])), expires_ms = x, ttl = h[4],
      label = h[2] or ''}))
  end
  local g = out[1] and (grant(out[1]) or grant(out[2] or ''))
  if not g or not ge(g.token, c) then table.insert(out, 1, 'c ' .. c) end
  redis.call('DEL', ck, lk, hk)
  for i = 1, #out, 100 do
    redis.call('RPUSH', ck, unpack(out, i, math.min(i + 99, #out)))
  end
end

-- The record of a key: migrated if need be, then its type checked.
-- Returns true when the key was ever acquired (the record exists).
local function record(ck, lk, hk)
  local t = redis.call('TYPE', ck).ok
  if t == 'string' then
    migrate(ck, lk, hk)
    t = 'list'
  end
  if t == 'none' then return false end
  if t ~= 'list' then
    return error({err = 'ERR lease: ' .. ck .. ' is a ' .. t .. ', not a record'})
  end
  return true
end

-- The head (see top) of the record of a key, migrated first if it still
-- has the old layout; nil when the key was never acquired (a list is
-- never empty). One command on the hot path, the LRANGE: only its error
-- (WRONGTYPE on the old layout's counter, a string) looks further, where a
-- TYPE before every LRANGE would cost each call another command.
local function head(ck, lk, hk)
  -- Arguments as strings: Redis prints a Lua number with snprintf.
  local items = redis.pcall('LRANGE', ck, '0', '2')
  if items.err then
    record(ck, lk, hk)
    items = redis.call('LRANGE', ck, '0', '2')
  end
  if #items == 0 then return nil end
  return top(ck, items)
end
