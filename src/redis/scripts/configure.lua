-- configure.lua — hot config for the whole cluster (F9, F12).
-- KEYS: see lib.lua.  ARGV[2..] field, value pairs (validated by the caller).
-- Raising max_concurrent admits waiters at once; lowering it never revokes.
-- Disabling in reject mode removes every waiter: each instance ends its own with 'disabled'
-- when it sees the config (every registered instance is told at once: '!cfg' on its wake
-- channel).
-- A change of tenant_fairness, max_per_tenant or enabled rebuilds the tenant
-- structures (O(tenants), or O(waiters + holders) when switching into
-- tenant-aware mode): waiters keep their order and their place within their
-- tenant; the rotation restarts in order of each tenant's oldest waiter.
-- Returns {'ok', cfg (flat field/value list)}, or {'lost'} when the state is gone (nothing is
-- written: a partial config would have no epoch and miss fields; the caller heartbeats, which
-- re-creates the state with its current settings, then asks again).
local before = load_cfg()
if not before then return {'lost'} end
for i = 2, #ARGV, 2 do redis.call('HSET', K_CFG, ARGV[i], ARGV[i + 1]) end
local cfg = load_cfg()
if (before.max ~= cfg.max or before.enabled ~= cfg.enabled) and (cfg.pace.last > 0 or cfg.seat.last > 0) then
  redis.call('HSET', K_CFG, 'pace_last', 0, 'seat_last', 0)  -- seats changed without a release: no gap runs
  cfg.pace.last = 0
  cfg.seat.last = 0
end
if before.tmode ~= cfg.tmode or before.fair ~= cfg.fair or before.per_tenant ~= cfg.per_tenant or
    before.enabled ~= cfg.enabled then
  if cfg.tmode or before.tmode then rebuild_tenants(before, cfg) end
end
if not cfg.enabled and not cfg.pass then clear_waiters(cfg) end
dispatch(cfg, now_ms())
notify_instances()
return {'ok', redis.call('HGETALL', K_CFG)}
