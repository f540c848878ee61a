-- configure.lua — hot config for the whole cluster (F9, F12).
-- KEYS: see lib.lua.  ARGV[2..] field, value pairs (validated by the caller).
-- Raising max_concurrent admits waiters at once; lowering it never revokes.
-- Disabling in reject mode leaves waiters to their deadlines (their instances
-- see the flag at the next heartbeat).
-- A change of tenant_fairness, max_per_tenant or enabled rebuilds the tenant
-- structures (O(tenants), or O(waiters + holders) when switching into
-- tenant-aware mode): waiters keep their sequence and their place within their
-- tenant; the rotation restarts in order of each tenant's oldest waiter.
-- Returns the config as a flat field/value list.
local before = load_cfg()
for i = 2, #ARGV, 2 do redis.call('HSET', K_CFG, ARGV[i], ARGV[i + 1]) end
local cfg = load_cfg()
if cfg and (not before or before.tmode ~= cfg.tmode or before.fair ~= cfg.fair or
    before.per_tenant ~= cfg.per_tenant or before.enabled ~= cfg.enabled) then
  if cfg.tmode or (before and before.tmode) then rebuild_tenants(before, cfg) end
end
dispatch(cfg, now_ms())
return redis.call('HGETALL', K_CFG)
