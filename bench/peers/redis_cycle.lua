-- One lock cycle in one script, for redis-benchmark: redis-py's acquire
-- (SET key token NX PX ttl) then its release (compare-and-delete).
-- KEYS[1] = key, ARGV[1] = token, ARGV[2] = ttl in ms. One round trip
-- and one AOF write (MULTI SET DEL EXEC) per cycle, where a client doing
-- the two calls pays two of each: a ceiling, not a like-for-like peer.
if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('del', KEYS[1])
end
return 1
