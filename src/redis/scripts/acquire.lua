-- acquire.lua — a new request asks for a permit.
-- KEYS: see lib.lua.
-- ARGV[2] instance id, ARGV[3] request number n (unique per instance), ARGV[4] max wait ms,
-- ARGV[5] tenant (optional, default ''), ARGV[6] weight 1..1000 (optional, default 1),
-- ARGV[7] '1' when this is a retry of a call whose reply was lost (optional): if the
--         request already reached Redis, its standing is reported instead (idempotent)
-- Returns one of:
--   {'granted'}                     the permit "inst|n" is held now
--   {'queued', order, position, est} waiting; order = its order score (later arrivals: larger);
--                                   est = estimated wait in ms (-1: no estimate, see lib.lua)
--   {'rejected', reason}            reason: queue_full | disabled | timeout | would_time_out
--                                   (reject_early: the estimate exceeds max wait by the margin)
--   {'lost'}                        the state is gone, or this instance is not registered in it:
--                                   nothing was changed; the instance heartbeats (and restores)
--                                   and asks again
-- Position: the global arrival rank; with tenant_fairness an upper bound (rotation_bound in
-- lib.lua: flat in tenants; the heartbeat tells the place rotation() counts).
-- While the state is fenced (after its re-creation) an arrival queues, unless a permit released
-- during the fence is free (see has_room in lib.lua); a grant first checks that this is the
-- Redis the count was made on (room_to_grant, "Which Redis" in lib.lua).
local inst, n, max_wait = ARGV[2], ARGV[3], tonumber(ARGV[4])
local tenant, weight = ARGV[5] or '', tonumber(ARGV[6] or '1')
local now = now_ms()
local cfg = load_cfg()
if not cfg or not registered(inst) then return {'lost'} end
local id = inst .. '|' .. n
if ARGV[7] == '1' then
  if holds(id) then return {'granted'} end
  local member = find_waiter(id)
  if member then
    return {'queued', tonumber(redis.call('ZSCORE', K_QUEUE, member)), position_of(cfg, member, tenant)}
  end
end
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
  local holders = redis.call('ZCARD', K_TREADY) == 0 and count_holders(cfg, now)
  if holders and queued > 0 and has_room(cfg, holders, now) and not tenants_whole(queued) and
      repair_tenants(cfg) then
    -- A tenant key was deleted on its own (rule 15) and stranded waiters: rebuilt, they go first;
    -- then this arrival as any other.
    local _
    _, holders = dispatch(cfg, now)
    queued = redis.call('ZCARD', K_QUEUE)
    if redis.call('ZCARD', K_TREADY) > 0 then holders = false end
  end
  if holders and has_room(cfg, holders, now) and not (cfg.cap and held_by(cfg, tenant) >= cfg.cap) and
      room_to_grant(cfg, holders, now) then
    holder_add(cfg, id, tenant)
    took_room(cfg, now)
    return {'granted'}
  end
elseif queued == 0 and room_to_grant(cfg, count_holders(cfg, now), now) then
  -- I3 holds before this script, so a non-empty queue means there is no room.
  holder_add(cfg, id, tenant)
  took_room(cfg, now)
  return {'granted'}
end
if max_wait <= 0 then return {'rejected', 'timeout'} end
if cfg.max_queue and queued >= cfg.max_queue then return {'rejected', 'queue_full'} end
if cfg.reject_early then
  -- Its position once queued (as below), before anything is written; under fairness the
  -- bound first, which reads no other tenant's queue.
  local p, k = queued + 1, nil
  if cfg.fair then
    k = redis.call('ZCARD', tq(tenant)) + 1
    p = rotation_bound(tenant, k, queued + 1, true)
  end
  local est = pace_estimate(cfg, now, p)
  if est >= 0 and would_time_out(est, max_wait) then
    if k then
      -- Under fairness the position decides (the turn order is not the queue order), as
      -- the memory backend counts it: the round robin's place (every waiting tenant's
      -- queue length; read only when the bound says too late).
      if would_time_out(pace_estimate(cfg, now, places(queued + 1)(tenant, k)), max_wait) then
        return {'rejected', 'would_time_out'}
      end
    else
      -- In one FIFO, waiters ahead that will time out before their turn make way
      -- (docs/eta.md). No margin on that estimate: it has no bias to absorb.
      local w = wait_behind(cfg, now, max_wait)
      if w == nil or w > max_wait then return {'rejected', 'would_time_out'} end
    end
  end
end
local order = next_order(cfg)
local member = make_member(id, now + max_wait, now, weight, tenant)
q_add(member, order)
local position = queued + 1
if cfg.tmode then
  t_enqueue(cfg, tenant, member, order)
  if cfg.fair then
    -- As position_of, knowing it is last in its tenant's queue and in the global one.
    position = rotation_bound(tenant, redis.call('ZCARD', tq(tenant)), queued + 1)
  end
end
return {'queued', order, position, pace_estimate(cfg, now, position)}
