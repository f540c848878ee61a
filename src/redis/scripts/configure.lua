-- configure.lua — hot config for the whole cluster (F9).
-- KEYS: see lib.lua.  ARGV[2..] field, value pairs (validated by the caller).
-- Raising max_concurrent admits waiters at once; lowering it never revokes.
-- Disabling in reject mode leaves waiters to their deadlines (their instances
-- see the flag at the next heartbeat).
-- Returns the config as a flat field/value list.
for i = 2, #ARGV, 2 do redis.call('HSET', K_CFG, ARGV[i], ARGV[i + 1]) end
dispatch(load_cfg(), now_ms())
return redis.call('HGETALL', K_CFG)
