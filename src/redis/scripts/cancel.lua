-- cancel.lua — a waiter gives up (timeout, cancellation, client gone).
-- KEYS: see lib.lua.  ARGV[2] queue member "inst|n|deadline"
-- Returns:
--   {'removed'}   it was still waiting: it left the queue
--   {'released'}  it had been granted meanwhile: that permit was returned
--                 and passed on (the caller had already given up)
--   {'unknown'}   neither waiting nor holding (already gone)
local member = ARGV[2]
if redis.call('ZREM', K_QUEUE, member) == 1 then return {'removed'} end
local _, id = split_waiter(member)
if redis.call('ZREM', K_HOLDERS, id) == 1 then
  dispatch(load_cfg(), now_ms())
  return {'released'}
end
return {'unknown'}
