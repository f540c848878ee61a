-- snapshot.lua — the cluster-wide status of the limiter (GET /v1/limiters/{name}, the dashboard,
-- fairgate top): the holders and the waiters of every instance, one page of each, with their
-- tenants and times, in one consistent read. Writes nothing.
-- KEYS: see lib.lua.  ARGV[2] offset, ARGV[3] limit (of each list; the caller bounds it).
-- Returns {'lost'} when the state is gone, else
--   {'ok', now_ms, in_use, queued, holders, waiters, instances}:
--   holders    flat (permit id, tenant, granted_ms) of holders offset+1 .. offset+limit, oldest
--              grant first (granted_ms -1 when unknown: listed last)
--   waiters    flat (member, arrived_ms, position) of waiters offset+1 .. offset+limit in queue
--              (arrival) order; position as acquire reports it (see position_of)
--   instances  the ids of the instances whose liveness runs
-- Cost: waiters O(log n + limit) (a ZRANGE by rank and one HMGET of the page; two ZRANKs per
-- listed waiter under tenant fairness); holders O(holders) (their times are read and sorted:
-- holders are bounded by max_concurrent).
local cfg = load_cfg()
if not cfg then return {'lost'} end
local now = now_ms()
local offset, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local in_use = redis.call('ZCARD', K_HOLDERS)
local queued = redis.call('ZCARD', K_QUEUE)

local holders = {}
if limit > 0 and offset < in_use then
  local ids = redis.call('ZRANGE', K_HOLDERS, 0, -1)
  local all = {}
  for s = 1, #ids, 500 do
    local fields = {}
    for i = s, math.min(s + 499, #ids) do
      fields[#fields + 1] = ids[i]
      fields[#fields + 1] = since_field(ids[i])
    end
    local v = redis.call('HMGET', K_PTENANT, unpack(fields))
    for j = 1, #v, 2 do
      local since = tonumber(v[j + 1] or '') or -1
      all[#all + 1] = {ids[s + (j - 1) / 2], v[j] or '', since, since < 0 and math.huge or since}
    end
  end
  table.sort(all, function(a, b)
    if a[4] ~= b[4] then return a[4] < b[4] end
    return a[1] < b[1]
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
  local fields = {}
  for i, m in ipairs(page) do
    local _, id = split_waiter(m)
    fields[i] = since_field(id)
  end
  local since = {}
  if #fields > 0 then since = redis.call('HMGET', K_PTENANT, unpack(fields)) end
  local fair = cfg.tmode and cfg.fair
  local tenants, turns = 0, {}
  if fair then tenants = redis.call('ZCARD', K_TREADY) + redis.call('SCARD', K_TPARKED) end
  for i, m in ipairs(page) do
    local position = offset + i
    if fair then
      local _, _, _, _, t = split_waiter(m)
      if turns[t] == nil then
        local r = redis.call('ZRANK', K_TREADY, t)
        turns[t] = r and r + 1 or tenants
      end
      local k = (redis.call('ZRANK', tq(t), m) or 0) + 1
      position = math.min((k - 1) * tenants + turns[t], queued)
    end
    waiters[#waiters + 1] = m
    waiters[#waiters + 1] = tonumber(since[i] or '') or -1
    waiters[#waiters + 1] = position
  end
end

local instances = {}
local list = redis.call('ZRANGE', K_INSTANCES, 0, -1, 'WITHSCORES')
for i = 1, #list, 2 do
  if tonumber(list[i + 1]) > now then instances[#instances + 1] = list[i] end
end
return {'ok', now, in_use, queued, holders, waiters, instances}
