-- restore.lua — an instance that was reported lost puts back what it still has.
-- KEYS: see lib.lua.
-- ARGV[2] instance id, ARGV[3] number of permits P, ARGV[4 .. 3+P] permit ids "inst|n",
-- then the queue members "inst|n|deadline" of its waiters, oldest first.
-- Permits are added back even above the cap: the work is running and is never
-- revoked (like lowering max_concurrent); no new grant happens until below it.
-- Waiters get new sequence numbers at the back of the queue (their old place
-- is unknown once state was lost). Returns {permits restored, waiters restored}.
local inst, count = ARGV[2], tonumber(ARGV[3])
local permits, waiters = 0, 0
for i = 4, 3 + count do
  permits = permits + redis.call('ZADD', K_HOLDERS, 0, ARGV[i])
end
for i = 4 + count, #ARGV do
  if redis.call('ZSCORE', K_QUEUE, ARGV[i]) == false then
    redis.call('ZADD', K_QUEUE, redis.call('INCR', K_SEQ), ARGV[i])
    waiters = waiters + 1
  end
end
dispatch(load_cfg(), now_ms())
return {permits, waiters}
