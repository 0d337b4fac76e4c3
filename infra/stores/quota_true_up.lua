-- Adjust a reservation to the real prompt size (prompt build counted it with the
-- model's tokenizer). No refusal here: the request was admitted; a bigger prompt
-- becomes bucket debt the user's next request waits for.
--
-- KEYS: 1 reservation hash, 2 day hash, 3 bucket hash
-- ARGV: 1 real prompt tokens, 2 now, 3 burst, 4 refill per s
-- Returns {delta, new amount}, or false if the reservation is gone (settled or expired).
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local prompt = tonumber(redis.call('HGET', KEYS[1], 'prompt'))
local delta = tonumber(ARGV[1]) - prompt
if delta ~= 0 then
  redis.call('HSET', KEYS[1], 'prompt', ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'amount', delta)
  redis.call('HINCRBY', KEYS[2], 'reserved', delta)
  local burst, rate = tonumber(ARGV[3]), tonumber(ARGV[4])
  local level = tonumber(redis.call('HGET', KEYS[3], 'level') or ARGV[3])
  level = math.min(burst, level - delta)
  if redis.call('EXISTS', KEYS[3]) == 0 then redis.call('HSET', KEYS[3], 'ts', ARGV[2]) end
  redis.call('HSET', KEYS[3], 'level', tostring(level))
  redis.call('EXPIRE', KEYS[3], math.ceil((burst - level) / rate) + 1)
end
return {delta, tonumber(redis.call('HGET', KEYS[1], 'amount'))}
