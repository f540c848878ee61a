-- lib.lua — shared by every limiter script; prepended to each at build time.
--
-- Keys (all of one limiter share the hash tag {L}, so Redis Cluster keeps them
-- on one shard):
--   KEYS[1] cfg        hash  max_concurrent, max_queue ('' = unbounded), enabled ('1'|'0'),
--                            when_disabled ('pass'|'reject'), max_wait_ms,
--                            tenant_fairness ('1'|'0'), max_per_tenant ('' = none)
--   KEYS[2] holders    zset  "inst|n" -> 0      (score 0: lex ranges find one instance's permits)
--   KEYS[3] queue      zset  waiter member -> sequence (the global FIFO; all waiters, every mode)
--                            member: "inst|n|deadline_ms" (tenant '' and weight 1), else
--                            "inst|n|deadline_ms|weight|tenant"
--   KEYS[4] seq        string INCR counter of arrivals
--   KEYS[5] instances  zset  instance id -> liveness deadline (ms, Redis time)
-- Keys built here from KEYS[1] (same prefix, same hash tag {L}) for tenants (F12):
--   ptenant   hash  permit id -> tenant, for permits of a non-empty tenant (every mode)
-- and, only while the config is tenant-aware (tenant_fairness = 1 or max_per_tenant set):
--   tq:<t>    zset  waiter member -> sequence: tenant t's FIFO
--   tready    zset  tenant -> score: the tenants that wait and are below their cap, in
--                   dispatch order (fairness: rotation ticket from trot; else the
--                   sequence of the tenant's oldest waiter = global FIFO skipping capped tenants)
--   tparked   set   tenants that wait but hold max_per_tenant permits (not in tready)
--   tholders  hash  tenant -> permits held
--   tcredit   hash  tenant -> grants left in its current turn (absent: a turn starts with
--                   the weight of its oldest waiter)
--   trot      string INCR rotation ticket
-- ARGV[1] is always the wake channel prefix; an instance's channel is ARGV[1] .. inst.
--
-- Invariants every script keeps:
--   I1 no overshoot: a holder is added only when ZCARD holders < max_concurrent
--      (or the limiter is disabled in pass-through mode, or an instance restores
--      permits it already held);
--   I2 FIFO: waiters are granted only from the head of the queue (lowest sequence);
--      a newcomer is granted at once only when the queue is empty;
--   I3 every script that can free room ends in dispatch(), so after any script
--      the queue is empty or there is no room;
--   I4 a waiter past its deadline, or whose instance is dead, is never granted;
--   tenant-aware: I2' FIFO within a tenant (grants only from the head of tq:<t>);
--   I3' after any script there is no room or tready is empty (every waiter's tenant
--   is parked); I6 a grant to tenant t happens only while tholders[t] < max_per_tenant
--   (while enabled); a tenant in tready gets a turn before any tenant behind it gets a
--   second one (no starvation). Every step is O(log n): no script scans the tenants
--   per grant (configure and reaping a dead instance do work proportional to what
--   they change).
--   time is Redis server time (TIME), never a client clock.
-- Instance ids match [A-Za-z0-9._-]+ (no '|', no glob characters).

local K_CFG, K_HOLDERS, K_QUEUE, K_SEQ, K_INSTANCES = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local WAKE_PREFIX = ARGV[1]
local BASE = string.sub(K_CFG, 1, -4)  -- "prefix:{L}:" (K_CFG ends in "cfg")
local K_PTENANT, K_TREADY, K_TPARKED = BASE .. 'ptenant', BASE .. 'tready', BASE .. 'tparked'
local K_THOLDERS, K_TCREDIT, K_TROT = BASE .. 'tholders', BASE .. 'tcredit', BASE .. 'trot'
local TENANT_KEYS = {K_TREADY, K_TPARKED, K_THOLDERS, K_TCREDIT, K_TROT}

local function tq(t) return BASE .. 'tq:' .. t end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- member -> inst, "inst|n", deadline, weight, tenant
local function split_waiter(member)
  local inst, n, deadline = string.match(member, '^([^|]+)|([^|]+)|(%d+)$')
  if inst then return inst, inst .. '|' .. n, tonumber(deadline), 1, '' end
  local inst2, n2, d2, w, t = string.match(member, '^([^|]+)|([^|]+)|(%d+)|(%d+)|(.*)$')
  return inst2, inst2 .. '|' .. n2, tonumber(d2), tonumber(w), t
end

local function make_member(id, deadline, weight, tenant)
  if tenant == '' and weight == 1 then return id .. '|' .. deadline end
  return id .. '|' .. deadline .. '|' .. weight .. '|' .. tenant
end

local function alive(inst, now)
  local deadline = redis.call('ZSCORE', K_INSTANCES, inst)
  return deadline ~= false and tonumber(deadline) > now
end

local function make_cfg(max_concurrent, enabled, when_disabled, max_queue, fairness, per_tenant)
  if not max_concurrent then return nil end
  local c = {
    max = tonumber(max_concurrent),
    enabled = enabled ~= '0',
    pass = when_disabled ~= 'reject',
    max_queue = tonumber(max_queue or ''),
    fair = fairness == '1',
    per_tenant = tonumber(per_tenant or ''),
  }
  c.tmode = c.fair or c.per_tenant ~= nil
  -- The per-tenant cap binds only while enabled (pass-through limits nothing).
  if c.enabled then c.cap = c.per_tenant end
  return c
end

local function load_cfg()
  local v = redis.call('HMGET', K_CFG, 'max_concurrent', 'enabled', 'when_disabled', 'max_queue',
                       'tenant_fairness', 'max_per_tenant')
  return make_cfg(v[1], v[2], v[3], v[4], v[5], v[6])
end

-- The config from an HGETALL reply (flat field/value list); nil if empty.
local function cfg_from_flat(flat)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return make_cfg(h.max_concurrent, h.enabled, h.when_disabled, h.max_queue, h.tenant_fairness,
                  h.max_per_tenant)
end

local function has_room(cfg, holders)
  if not cfg.enabled then return cfg.pass end
  return holders < cfg.max
end

local function held_by(t) return tonumber(redis.call('HGET', K_THOLDERS, t) or '0') end

-- Tenant t waits and is neither ready nor parked: into the rotation (at the
-- back) / FIFO order (by its oldest waiter), or parked when at its cap.
local function t_place(cfg, t)
  if cfg.cap and held_by(t) >= cfg.cap then
    redis.call('SADD', K_TPARKED, t)
    return
  end
  local score
  if cfg.fair then
    score = redis.call('INCR', K_TROT)
  else
    score = redis.call('ZRANGE', tq(t), 0, 0, 'WITHSCORES')[2]
  end
  redis.call('ZADD', K_TREADY, score, t)
end

local function t_enqueue(cfg, t, member, seq)
  redis.call('ZADD', tq(t), seq, member)
  if redis.call('ZCARD', tq(t)) == 1 then t_place(cfg, t) end
end

-- Takes waiter `member` out of tenant t's queue (cancel, reap).
local function t_remove(cfg, t, member)
  local key = tq(t)
  local head = redis.call('ZRANGE', key, 0, 0)[1]
  if redis.call('ZREM', key, member) == 0 then return end
  local left = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if not left[1] then
    redis.call('ZREM', K_TREADY, t)
    redis.call('SREM', K_TPARKED, t)
    redis.call('HDEL', K_TCREDIT, t)
  elseif head == member and not cfg.fair then
    redis.call('ZADD', K_TREADY, 'XX', left[2], t)  -- FIFO: ordered by its oldest waiter
  end
end

local function holder_add(cfg, id, t)
  redis.call('ZADD', K_HOLDERS, 0, id)
  if t ~= '' then redis.call('HSET', K_PTENANT, id, t) end
  if cfg.tmode then redis.call('HINCRBY', K_THOLDERS, t, 1) end
end

-- Removes permit `id` of tenant `t` (nil: look it up). A parked tenant that
-- frees a permit rejoins (at the back of the rotation). Returns 1, or 0 when
-- `id` held nothing.
local function holder_remove(cfg, id, t)
  if redis.call('ZREM', K_HOLDERS, id) == 0 then return 0 end
  if t == nil then t = redis.call('HGET', K_PTENANT, id) or '' end
  if t ~= '' then redis.call('HDEL', K_PTENANT, id) end
  if cfg and cfg.tmode then
    if redis.call('HINCRBY', K_THOLDERS, t, -1) <= 0 then redis.call('HDEL', K_THOLDERS, t) end
    if redis.call('SREM', K_TPARKED, t) == 1 then t_place(cfg, t) end
  end
  return 1
end

local function park(t)
  redis.call('ZREM', K_TREADY, t)
  redis.call('HDEL', K_TCREDIT, t)
  redis.call('SADD', K_TPARKED, t)
end

-- Tenant-aware dispatch: serve the head of the first tenant in tready.
local function dispatch_tenants(cfg, now, holders)
  local granted = 0
  while has_room(cfg, holders) do
    local t = redis.call('ZRANGE', K_TREADY, 0, 0)[1]
    if not t then break end
    local held = cfg.cap and held_by(t) or 0
    local key = tq(t)
    local head = redis.call('ZRANGE', key, 0, 0)[1]
    if not head then
      -- Cannot happen while the keys are whole; never loop on it.
      redis.call('ZREM', K_TREADY, t)
      redis.call('HDEL', K_TCREDIT, t)
    elseif cfg.cap and held >= cfg.cap then
      park(t)  -- its cap was lowered: skip it until one of its permits returns
    else
      redis.call('ZREM', key, head)
      redis.call('ZREM', K_QUEUE, head)
      local inst, id, deadline, weight = split_waiter(head)
      local ok = deadline > now and alive(inst, now)
      if ok then
        holder_add(cfg, id, t)
        redis.call('PUBLISH', WAKE_PREFIX .. inst, id)
        holders = holders + 1
        granted = granted + 1
        held = held + 1
      end
      local nxt = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      if not nxt[1] then
        redis.call('ZREM', K_TREADY, t)
        redis.call('HDEL', K_TCREDIT, t)
      elseif cfg.cap and held >= cfg.cap then
        park(t)
      elseif not cfg.fair then
        redis.call('ZADD', K_TREADY, nxt[2], t)
      elseif ok then
        -- A turn starts with the weight of the waiter served first in it.
        local credit = tonumber(redis.call('HGET', K_TCREDIT, t) or weight) - 1
        if credit <= 0 then
          redis.call('HDEL', K_TCREDIT, t)
          redis.call('ZADD', K_TREADY, redis.call('INCR', K_TROT), t)  -- to the back
        else
          redis.call('HSET', K_TCREDIT, t, credit)
        end
      end
    end
  end
  return granted, holders
end

-- Grants queue heads while there is room, publishing each grant to the one
-- instance that waits for it. Heads that expired or whose instance died are
-- dropped. Returns the number of grants and the number of holders after
-- (wrap the call in parentheses where only the first is wanted).
local function dispatch(cfg, now)
  if not cfg then return 0, redis.call('ZCARD', K_HOLDERS) end
  local holders = redis.call('ZCARD', K_HOLDERS)
  if cfg.tmode then return dispatch_tenants(cfg, now, holders) end
  local granted = 0
  while has_room(cfg, holders) do
    local head = redis.call('ZRANGE', K_QUEUE, 0, 0)[1]
    if not head then break end
    redis.call('ZREM', K_QUEUE, head)
    local inst, id, deadline, _, t = split_waiter(head)
    if deadline > now and alive(inst, now) then
      holder_add(cfg, id, t)
      redis.call('PUBLISH', WAKE_PREFIX .. inst, id)
      holders = holders + 1
      granted = granted + 1
    end
  end
  return granted, holders
end

-- Removes instances whose liveness ran out, with their permits and waiters
-- (and their tenants' counts). Returns the number of permits returned.
local function reap(now)
  local dead = redis.call('ZRANGEBYSCORE', K_INSTANCES, '-inf', now)
  if #dead == 0 then return 0 end
  local cfg = load_cfg()
  local returned = 0
  for _, inst in ipairs(dead) do
    local ids = redis.call('ZRANGEBYLEX', K_HOLDERS, '[' .. inst .. '|', '(' .. inst .. '}')
    for _, id in ipairs(ids) do returned = returned + holder_remove(cfg, id, nil) end
    local cursor = '0'
    repeat
      local page = redis.call('ZSCAN', K_QUEUE, cursor, 'MATCH', inst .. '|*', 'COUNT', 1000)
      cursor = page[1]
      for i = 1, #page[2], 2 do
        local member = page[2][i]
        redis.call('ZREM', K_QUEUE, member)
        if cfg and cfg.tmode then
          local _, _, _, _, t = split_waiter(member)
          t_remove(cfg, t, member)
        end
      end
    until cursor == '0'
    redis.call('ZREM', K_INSTANCES, inst)
  end
  return returned
end

-- After a config change that touches tenants (tenant_fairness, max_per_tenant,
-- enabled): rebuilds the tenant structures from what is there. Waiters keep
-- their sequence; the rotation restarts in order of each tenant's oldest waiter.
local function rebuild_tenants(old, cfg)
  local was = old and old.tmode
  local tenants = {}
  if was then
    for _, t in ipairs(redis.call('ZRANGE', K_TREADY, 0, -1)) do tenants[t] = true end
    for _, t in ipairs(redis.call('SMEMBERS', K_TPARKED)) do tenants[t] = true end
  end
  redis.call('DEL', K_TREADY, K_TPARKED, K_TCREDIT)
  if not cfg.tmode then
    for t in pairs(tenants) do redis.call('DEL', tq(t)) end
    redis.call('DEL', K_THOLDERS, K_TROT)
    return
  end
  if not was then
    -- Per-tenant queues and holder counts from the global queue and holders.
    redis.call('DEL', K_THOLDERS)
    local q = redis.call('ZRANGE', K_QUEUE, 0, -1, 'WITHSCORES')
    for i = 1, #q, 2 do
      local _, _, _, _, t = split_waiter(q[i])
      redis.call('ZADD', tq(t), q[i + 1], q[i])
      tenants[t] = true
    end
    for _, id in ipairs(redis.call('ZRANGE', K_HOLDERS, 0, -1)) do
      redis.call('HINCRBY', K_THOLDERS, redis.call('HGET', K_PTENANT, id) or '', 1)
    end
  end
  local order = {}
  for t in pairs(tenants) do
    local head = redis.call('ZRANGE', tq(t), 0, 0, 'WITHSCORES')
    if head[1] then order[#order + 1] = {tonumber(head[2]), t} end
  end
  table.sort(order, function(a, b) return a[1] < b[1] end)
  for _, e in ipairs(order) do t_place(cfg, e[2]) end
end
