-- cancel.lua — a request gives up (timeout, cancellation, client gone), by its id: the
-- caller need not know whether its acquire reached Redis, or what it answered.
-- KEYS: see lib.lua.  ARGV[2] request id "inst|n"
-- Returns:
--   {'removed'}   it was waiting: it left the queue (and its tenant's queue;
--                 a tenant whose last waiter leaves leaves the rotation)
--   {'released'}  it had been granted meanwhile: that permit was returned
--                 and passed on (the caller had already given up)
--   {'unknown'}   neither waiting nor holding (already gone, or never arrived)
local id = ARGV[2]
local cfg = load_cfg()
local member = find_waiter(id)
if member then
  waiter_remove(cfg, member)
  if cfg then pace_on_departure(cfg, now_ms()) end  -- the queue moved (F7)
  return {'removed'}
end
if holder_remove(cfg, id, nil) == 1 then
  dispatch(cfg, now_ms())
  return {'released'}
end
return {'unknown'}
