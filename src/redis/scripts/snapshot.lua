-- snapshot.lua — one consistent view of the limiter, for status pages.
-- KEYS: see lib.lua.  ARGV[2] max waiters to list.
-- Returns {now_ms, cfg (flat), holders, queue (member, seq, ...), queued, instances (id, deadline, ...),
--          tenant holders (tenant, count, ...), tenants in dispatch order, parked tenants}
-- (the last three are empty unless the config is tenant-aware).
local limit = tonumber(ARGV[2])
return {
  now_ms(),
  redis.call('HGETALL', K_CFG),
  redis.call('ZRANGE', K_HOLDERS, 0, -1),
  redis.call('ZRANGE', K_QUEUE, 0, limit - 1, 'WITHSCORES'),
  redis.call('ZCARD', K_QUEUE),
  redis.call('ZRANGE', K_INSTANCES, 0, -1, 'WITHSCORES'),
  redis.call('HGETALL', K_THOLDERS),
  redis.call('ZRANGE', K_TREADY, 0, -1),
  redis.call('SMEMBERS', K_TPARKED),
}
