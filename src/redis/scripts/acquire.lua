-- acquire.lua — a new request asks for a permit.
-- KEYS: see lib.lua.
-- ARGV[2] instance id, ARGV[3] request number n (unique per instance), ARGV[4] max wait ms,
-- ARGV[5] tenant (optional, default ''), ARGV[6] weight 1..1000 (optional, default 1)
-- Returns one of:
--   {'granted'}                             the permit "inst|n" is held now
--   {'queued', member, sequence, position}  waiting; member = "inst|n|deadline[|weight|tenant]"
--   {'rejected', reason}                    reason: queue_full | disabled | timeout
--   {'dead'}                                this instance's liveness expired: heartbeat first
--   {'lost'}                                the limiter's config is gone: heartbeat first
-- Position: the global arrival rank; with tenant_fairness min((k-1)*T + r, queued),
-- k = rank in its tenant's queue, T = tenants that wait, r = its tenant's place in
-- the rotation (T when parked) — as core::LimiterState::position().
local inst, n, max_wait = ARGV[2], ARGV[3], tonumber(ARGV[4])
local tenant, weight = ARGV[5] or '', tonumber(ARGV[6] or '1')
local now = now_ms()
if not alive(inst, now) then return {'dead'} end
local cfg = load_cfg()
if not cfg then return {'lost'} end
local id = inst .. '|' .. n
if not cfg.enabled then
  if cfg.pass then
    holder_add(cfg, id, tenant)
    return {'granted'}
  end
  return {'rejected', 'disabled'}
end
local queued = redis.call('ZCARD', K_QUEUE)
if cfg.tmode then
  -- I3': tready is empty unless there is no room, so with room every waiter
  -- belongs to a parked tenant: a newcomer below its own cap passes nobody.
  if redis.call('ZCARD', K_TREADY) == 0 and redis.call('ZCARD', K_HOLDERS) < cfg.max and
      not (cfg.cap and held_by(tenant) >= cfg.cap) then
    holder_add(cfg, id, tenant)
    return {'granted'}
  end
elseif queued == 0 and redis.call('ZCARD', K_HOLDERS) < cfg.max then
  -- I3 holds before this script, so a non-empty queue means there is no room.
  holder_add(cfg, id, tenant)
  return {'granted'}
end
if max_wait <= 0 then return {'rejected', 'timeout'} end
if cfg.max_queue and queued >= cfg.max_queue then return {'rejected', 'queue_full'} end
local seq = redis.call('INCR', K_SEQ)
local member = make_member(id, now + max_wait, weight, tenant)
redis.call('ZADD', K_QUEUE, seq, member)
local position = queued + 1
if cfg.tmode then
  t_enqueue(cfg, tenant, member, seq)
  if cfg.fair then
    local k = redis.call('ZCARD', tq(tenant))
    local tenants = redis.call('ZCARD', K_TREADY) + redis.call('SCARD', K_TPARKED)
    local rank = redis.call('ZRANK', K_TREADY, tenant)
    local turn = rank and rank + 1 or tenants
    position = math.min((k - 1) * tenants + turn, queued + 1)
  end
end
return {'queued', member, seq, position}
