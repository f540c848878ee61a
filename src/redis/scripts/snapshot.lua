-- snapshot.lua — the cluster-wide status of the limiter (GET /v1/limiters/{name}, the dashboard,
-- fairgate top): the holders and the waiters of every instance, one page of each, with their
-- tenants and times, in one consistent read. Writes nothing.
-- KEYS: see lib.lua.  ARGV[2] offset, ARGV[3] limit (of each list; the caller bounds it).
-- Returns {'lost'} when the state is gone, else
--   {'ok', now_ms, in_use, queued, holders, waiters, instances}:
--   holders    flat (permit id, tenant, granted_ms) of holders offset+1 .. offset+limit, oldest
--              grant first (granted_ms -1 when unknown: listed last)
--   waiters    flat (request id, tenant, arrived_ms, position) of waiters offset+1 ..
--              offset+limit in queue (arrival) order (arrived_ms -1 when unknown); position:
--              the arrival rank, under tenant fairness the place rotation() counts (lib.lua;
--              with more than COUNTED_TENANTS tenants waiting, bounded_places' upper bound)
--   instances  the ids of the instances whose liveness runs
-- Cost: waiters O(log n + limit) (a ZRANGE by rank; under tenant fairness one ZRANK per listed
-- waiter and rotation()'s O(tenants) reads, at most COUNTED_TENANTS, else one ZRANK and one
-- ZCARD per tenant listed; the times ride in the members); holders
-- O(holders) (read, and sorted: holders are bounded by max_concurrent; their tenants and times
-- ride in the members, except in members of an earlier format: one HMGET of ptenant per 500 of
-- those).
local cfg = load_cfg()
if not cfg then return {'lost'} end
local now = now_ms()
local offset, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local in_use = redis.call('ZLEXCOUNT', K_HOLDERS, '(' .. HOLDERS_MARK, '+')  -- the permits, not the mark
local queued = redis.call('ZCARD', K_QUEUE)

local holders = {}
if limit > 0 and offset < in_use then
  local members = redis.call('ZRANGE', K_HOLDERS, '(' .. HOLDERS_MARK, '+', 'BYLEX')
  local all, earlier = {}, {}
  for i, m in ipairs(members) do
    local id, granted, t = split_holder(m)
    all[i] = {id, t or '', granted, granted < 0 and math.huge or granted}
    if t == nil then earlier[#earlier + 1] = i end
  end
  -- Members of an earlier format: their tenants are in ptenant, 500 at a time.
  for s = 1, #earlier, 500 do
    local ids = {}
    for j = s, math.min(s + 499, #earlier) do ids[#ids + 1] = all[earlier[j]][1] end
    local tenants = redis.call('HMGET', K_PTENANT, unpack(ids))
    for j, t in ipairs(tenants) do
      if t then all[earlier[s + j - 1]][2] = t end
    end
  end
  table.sort(all, function(x, y)
    if x[4] ~= y[4] then return x[4] < y[4] end
    return x[1] < y[1]
  end)
  for i = offset + 1, math.min(offset + limit, #all) do
    holders[#holders + 1] = all[i][1]
    holders[#holders + 1] = all[i][2]
    holders[#holders + 1] = all[i][3]
  end
end

local waiters = {}
if limit > 0 and offset < queued then
  local page = redis.call('ZRANGE', K_QUEUE, offset, offset + limit - 1)
  local place = cfg.tmode and cfg.fair and places(queued)
  for i, m in ipairs(page) do
    local _, id, _, _, t, arrived = split_waiter(m)
    local position = offset + i
    if place then position = place(t, (redis.call('ZRANK', tq(t), m) or 0) + 1) end
    waiters[#waiters + 1] = id
    waiters[#waiters + 1] = t
    waiters[#waiters + 1] = arrived
    waiters[#waiters + 1] = position
  end
end

local instances = {}
local list = redis.call('ZRANGE', K_INSTANCES, 0, -1, 'WITHSCORES')
for i = 1, #list, 2 do
  if tonumber(list[i + 1]) > now then instances[#instances + 1] = list[i] end
end
return {'ok', now, in_use, queued, holders, waiters, instances}
