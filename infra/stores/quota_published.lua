-- The UsageRecorded for a settled generation was acknowledged by Kafka: flag the
-- marker (never recreate one that expired: it would live forever) and leave the outbox.
-- KEYS: 1 settled marker, 2 outbox zset; ARGV: 1 generation_id
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'published', '1')
end
return redis.call('ZREM', KEYS[2], ARGV[1])
