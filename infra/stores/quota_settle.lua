-- Settle one generation exactly once: charge real use to the reservation's day,
-- release the rest, free the running slot, leave a settled marker (with what a
-- UsageRecorded needs) and put it in the usage outbox. A second call -- a
-- redelivered reply, or the reaper racing settlement -- finds the marker and
-- changes nothing.
--
-- KEYS: 1 reservation hash, 2 day hash, 3 running zset, 4 expiry zset,
--       5 settled marker, 6 bucket hash, 7 outbox zset
-- ARGV: 1 generation_id, 2 tokens_in, 3 tokens_out, 4 now, 5 marker ttl s,
--       6 burst, 7 refill per s, 8.. detail field/value pairs
-- Returns the marker hash, or false if already settled or never reserved.
if redis.call('EXISTS', KEYS[5]) == 1 or redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local gen = ARGV[1]
local amount = tonumber(redis.call('HGET', KEYS[1], 'amount'))
local charged = tonumber(ARGV[2]) + tonumber(ARGV[3])
redis.call('HINCRBY', KEYS[2], 'used', charged)
redis.call('HINCRBY', KEYS[2], 'reserved', -amount)
redis.call('HINCRBY', KEYS[2], 'replies', 1)
redis.call('ZREM', KEYS[3], gen)
redis.call('ZREM', KEYS[4], gen)

-- The bucket took the reservation; it should have taken the real use.
local burst, rate = tonumber(ARGV[6]), tonumber(ARGV[7])
local level = tonumber(redis.call('HGET', KEYS[6], 'level') or ARGV[6])
level = math.min(burst, level + amount - charged)
if level < burst then
  if redis.call('EXISTS', KEYS[6]) == 0 then redis.call('HSET', KEYS[6], 'ts', ARGV[4]) end
  redis.call('HSET', KEYS[6], 'level', tostring(level))
  redis.call('EXPIRE', KEYS[6], math.ceil((burst - level) / rate) + 1)
elseif redis.call('EXISTS', KEYS[6]) == 1 then
  redis.call('HSET', KEYS[6], 'level', tostring(level))
end

local fields = redis.call('HGETALL', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[5], unpack(fields))
redis.call('HSET', KEYS[5], 'tokens_in', ARGV[2], 'tokens_out', ARGV[3], 'charged', charged,
  'settled_at', ARGV[4], 'published', '0')
for i = 8, #ARGV, 2 do
  redis.call('HSET', KEYS[5], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[5], ARGV[5])
redis.call('ZADD', KEYS[7], ARGV[4], gen)
return redis.call('HGETALL', KEYS[5])
