-- heartbeat.lua — one instance says it is alive (about once a second).
-- KEYS: see lib.lua.
-- ARGV[2] instance id, ARGV[3] liveness TTL ms, ARGV[4] key expiry ms (0 = leave as is),
-- ARGV[5..11] defaults if the limiter has no config yet:
--   max_concurrent, max_queue ('' = unbounded), enabled, when_disabled, max_wait_ms,
--   tenant_fairness ('1'|'0', optional), max_per_tenant ('' = none, optional)
-- Extends the liveness, reaps dead instances and dispatches (so a crashed
-- holder's permits move on without waiting for a new arrival).
-- Returns {lost, held, head_seq, queued, in_use, cfg (flat field/value list), reaped, granted}:
--   lost     1 when this instance was unknown or its liveness had run out:
--            its permits and waiters may have been reaped; it must restore them
--   held     this instance's permits as Redis knows them (a waiter of ours that
--            appears here was granted, even if the wake message was lost)
--   head_seq sequence of the queue head (0 if empty), for positions
local inst, ttl, expiry = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
-- Reap first: if this instance's own liveness ran out it is reaped here like
-- any dead one, and ZADD then adds it anew, which is what 'lost' means.
local reaped = reap(now)
local lost = redis.call('ZADD', K_INSTANCES, now + ttl, inst)
local flat = redis.call('HGETALL', K_CFG)
if #flat == 0 then
  redis.call('HSET', K_CFG, 'max_concurrent', ARGV[5], 'max_queue', ARGV[6], 'enabled', ARGV[7],
             'when_disabled', ARGV[8], 'max_wait_ms', ARGV[9], 'tenant_fairness', ARGV[10] or '0',
             'max_per_tenant', ARGV[11] or '')
  flat = redis.call('HGETALL', K_CFG)
end
local cfg = cfg_from_flat(flat)
local granted, in_use = dispatch(cfg, now)
local held = redis.call('ZRANGEBYLEX', K_HOLDERS, '[' .. inst .. '|', '(' .. inst .. '}')
local head = redis.call('ZRANGE', K_QUEUE, 0, 0, 'WITHSCORES')
local head_seq = head[2] and tonumber(head[2]) or 0
local queued = head[2] and redis.call('ZCARD', K_QUEUE) or 0
if expiry > 0 then
  for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], expiry) end
  redis.call('PEXPIRE', K_PTENANT, expiry)
  if cfg and cfg.tmode then
    for _, key in ipairs(TENANT_KEYS) do redis.call('PEXPIRE', key, expiry) end
  end
end
return {lost, held, head_seq, queued, in_use, flat, reaped, granted}
