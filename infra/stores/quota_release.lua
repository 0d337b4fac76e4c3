-- Release a generation that will never be answered (refused or failed after admission,
-- or given up by the gateway), charging nothing: the reservation goes back to the day and
-- the bucket and the running slot is freed, all in this one step. The settled marker it
-- leaves (charged 0, nothing to publish) makes it exactly once: a second release, a late
-- settlement, the reaper, or a redelivered request that would reserve again all find it.
-- With no reservation yet (the gateway gave up before admission ran) only the marker is
-- written, so the request is never admitted.
--
-- KEYS: 1 reservation hash, 2 day hash, 3 running zset, 4 expiry zset, 5 settled marker,
--       6 bucket hash
-- ARGV: 1 generation_id, 2 now, 3 marker ttl s, 4 burst, 5 refill per s, 6 reason,
--       7 user_id, 8 plan, 9 day (the last three only for the no-reservation case)
-- Returns the tokens given back, or false if it was already settled or released.
if redis.call('EXISTS', KEYS[5]) == 1 then
  return false
end
local gen, amount = ARGV[1], 0
if redis.call('EXISTS', KEYS[1]) == 1 then
  amount = tonumber(redis.call('HGET', KEYS[1], 'amount'))
  redis.call('HINCRBY', KEYS[2], 'reserved', -amount)
  redis.call('ZREM', KEYS[3], gen)
  local burst, rate = tonumber(ARGV[4]), tonumber(ARGV[5])
  local level = tonumber(redis.call('HGET', KEYS[6], 'level') or ARGV[4])
  level = math.min(burst, level + amount)
  redis.call('HSET', KEYS[6], 'level', tostring(level))
  if redis.call('HEXISTS', KEYS[6], 'ts') == 0 then redis.call('HSET', KEYS[6], 'ts', ARGV[2]) end
  redis.call('EXPIRE', KEYS[6], math.ceil((burst - level) / rate) + 1)
  redis.call('HSET', KEYS[5], unpack(redis.call('HGETALL', KEYS[1])))
  redis.call('DEL', KEYS[1])
else
  redis.call('HSET', KEYS[5], 'generation_id', gen, 'user_id', ARGV[7], 'plan', ARGV[8], 'day', ARGV[9],
    'amount', 0, 'prompt', 0, 'reply_cap', 0, 'created_at', ARGV[2])
end
redis.call('ZREM', KEYS[4], gen)
redis.call('HSET', KEYS[5], 'tokens_in', 0, 'tokens_out', 0, 'charged', 0, 'settled_at', ARGV[2],
  'published', '1', 'status', 'failed', 'released', ARGV[6])
redis.call('EXPIRE', KEYS[5], ARGV[3])
return amount
