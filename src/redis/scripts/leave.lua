-- leave.lua — an instance that shut down cleanly, holding nothing any more, leaves at once
-- (docs/design.md, "Leaving"): whatever Redis still counts for it goes now, as a reap of a dead
-- instance would take it a liveness TTL later — a permit whose release was lost, a waiter whose
-- cancel crossed a grant. The instance no longer runs anything, so none of it is in use; the
-- permits returned are handed on (dispatch, fenced or not, as a release's).
-- KEYS: see lib.lua.  ARGV[2] instance id.
-- Returns {left, grants made}: left 1 when the instance is out of instances; 0 when the state
-- is gone, or more than a reap's budget was left (it stays as one being reaped, and the others'
-- heartbeats finish it).
local inst = ARGV[2]
local cfg = load_cfg()
if not cfg then return {0, 0} end  -- the state is gone: changed nothing, as every script (lib.lua)
local _, _, done = reap_instance(cfg, inst, REAP_BUDGET, false)
local granted = dispatch(cfg, now_ms())
return {done and 1 or 0, granted}
