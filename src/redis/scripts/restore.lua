-- restore.lua — an instance that was reported lost puts back what it still has.
-- KEYS: see lib.lua.
-- ARGV[2] instance id, ARGV[3] number of permits P, ARGV[4 .. 3+P] permits
-- "inst|n" or "inst|n|tenant", then the queue members of its waiters, oldest first.
-- Permits are added back even above the cap (and a tenant's cap): the work is
-- running and is never revoked (like lowering max_concurrent); no new grant
-- happens until below it.
-- Waiters get new sequence numbers at the back of the queue (their old place
-- is unknown once state was lost). Returns {permits restored, waiters restored}.
local inst, count = ARGV[2], tonumber(ARGV[3])
local cfg = load_cfg()
local permits, waiters = 0, 0
for i = 4, 3 + count do
  local id, tenant = string.match(ARGV[i], '^([^|]+|[^|]+)|(.*)$')
  if not id then id, tenant = ARGV[i], '' end
  if redis.call('ZSCORE', K_HOLDERS, id) == false then
    if cfg then
      holder_add(cfg, id, tenant)
    else
      redis.call('ZADD', K_HOLDERS, 0, id)
    end
    permits = permits + 1
  end
end
for i = 4 + count, #ARGV do
  if redis.call('ZSCORE', K_QUEUE, ARGV[i]) == false then
    local seq = redis.call('INCR', K_SEQ)
    redis.call('ZADD', K_QUEUE, seq, ARGV[i])
    if cfg and cfg.tmode then
      local _, _, _, _, tenant = split_waiter(ARGV[i])
      t_enqueue(cfg, tenant, ARGV[i], seq)
    end
    waiters = waiters + 1
  end
end
dispatch(cfg, now_ms())
return {permits, waiters}
