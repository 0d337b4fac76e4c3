-- Reserve prompt estimate + reply cap for one generation. The daily budget, the
-- per-minute bucket and the running-reply cap are checked and updated in ONE
-- script so two concurrent requests can never both pass a check only one fits.
--
-- KEYS: 1 day hash, 2 bucket hash, 3 running zset, 4 reservation hash,
--       5 expiry zset, 6 settled marker
-- ARGV: 1 generation_id, 2 want, 3 now (epoch s), 4 daily_tokens, 5 refill per s,
--       6 burst, 7 max_running, 8 reservation ttl s, 9 day-counter ttl s,
--       10 user_id, 11 plan, 12 day, 13 prompt estimate, 14 reply cap,
--       15 conversation_id, 16 reservation-hash ttl s
-- Returns {'admitted'|'existing'|'settled', hash...} or {'refused', reason, detail, detail2}.
local day_key, bucket_key, running_key = KEYS[1], KEYS[2], KEYS[3]
local resv_key, expiry_key, settled_key = KEYS[4], KEYS[5], KEYS[6]
local gen = ARGV[1]
local want, now = tonumber(ARGV[2]), tonumber(ARGV[3])
local daily, rate, burst = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local max_running, ttl = tonumber(ARGV[7]), tonumber(ARGV[8])

-- 1. A redelivered request gets what it already has; a settled one is never reserved twice.
if redis.call('EXISTS', resv_key) == 1 then
  return {'existing', unpack(redis.call('HGETALL', resv_key))}
end
if redis.call('EXISTS', settled_key) == 1 then
  return {'settled', unpack(redis.call('HGETALL', settled_key))}
end

-- 2. Daily budget: what was charged plus what is still reserved plus this request.
local day = redis.call('HMGET', day_key, 'used', 'reserved')
local committed = tonumber(day[1] or '0') + tonumber(day[2] or '0')
if committed + want > daily then
  return {'refused', 'daily_budget', tostring(committed), ''}
end

-- 3. Running replies. Slots past their expiry no longer count (the reaper settles
-- them), so a dead reaper cannot lock a user out; drop them to bound the set.
redis.call('ZREMRANGEBYSCORE', running_key, '-inf', now)
local running = redis.call('ZCARD', running_key)
if running >= max_running then
  local first = redis.call('ZRANGE', running_key, 0, 0, 'WITHSCORES')
  return {'refused', 'concurrency', tostring(running), first[2] or ''}
end

-- 4. Token bucket, refilled lazily from its last update. A request larger than the
-- burst needs a full bucket rather than being unsatisfiable forever.
local b = redis.call('HMGET', bucket_key, 'level', 'ts')
local level, ts = tonumber(b[1]), tonumber(b[2])
if level == nil then level, ts = burst, now end
if now > ts then
  level = math.min(burst, level + (now - ts) * rate)
  ts = now
end
local take = math.min(want, burst)
if level < take then
  return {'refused', 'rate_limit', tostring(level), ''}
end

-- 5. Record it all.
local expires = now + ttl
level = level - take
redis.call('HINCRBY', day_key, 'reserved', want)
redis.call('EXPIRE', day_key, ARGV[9])
redis.call('HSET', bucket_key, 'level', tostring(level), 'ts', tostring(ts))
-- Once the bucket would be full again the key carries no information.
redis.call('EXPIRE', bucket_key, math.ceil((burst - level) / rate) + 1)
redis.call('ZADD', running_key, expires, gen)
redis.call('EXPIRE', running_key, math.ceil(ttl) + 1)
redis.call('HSET', resv_key, 'generation_id', gen, 'user_id', ARGV[10], 'plan', ARGV[11], 'day', ARGV[12],
  'amount', want, 'prompt', ARGV[13], 'reply_cap', ARGV[14], 'conversation_id', ARGV[15],
  'created_at', ARGV[3], 'expires_at', tostring(expires))
redis.call('EXPIRE', resv_key, ARGV[16])
redis.call('ZADD', expiry_key, expires, gen)
return {'admitted', unpack(redis.call('HGETALL', resv_key))}
