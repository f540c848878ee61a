-- cancel.lua — a waiter gives up (timeout, cancellation, client gone).
-- KEYS: see lib.lua.  ARGV[2] queue member "inst|n|deadline[|weight|tenant]"
-- Returns:
--   {'removed'}   it was still waiting: it left the queue (and its tenant's queue;
--                 a tenant whose last waiter leaves leaves the rotation)
--   {'released'}  it had been granted meanwhile: that permit was returned
--                 and passed on (the caller had already given up)
--   {'unknown'}   neither waiting nor holding (already gone)
local member = ARGV[2]
local _, id, _, _, tenant = split_waiter(member)
if redis.call('ZREM', K_QUEUE, member) == 1 then
  local cfg = load_cfg()
  if cfg and cfg.tmode then t_remove(cfg, tenant, member) end
  return {'removed'}
end
local cfg = load_cfg()
if holder_remove(cfg, id, tenant) == 1 then
  dispatch(cfg, now_ms())
  return {'released'}
end
return {'unknown'}
