-- restore.lua — an instance (re-)registers together with everything it holds and waits for,
-- atomically: after a loss (FLUSHALL, a restart, a failover that lost writes), after it was
-- reaped (paused or cut off longer than the TTL), or after running on its on_redis_down
-- policy. Idempotent: what Redis still has is kept, what is missing is added.
-- KEYS: see lib.lua.
-- ARGV[2] instance id, ARGV[3] liveness TTL ms, ARGV[4] recovery fence ms,
-- ARGV[5] n below which this instance's waiters and permits in Redis that are not listed are
--         removed (requests that ended while their cancel could not reach Redis; orphans: permits
--         released while their release could not reach Redis, grants to a request that ended);
--         '' = keep them,
-- ARGV[6] P, then P permits as (n, tenant, kind, held_ms) groups, kind 'r' = Redis had granted
--         it, 'l' = granted locally while Redis was unreachable; held_ms = how long it has been
--         held (the status view's age of a permit Redis lost),
-- then the waiters, oldest first, as (n, order, remaining_ms, waited_ms, weight, tenant) groups;
--         order is the order score Redis gave it ('' = never queued in Redis: it gets a new one);
--         waited_ms = how long it has waited (its age in the status view, when Redis lost it);
--         remaining_ms 0: kept if Redis has it, never added (the instance lists so a request
--         whose acquire is on its way: that acquire may run after this restore)
-- Permits are added back even above the cap (and a tenant's cap): the work is running and is
-- never revoked (like lowering max_concurrent); no new grant happens until below it. A waiter
-- keeps its order score, so it goes back to its old place, ahead of everyone who arrived
-- after it; a listed waiter that Redis had granted meanwhile is reported, not re-queued.
-- Permits of kind 'r' missing while this instance was registered mean Redis lost writes (a
-- failover): the state is fenced for ARGV[4] ms, as after a re-creation, so that the other
-- instances can restore what they lost before anything more is granted; so is a holders key
-- found deleted (holders_lost in lib.lua). A waiter still in the per-instance index but no
-- longer in the queue (the queue key was deleted) goes back into the queue at its place. A
-- request found waiting in two places keeps the older one.
-- Returns {'ok', permits_added, waiters_added, granted, orders, held, in_use, fence_left_ms,
--          was_registered, fenced, released}: granted = n of listed waiters that hold a permit
-- now, orders = flat (n, order score) of listed waiters that wait, held = this instance's
-- permits in Redis, released = the orphans released (below). Or {'lost'} when the state is gone
-- (the heartbeat creates it first).
local inst, ttl, fence_ms, clean_below = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local count = tonumber(ARGV[6])
local cfg = load_cfg()
if not cfg then return {'lost'} end
local now = now_ms()
local fence_before = cfg.fence
local mine = redis.call('ZSCORE', K_INSTANCES, inst)
local was_registered = mine ~= false and tonumber(mine) >= 0
if mine ~= false and not was_registered then
  -- Reaped halfway: finish it (what it had is re-added below from the list).
  repeat local _, _, done = purge(cfg, inst, REAP_BUDGET) until done
end
redis.call('ZADD', K_INSTANCES, now + ttl, inst)

local listed = {}  -- the n of every permit and waiter listed
local permits, missing_granted = 0, 0
local first_waiter = 7 + 4 * count
for i = 7, first_waiter - 1, 4 do
  local id, tenant, kind = inst .. '|' .. ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local held = math.max(0, tonumber(ARGV[i + 3]) or 0)
  listed[ARGV[i]] = true
  if not holds(id) then
    local member = find_waiter(id)
    if member then waiter_remove(cfg, member) end  -- granted locally while it waited in Redis
    holder_add(cfg, id, tenant, now - held)
    permits = permits + 1
    if kind == 'r' then missing_granted = missing_granted + 1 end
  end
end
if was_registered and missing_granted > 0 and fence_ms > 0 and cfg.fence < now + fence_ms then
  fence_state(cfg, now, fence_ms)  -- on this Redis: a switch to it needs no second fence
end
-- Fenced here: for the permits above, or since a permit added back found the holders key
-- deleted (holder_add).
local fenced = cfg.fence > fence_before and 1 or 0

local waiters, top_order = 0, 0
for i = first_waiter, #ARGV - 5, 6 do
  local n, order, remaining = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local waited = math.max(0, tonumber(ARGV[i + 3]) or 0)
  local id = inst .. '|' .. n
  listed[n] = true
  local indexed = find_waiter(id)
  if order ~= '' then top_order = math.max(top_order, tonumber(order) or 0) end
  if indexed then
    -- Indexed but not queued: the queue key was deleted (evicted, DEL) under it. Back in the
    -- queue at its place (a tenant's queue, a key of its own, still has it).
    if redis.call('ZSCORE', K_QUEUE, indexed) == false then
      redis.call('ZADD', K_QUEUE, int(order ~= '' and tonumber(order) or next_order(cfg)), indexed)
      waiters = waiters + 1
    end
  elseif not holds(id) and remaining > 0 then
    local score = order ~= '' and tonumber(order) or next_order(cfg)
    local member = make_member(id, now + remaining, now - waited, tonumber(ARGV[i + 4]), ARGV[i + 5])
    q_add(member, score)
    if cfg.tmode then t_enqueue(cfg, ARGV[i + 5], member, score) end
    waiters = waiters + 1
  end
end
-- A counter below a waiter's order score went back (Redis lost writes: a snapshot, a failover):
-- later arrivals would queue ahead of that waiter. It goes on above it.
if top_order > 0 then seq_at_least(top_order) end
local lo, hi = range_of(inst)
-- One request, one place: a second member of one id (a first acquire that ran after a restore
-- had queued it) leaves, and the older place (the lower order score) stays. Unlisted waiters
-- below ARGV[5] leave here too.
local place = {}
for _, member in ipairs(redis.call('ZRANGEBYLEX', K_BYINST, lo, hi)) do
  local _, id = split_waiter(member)
  local n = string.sub(id, #inst + 2)
  if clean_below and not listed[n] and (tonumber(n) or 0) < clean_below then
    waiter_remove(cfg, member)
  elseif place[id] then
    local kept = tonumber(redis.call('ZSCORE', K_QUEUE, place[id]))
    local this = tonumber(redis.call('ZSCORE', K_QUEUE, member))
    if this and (not kept or this < kept) then
      waiter_remove(cfg, place[id])
      place[id] = member
    else
      waiter_remove(cfg, member)
    end
  else
    place[id] = member
  end
end
local released = {}
if clean_below then
  -- Orphans: permits of this instance that it neither holds nor waits for (released while Redis
  -- was unreachable, granted to a request that ended): released here, in the same step, so that
  -- no other instance's restore counts a seat twice (its local grant and this orphan).
  local credit_before = cfg.credit
  for _, member in ipairs(redis.call('ZRANGEBYLEX', K_HOLDERS, lo, hi)) do
    local id, _, t = split_holder(member)
    local n = string.sub(id, #inst + 2)
    if not listed[n] and (tonumber(n) or 0) < clean_below and holder_remove(cfg, id, t) == 1 then
      released[#released + 1] = id
    end
  end
  -- While fenced, a release is room for one hand-off (fence_credit). But a permit granted
  -- locally (added above) took the seat of one released meanwhile: that seat is not free.
  local taken = math.min(cfg.credit - credit_before, permits - missing_granted)
  if taken > 0 then
    cfg.credit = cfg.credit - taken
    redis.call('HINCRBY', K_CFG, 'fence_credit', -taken)
  end
end

local _, in_use = dispatch(cfg, now)
local granted, orders = {}, {}
for i = first_waiter, #ARGV - 5, 6 do
  local n = ARGV[i]
  local id = inst .. '|' .. n
  -- A request waits or holds, never both: the waiter lookup first (one command; a non-holder
  -- costs holds() two).
  local member = find_waiter(id)
  if member then
    orders[#orders + 1] = n
    orders[#orders + 1] = tonumber(redis.call('ZSCORE', K_QUEUE, member))
  elseif holds(id) then
    granted[#granted + 1] = n
  end
end
local held = holder_ids(redis.call('ZRANGEBYLEX', K_HOLDERS, lo, hi))
return {'ok', permits, waiters, granted, orders, held, in_use, math.max(0, cfg.fence - now),
        was_registered and 1 or 0, fenced, released}
