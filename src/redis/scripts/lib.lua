-- lib.lua — shared by every limiter script; prepended to each at build time.
--
-- Keys (all of one limiter share the hash tag {L}, so Redis Cluster keeps them
-- on one shard):
--   KEYS[1] cfg        hash  settings: max_concurrent, max_queue ('' = unbounded), enabled ('1'|'0'),
--                            when_disabled ('pass'|'reject'), max_wait_ms, tenant_fairness ('1'|'0'),
--                            max_per_tenant ('' = none), reject_early ('1'|'0'), mode
--                            ('enforce'|'shadow': read by the instances only, docs/shadow.md); engine fields:
--                            epoch (the state's generation, see below), fence_until (ms: no grant
--                            before it); the pace (F7, core/service_pace.hpp): pace_gap (mean ms
--                            between two advances of the queue of a full limiter), pace_n (gaps
--                            measured), pace_last (ms of the last advance — a release that left
--                            every seat taken, or a waiter leaving while full; 0 when a release
--                            since left a seat free), pace_at (ms of the last gap); the seat
--                            pace (reject_early): seat_gap, seat_n, seat_last, seat_at, the same
--                            for releases only (a waiter leaving does not free a seat);
--                            source (the replication id of the Redis that made the last grants,
--                            see "Which Redis" below), fence_ms (the instances' recovery fence,
--                            written by their heartbeats: how long a switch fences the state),
--                            holders_mark ('1': holders keeps its mark, see KEYS[2]), holders_lost
--                            (how many times a script found holders deleted: holders_lost below),
--                            tenants_mark ('1': tholders keeps its mark, KEYS[10]), tenants_lost
--                            (how many times a tenant key was found deleted: repair_tenants)
--   KEYS[2] holders    zset  "inst|n|granted_ms|tenant" -> 0 (score 0: lex ranges find one
--                            instance's permits, "[inst|n|" one permit; the grant time and the
--                            tenant, '' for none, ride in the member; members written before
--                            them, "inst|n|granted_ms" and "inst|n", are still read, their tenant
--                            in ptenant)
--                            The member HOLDERS_MARK ('!': before every permit, in no instance's
--                            range) is there as long as the state is (cfg holders_mark = '1'):
--                            a holders key without it was deleted (evicted, DEL) with the permits
--                            in it, which may still run (holders_lost). Permits: ZCARD - 1.
--   KEYS[3] queue      zset  waiter member -> order score (the global FIFO; all waiters, every mode)
--                            member: "inst|n|deadline_ms:arrived_ms" (tenant '' and weight 1), else
--                            "inst|n|deadline_ms:arrived_ms|weight|tenant" (arrived_ms: Redis ms of
--                            its arrival, for the status ages; members written before it was
--                            there, "inst|n|deadline_ms[|weight|tenant]", are read as arrival unknown)
--   KEYS[4] seq        string INCR counter of arrivals (the order score of the next one)
--   KEYS[5] instances  zset  instance id -> liveness deadline (ms, Redis time); -1 while a dead
--                            instance is being reaped
--   KEYS[6] byinst     zset  every waiter member -> 0: lex ranges find one instance's waiters
--                            (reaping, cancel by request id, restore) without scanning the queue
-- The tenant keys (F12), declared too (KEYS[7..12]; Redis Cluster and its tooling see
-- every key a script touches):
--   KEYS[7] ptenant   hash  permit id "inst|n" -> tenant: written by earlier versions only, for the
--                   permits of a non-empty tenant; read for holder members without a tenant
--                   part, emptied by the heartbeat (ptenant_sweep) as those permits go
-- and, only while the config is tenant-aware (tenant_fairness = 1 or max_per_tenant set):
--   tq:<t>    zset  waiter member -> order score: tenant t's FIFO. The one key family that
--                   cannot be declared: which tenant's queue a grant reads is decided inside
--                   the script (the head of tready). Built from KEYS[1]'s prefix, so it has
--                   the same hash tag {L}: same slot, same node (docs/redis-cluster.md).
--   KEYS[8] tready    zset  tenant -> score: the tenants that wait and are below their cap, in
--                   dispatch order (fairness: rotation ticket from trot; else the
--                   order score of the tenant's oldest waiter = global FIFO skipping capped tenants)
--   KEYS[9] tparked   set   tenants that wait but hold max_per_tenant permits (not in tready)
--   KEYS[10] tholders hash  tenant -> permits held, and TENANTS_MARK -> 1 once a count was read
--                   (held_by): without it the hash was deleted, and is counted again
--   KEYS[11] tcredit  hash  tenant -> grants left in its current turn (absent: a turn starts with
--                   the weight of its oldest waiter)
--   KEYS[12] trot     string INCR rotation ticket (next_turn)
-- A tenant key deleted on its own (evicted, DEL) is found and every tenant key rebuilt from the
-- queue and the holders (repair_tenants); cfg tenants_mark, tenants_lost.
-- ARGV[1] is always the wake channel prefix; an instance's channel is ARGV[1] .. inst (same hash
-- tag: a shard channel of the limiter's slot, SPUBLISH, so on a Cluster the message stays on the
-- limiter's shard; standalone Redis 7 has SPUBLISH too). A wake message is a permit id
-- "inst|n" (granted), or "!cfg" (the settings changed: heartbeat now).
--
-- The state and its epoch (docs/design.md, "Recovery"): the state exists while cfg holds an
-- epoch. Only the heartbeat creates it (new limiter, or Redis lost it: FLUSHALL, a restart
-- without persistence, expiry), with epoch = Redis time in ms x 1000, which is also where the
-- arrival counter restarts: every order score of the new state is above every score of an
-- older one (fewer than 1,000 arrivals per ms), so waiters restored with their old score stay
-- ahead of arrivals made since, in their old order. A created state is fenced until fence_until,
-- so every instance that was alive has re-registered its permits before the count is trusted:
-- meanwhile a grant is made only in place of a permit released (fence_credit), never on top.
-- Every other script answers 'lost' (and changes nothing) when the state is gone.
--
-- Which Redis (docs/design.md, recovery rule 14): a state can also lose only its last writes —
-- a failover to a replica that had not received them, a restart from an RDB snapshot or an AOF
-- written once a second. A grant among them still runs on its instance while Redis no longer
-- counts it, and until that instance's next heartbeat finds it missing and restores it, Redis
-- would hand the seat out again. Such a Redis has a new replication id (master_replid: a promoted replica takes a new
-- one, and so does every restart). So before any grant a script compares it with cfg.source,
-- the id the state's grants were made on; when it differs, the state is fenced from that
-- moment for fence_ms, as a created one (only hand-offs, fence_credit, until every instance
-- has heartbeated and restored what it runs). Only a script about to grant asks (one INFO per
-- such script): a release with nobody waiting, an acquire that queues and an idle heartbeat
-- do not. And the first heartbeat of an instance whose connection was made anew (a restart or
-- a failover drops it) asks too: so the switch is fenced then, and a limiter idle through it
-- is not fenced at its first grant long after, when every instance has long restored.
--
-- Invariants every script keeps:
--   I1 no overshoot: a holder is added only when the permits (count_holders) < max_concurrent
--      and, while the state is fenced, only in place of a permit released during the fence (or
--      the limiter is disabled in pass-through mode, or an instance restores permits it already
--      holds);
--   I2 FIFO: waiters are granted only from the head of the queue (lowest order score);
--      a newcomer is granted at once only when the queue is empty;
--   I3 every script that can free room ends in dispatch(), so after any script
--      the queue is empty, or there is no room (while fenced: no released permit left;
--      the instances heartbeat when the fence ends);
--   I4 a waiter past its deadline, or whose instance is dead, is never granted;
--   I5 a waiter is in queue iff it is in byinst (q_add / q_remove);
--   tenant-aware: I2' FIFO within a tenant (grants only from the head of tq:<t>);
--   I3' after any script there is no room or tready is empty (every waiter's tenant
--   is parked); I6 a grant to tenant t happens only while tholders[t] < max_per_tenant
--   (while enabled); a tenant in tready gets a turn before any tenant behind it gets a
--   second one (no starvation). Every step is O(log n): no script scans the tenants or
--   the queue per grant (configure, restore and reaping a dead instance do work
--   proportional to what they change).
--   time is Redis server time (TIME), never a client clock.
-- Instance ids match [A-Za-z0-9._-]+ (no '|', no glob characters).

local K_CFG, K_HOLDERS, K_QUEUE, K_SEQ, K_INSTANCES, K_BYINST = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
    KEYS[5], KEYS[6]
local WAKE_PREFIX = ARGV[1]
local BASE = string.sub(K_CFG, 1, -4)  -- "prefix:{L}:" (K_CFG ends in "cfg")
local K_PTENANT, K_TREADY, K_TPARKED = KEYS[7], KEYS[8], KEYS[9]
local K_THOLDERS, K_TCREDIT, K_TROT = KEYS[10], KEYS[11], KEYS[12]
local TENANT_KEYS = {K_TREADY, K_TPARKED, K_THOLDERS, K_TCREDIT, K_TROT}
-- At most this many permits and waiters of dead instances are reaped per script call; the
-- rest on the next heartbeats (a dead instance's waiters are never granted meanwhile).
local REAP_BUDGET = 1000

local function tq(t) return BASE .. 'tq:' .. t end

-- Integers above 10^14 (epochs, order scores) must not go through Lua's "%.14g".
local function int(x) return string.format('%d', x) end

-- Redis time in ms, read once per script call (a script runs in an instant).
local NOW = nil
local function now_ms()
  if not NOW then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW
end

-- member -> inst, "inst|n", deadline, weight, tenant, arrived (Redis ms; -1 unknown)
local function split_waiter(member)
  local inst, n, deadline, arrived = string.match(member, '^([^|]+)|([^|]+)|(%d+):?(%d*)$')
  if inst then return inst, inst .. '|' .. n, tonumber(deadline), 1, '', tonumber(arrived) or -1 end
  local inst2, n2, d2, a2, w, t = string.match(member, '^([^|]+)|([^|]+)|(%d+):?(%d*)|(%d+)|(.*)$')
  return inst2, inst2 .. '|' .. n2, tonumber(d2), tonumber(w), t, tonumber(a2) or -1
end

local function make_member(id, deadline, arrived, weight, tenant)
  local head = id .. '|' .. int(deadline) .. ':' .. int(arrived)
  if tenant == '' and weight == 1 then return head end
  return head .. '|' .. weight .. '|' .. tenant
end

-- The waiters of one instance, or of one request "inst|n", are one lex range of byinst.
local function range_of(prefix) return '[' .. prefix .. '|', '(' .. prefix .. '}' end

local function find_waiter(id)
  local lo, hi = range_of(id)
  return redis.call('ZRANGEBYLEX', K_BYINST, lo, hi, 'LIMIT', 0, 1)[1]
end

-- A holder member "inst|n|granted_ms|tenant" -> "inst|n", granted_ms, tenant. Members written
-- before the tenant rode in them, "inst|n|granted_ms", and before the grant time did, "inst|n"
-- (granted_ms -1), give tenant nil: theirs, if any, is in ptenant (holder_tenant).
local function split_holder(member)
  local id, granted, t = string.match(member, '^([^|]+|[^|]+)|(%d+)|(.*)$')
  if id then return id, tonumber(granted), t end
  id, granted = string.match(member, '^([^|]+|[^|]+)|(%d+)$')
  if id then return id, tonumber(granted), nil end
  return member, -1, nil
end

-- The tenant ('' for none) of holder `id`, given the tenant its member gave (nil: an earlier
-- member, look in ptenant).
local function holder_tenant(id, t)
  if t == nil then t = redis.call('HGET', K_PTENANT, id) or '' end
  return t
end

-- The holder member "id|…" of permit `id`, or nil (none, or one of the form "inst|n").
local function holder_member(id)
  local lo, hi = range_of(id)
  return redis.call('ZRANGEBYLEX', K_HOLDERS, lo, hi, 'LIMIT', 0, 1)[1]
end

-- The tenant of permit `id` ('' for none, or when it holds nothing), read from its member.
local function tenant_of_permit(id)
  local member = holder_member(id)
  return holder_tenant(id, member and select(3, split_holder(member)))
end

-- Earlier versions kept a permit's tenant in ptenant. Drops the entries of permits no longer
-- held in an earlier form (released, or held again under a member of today's form); the key
-- goes with its last entry. Called by the heartbeat, only while ptenant exists.
local function ptenant_sweep()
  for _, id in ipairs(redis.call('HKEYS', K_PTENANT)) do
    if redis.call('ZSCORE', K_HOLDERS, id) == false then
      local member = holder_member(id)
      if member == nil or select(3, split_holder(member)) ~= nil then redis.call('HDEL', K_PTENANT, id) end
    end
  end
end

-- The permit ids of a list of holder members.
local function holder_ids(members)
  for i, m in ipairs(members) do members[i] = (split_holder(m)) end
  return members
end

-- Does request `id` ("inst|n") hold a permit? (Its holder member is "id|granted_ms|tenant".)
local function holds(id)
  local lo, hi = range_of(id)
  return redis.call('ZLEXCOUNT', K_HOLDERS, lo, hi) > 0 or redis.call('ZSCORE', K_HOLDERS, id) ~= false
end

-- The order score of a new arrival. The counter is above the epoch while it is whole (the
-- state starts it there); below, the seq key was deleted (evicted, DEL) and would restart at 1,
-- ahead of every waiter: it goes on above the epoch and the queue's last score instead.
-- Moves the arrival counter up to `floor` if it stands below (never down): a state created at
-- an epoch, or a Redis that lost increments (fence_state, restore.lua).
local function seq_at_least(floor)
  if tonumber(redis.call('GET', K_SEQ) or '0') < floor then redis.call('SET', K_SEQ, int(floor)) end
end

local function next_order(cfg)
  local order = redis.call('INCR', K_SEQ)
  if order > cfg.epoch then return order end
  local last = redis.call('ZRANGE', K_QUEUE, -1, -1, 'WITHSCORES')[2]
  order = math.max(cfg.epoch, tonumber(last or '0')) + 1
  redis.call('SET', K_SEQ, int(order))
  return order
end

local function q_add(member, score)
  redis.call('ZADD', K_QUEUE, int(score), member)
  redis.call('ZADD', K_BYINST, 0, member)
end

local function q_remove(member)
  local indexed = redis.call('ZREM', K_BYINST, member)
  -- In byinst alone it was waiting too: the queue key was deleted under it (rule 15).
  return math.max(indexed, redis.call('ZREM', K_QUEUE, member))
end

-- Takes the head of `key` (the queue, or a tenant's queue) out of it: the
-- member and its score, or nil when it is empty. One ZPOPMIN instead of a ZRANGE and a ZREM.
local function pop_head(key)
  local r = redis.call('ZPOPMIN', key)
  return r[1], r[2]
end

-- True when no instance's liveness runs past `now`: nobody reached Redis for a whole TTL, so
-- Redis itself was away (stopped, restarted with its data, unreachable): not a crash of all.
local function redis_was_away(now)
  local top = redis.call('ZRANGE', K_INSTANCES, -1, -1, 'WITHSCORES')
  return top[2] == nil or tonumber(top[2]) <= now
end

-- Registered in the current state and not being reaped.
local function registered(inst)
  local d = redis.call('ZSCORE', K_INSTANCES, inst)
  return d ~= false and tonumber(d) >= 0
end

-- May a waiter of `inst` be granted? Its liveness runs, or every liveness ran out together
-- (Redis was away: the first heartbeat after it extends them all).
local function alive(inst, now)
  local d = redis.call('ZSCORE', K_INSTANCES, inst)
  if d == false then return false end
  d = tonumber(d)
  if d > now then return true end
  if d < 0 then return false end
  return redis_was_away(now)
end

-- The member that marks a whole holders key (see KEYS[2] above).
local HOLDERS_MARK = '!'

local function make_cfg(h)
  if not h.epoch or not h.max_concurrent then return nil end
  local c = {
    max = tonumber(h.max_concurrent),
    enabled = h.enabled ~= '0',
    pass = h.when_disabled ~= 'reject',
    max_queue = tonumber(h.max_queue or ''),
    fair = h.tenant_fairness == '1',
    per_tenant = tonumber(h.max_per_tenant or ''),
    epoch = tonumber(h.epoch),
    fence = tonumber(h.fence_until or '0') or 0,
    credit = tonumber(h.fence_credit or '0') or 0,
    reject_early = h.reject_early == '1',
    source = h.source,
    fence_ms = tonumber(h.fence_ms or '0') or 0,
    marked = h.holders_mark == '1',
    tenants_marked = h.tenants_mark == '1',
    pace = {gap = tonumber(h.pace_gap or '0') or 0, n = tonumber(h.pace_n or '0') or 0,
            last = tonumber(h.pace_last or '0') or 0, at = tonumber(h.pace_at or '0') or 0},
    seat = {gap = tonumber(h.seat_gap or '0') or 0, n = tonumber(h.seat_n or '0') or 0,
            last = tonumber(h.seat_last or '0') or 0, at = tonumber(h.seat_at or '0') or 0},
  }
  c.tmode = c.fair or c.per_tenant ~= nil
  -- The per-tenant cap binds only while enabled (pass-through limits nothing).
  if c.enabled then c.cap = c.per_tenant end
  return c
end

local CFG_FIELDS = {'max_concurrent', 'enabled', 'when_disabled', 'max_queue', 'tenant_fairness',
                    'max_per_tenant', 'epoch', 'fence_until', 'fence_credit', 'reject_early',
                    'pace_gap', 'pace_n', 'pace_last', 'pace_at', 'seat_gap', 'seat_n', 'seat_last', 'seat_at',
                    'source', 'fence_ms', 'holders_mark', 'tenants_mark'}

-- The limiter's config and engine fields; nil when the state is gone.
local function load_cfg()
  local v = redis.call('HMGET', K_CFG, unpack(CFG_FIELDS))
  local h = {}
  for i, f in ipairs(CFG_FIELDS) do if v[i] then h[f] = v[i] end end
  return make_cfg(h)
end

-- The wait estimate (F7), as core/service_pace.hpp computes it (same constants, same formula):
-- a release that leaves every seat taken starts a gap; the next release ends it.
local PACE_MIN, PACE_WARM, PACE_WEIGHT, PACE_STALE_MS, PACE_MAX = 3, 8, 0.125, 600000, 1000000
local REJECT_EARLY_MARGIN_MS = 100

-- One pace (`p`, named `prefix` in cfg) after a release at `now`: appends what changed to `fields`.
local function pace_release_fields(p, prefix, now, full_after, fields)
  if p.last > 0 then
    local gap = math.max(0, now - p.last)
    if p.n == 0 then
      p.gap = gap
    else
      local w = PACE_WEIGHT
      if p.n < PACE_WARM then w = 1 / (p.n + 1) end
      p.gap = p.gap + w * (gap - p.gap)
    end
    p.n = math.min(p.n + 1, PACE_MAX)
    p.at = now
    for _, v in ipairs({prefix .. '_gap', string.format('%.3f', p.gap), prefix .. '_n', int(p.n),
                        prefix .. '_at', int(now)}) do
      fields[#fields + 1] = v
    end
  end
  local last = full_after and now or 0
  if last ~= p.last then
    p.last = last
    fields[#fields + 1] = prefix .. '_last'
    fields[#fields + 1] = int(last)
  end
end

-- A seat was released at `now`; `full_after`: every seat is taken again. One HSET at most
-- (the queue pace and the seat pace together).
local function pace_on_release(cfg, now, full_after)
  local fields = {}
  pace_release_fields(cfg.pace, 'pace', now, full_after, fields)
  pace_release_fields(cfg.seat, 'seat', now, full_after, fields)
  if #fields > 0 then redis.call('HSET', K_CFG, unpack(fields)) end
end

-- A waiter left the queue without a seat (timeout, cancel): one more advance of a full limiter.
local function pace_on_departure(cfg, now)
  local p = cfg.pace
  if p.last <= 0 then return end
  local gap = math.max(0, now - p.last)
  local w = PACE_WEIGHT
  if p.n < PACE_WARM then w = 1 / (p.n + 1) end
  if p.n == 0 then p.gap = gap else p.gap = p.gap + w * (gap - p.gap) end
  p.n = math.min(p.n + 1, PACE_MAX)
  p.at, p.last = now, now
  redis.call('HSET', K_CFG, 'pace_gap', string.format('%.3f', p.gap), 'pace_n', int(p.n), 'pace_at', int(now),
             'pace_last', int(now))
end

-- Estimated wait in ms of the waiter at `position`, or -1 without (recent) history.
local function pace_estimate(cfg, now, position)
  local p = cfg.pace
  if p.n < PACE_MIN or position < 1 or now - p.at > PACE_STALE_MS then return -1 end
  local e = 0
  if p.last > 0 then e = math.max(0, now - p.last) end
  local nxt = math.max(p.gap - e, p.gap / 2)
  return math.floor((position - 1) * p.gap + nxt + 0.5)
end

-- reject_early: does an estimate of `est` ms exceed a max wait of `max_wait` ms by the margin?
local function would_time_out(est, max_wait)
  return est > max_wait + math.max(REJECT_EARLY_MARGIN_MS, math.floor(max_wait / 4))
end

-- reject_early in one FIFO (core/service_pace.hpp, wait_behind): the wait of a newcomer behind
-- the queue if seats free at the seat pace and each waiter ahead takes the next seat unless its
-- deadline comes first. Reads the queue 100 at a time and stops once past `limit` ms. nil
-- without a (recent) seat pace.
local function wait_behind(cfg, now, limit)
  local s = cfg.seat
  if s.n < PACE_MIN or s.gap <= 0 or now - s.at > PACE_STALE_MS then return nil end
  local e = 0
  if s.last > 0 then e = math.max(0, now - s.last) end
  local seat = math.max(s.gap - e, s.gap / 2)
  local start = 0
  while seat <= limit do
    local chunk = redis.call('ZRANGE', K_QUEUE, start, start + 99)
    for _, m in ipairs(chunk) do
      if seat > limit then break end
      local _, _, deadline = split_waiter(m)
      if deadline - now >= seat then seat = seat + s.gap end
    end
    if #chunk < 100 then break end
    start = start + 100
  end
  return seat
end

-- A flat field/value list (HGETALL) as a table.
local function hash_of(flat)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return h
end

-- While fenced, the holders Redis counts may be fewer than those running (not
-- every instance has restored yet): a grant is made only in place of a permit
-- released meanwhile (fence_credit), so the true count never grows (I1).
local function fenced(cfg, now) return cfg.fence > now end

-- Room for one more grant now (I1).
local function has_room(cfg, holders, now)
  if not cfg.enabled then return cfg.pass end
  if holders >= cfg.max then return false end
  return not fenced(cfg, now) or cfg.credit > 0
end

-- This Redis' replication id (master_replid), or nil when INFO is not allowed (an ACL
-- without it: then no switch is ever seen, as before).
local function replication_id()
  local ok, info = pcall(redis.call, 'INFO', 'replication')
  if not ok or type(info) ~= 'string' then return nil end
  return string.match(info, 'master_replid:(%x+)')
end

-- Fences the state from `now` for `ms` (only hand-offs, fence_credit, meanwhile) on this
-- Redis (replication id `id`, nil: ask): the fence covers a switch to it as well, so the next
-- grant's check does not fence it a second time.
--
-- Such a Redis may also have lost increments of the arrival counter: it can stand below the order
-- scores of waiters the instances still have and are about to restore, and an arrival would then
-- queue ahead of them. It is moved past every order score given before `now` (orders start at an
-- epoch of Redis ms x 1000 and grow by one an arrival), so restored waiters keep their place.
local function fence_state(cfg, now, ms, id)
  cfg.fence, cfg.credit = math.max(cfg.fence, now + ms), 0
  cfg.source = id or replication_id() or cfg.source
  redis.call('HSET', K_CFG, 'fence_until', int(cfg.fence), 'fence_credit', 0, 'source', cfg.source or '')
  seq_at_least(now * 1000)
end

-- Before a grant: fences the state if this is not the Redis its grants were made on (see
-- "Which Redis" above); true when it did. Asks once per script.
local function check_source(cfg, now)
  if cfg.source_checked then return false end
  cfg.source_checked = true
  local id = replication_id()
  if id == nil or id == cfg.source then return false end
  if cfg.fence_ms > 0 then
    fence_state(cfg, now, cfg.fence_ms, id)
    return true
  end
  cfg.source = id
  redis.call('HSET', K_CFG, 'source', id)
  return false
end

-- Room for a grant about to be made now: has_room, on the Redis the count was made on.
local function room_to_grant(cfg, holders, now)
  if not has_room(cfg, holders, now) then return false end
  if not cfg.enabled then return true end  -- pass-through: no cap to keep
  return not check_source(cfg, now) or has_room(cfg, holders, now)
end

-- A grant was made: while fenced it uses up one released permit.
local function took_room(cfg, now)
  if cfg.enabled and fenced(cfg, now) then
    cfg.credit = cfg.credit - 1
    redis.call('HINCRBY', K_CFG, 'fence_credit', -1)
  end
end

-- The field that marks a whole tholders hash (while tenant-aware): no tenant has a space in
-- its name. A tholders hash without it was deleted (evicted, DEL) or written by an earlier
-- version: its counts are not trusted but recounted from holders.
local TENANTS_MARK = '* mark'

-- Counts tholders afresh from the holders (O(permits)), with its mark. `lost`: the mark was
-- missing from a marked state (cfg tenants_lost counts it; see repair_tenants).
local function count_tenants(cfg, lost)
  redis.call('DEL', K_THOLDERS)
  for _, member in ipairs(redis.call('ZRANGE', K_HOLDERS, 0, -1)) do
    if member ~= HOLDERS_MARK then
      local id, _, t = split_holder(member)
      redis.call('HINCRBY', K_THOLDERS, holder_tenant(id, t), 1)
    end
  end
  redis.call('HSET', K_THOLDERS, TENANTS_MARK, 1)
  if lost and cfg.tenants_marked then redis.call('HINCRBY', K_CFG, 'tenants_lost', 1) end
  if not cfg.tenants_marked then
    cfg.tenants_marked = true
    redis.call('HSET', K_CFG, 'tenants_mark', '1')
  end
end

-- Permits tenant t holds (I6's count), checking tholders' mark in the same command.
local function held_by(cfg, t)
  local v = redis.call('HMGET', K_THOLDERS, t, TENANTS_MARK)
  if v[2] then return tonumber(v[1] or '0') end
  count_tenants(cfg, true)
  return tonumber(redis.call('HGET', K_THOLDERS, t) or '0')
end

-- The next rotation ticket. INCR gives 1 when trot was absent: a new rotation, or the key was
-- deleted (evicted, DEL) while tenants wait with higher tickets, who would then wait behind every
-- turn until the counter caught up: it goes on above the last of them instead.
local function next_turn()
  local turn = redis.call('INCR', K_TROT)
  if turn > 1 then return turn end
  local last = tonumber(redis.call('ZRANGE', K_TREADY, -1, -1, 'WITHSCORES')[2] or '0')
  if last >= turn then
    turn = math.floor(last) + 1
    redis.call('SET', K_TROT, int(turn))
  end
  return turn
end

-- Tenant t waits and is neither ready nor parked: into the rotation (at the
-- back) / FIFO order (by its oldest waiter), or parked when at its cap.
local function t_place(cfg, t)
  if cfg.cap and held_by(cfg, t) >= cfg.cap then
    redis.call('SADD', K_TPARKED, t)
    return
  end
  local score
  if cfg.fair then
    score = next_turn()
  else
    score = redis.call('ZRANGE', tq(t), 0, 0, 'WITHSCORES')[2]
    -- Its queue is gone (deleted on its own): nothing to place; its waiters are found stranded
    -- by the next heartbeat or arrival with room (repair_tenants).
    if not score then return end
  end
  redis.call('ZADD', K_TREADY, score, t)
end

local function t_enqueue(cfg, t, member, score)
  redis.call('ZADD', tq(t), int(score), member)
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

-- Removes waiter `member` from the queue and, tenant-aware, from its tenant's queue.
-- Returns 1, or 0 when it was not waiting.
local function waiter_remove(cfg, member)
  if q_remove(member) == 0 then return 0 end
  local _, _, _, _, t = split_waiter(member)
  if cfg and cfg.tmode then
    t_remove(cfg, t, member)
  end
  return 1
end

-- The holders key of a marked state lost its mark: it was deleted (an evicting maxmemory-policy,
-- a DEL) with the permits in it, and those still run on their instances. Fences the state as a
-- created one (only hand-offs until every instance has heartbeated and restored what it holds,
-- restore.lua); the caller has put the mark back. Counted in cfg holders_lost.
local function holders_lost(cfg, now)
  redis.call('HINCRBY', K_CFG, 'holders_lost', 1)
  if cfg.fence_ms > 0 then fence_state(cfg, now, cfg.fence_ms) end
end

-- A state of an earlier version has no mark: mark it (once).
local function mark_holders(cfg)
  cfg.marked = true
  redis.call('HSET', K_CFG, 'holders_mark', '1')
end

-- The permits Redis counts (I1's count), checking the mark for free: a marked holders key is
-- never empty.
local function count_holders(cfg, now)
  local n = redis.call('ZCARD', K_HOLDERS)
  if cfg.marked and n > 0 then return n - 1 end
  redis.call('ZADD', K_HOLDERS, 0, HOLDERS_MARK)
  if cfg.marked then holders_lost(cfg, now) else mark_holders(cfg) end
  return n
end

-- Makes `id` a holder of tenant `t`, granted now, or at `granted` (Redis ms: a restored permit);
-- the time and the tenant ride in its holder member. The same ZADD keeps the mark: when it adds
-- the mark too, the key had lost it.
local function holder_add(cfg, id, t, granted)
  local added = redis.call('ZADD', K_HOLDERS, 0, id .. '|' .. int(granted or now_ms()) .. '|' .. t, 0,
                           HOLDERS_MARK)
  if cfg and added > 1 then
    if cfg.marked then holders_lost(cfg, now_ms()) else mark_holders(cfg) end
  end
  if cfg and cfg.tmode then redis.call('HINCRBY', K_THOLDERS, t, 1) end
end

local repair_tenants  -- below: holder_remove finds a parked tenant lost

-- Removes permit `id` of tenant `t` (nil: read it from the member, needed only for the
-- tenant counts). A parked tenant that frees a permit rejoins (at the back of the rotation).
-- Returns 1, or 0 when `id` held nothing.
local function holder_remove(cfg, id, t)
  local tmode = cfg and cfg.tmode
  if tmode and t == nil then t = tenant_of_permit(id) end  -- before its member goes
  local lo, hi = range_of(id)
  if redis.call('ZREMRANGEBYLEX', K_HOLDERS, lo, hi) == 0 and redis.call('ZREM', K_HOLDERS, id) == 0 then
    return 0
  end
  if cfg and cfg.fence > 0 and fenced(cfg, now_ms()) then
    cfg.credit = cfg.credit + 1
    redis.call('HINCRBY', K_CFG, 'fence_credit', 1)
  end
  if tmode then
    local left = redis.call('HINCRBY', K_THOLDERS, t, -1)
    if left <= 0 then redis.call('HDEL', K_THOLDERS, t) end
    if redis.call('SREM', K_TPARKED, t) == 1 then
      t_place(cfg, t)
    elseif cfg.cap and left >= cfg.cap - 1 and redis.call('ZCARD', tq(t)) > 0 and
        redis.call('ZSCORE', K_TREADY, t) == false then
      -- At its cap with waiters, so parked (I3'), yet not in tparked: that key was deleted.
      repair_tenants(cfg)
    end
  end
  return 1
end

local function park(t)
  redis.call('ZREM', K_TREADY, t)
  redis.call('HDEL', K_TCREDIT, t)
  redis.call('SADD', K_TPARKED, t)
end

-- After a config change that touches tenants (tenant_fairness, max_per_tenant,
-- enabled): rebuilds the tenant structures from what is there. Waiters keep
-- their order score; the rotation restarts in order of each tenant's oldest waiter.
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
    local q = redis.call('ZRANGE', K_QUEUE, 0, -1, 'WITHSCORES')
    for i = 1, #q, 2 do
      local _, _, _, _, t = split_waiter(q[i])
      redis.call('ZADD', tq(t), q[i + 1], q[i])
      tenants[t] = true
    end
    count_tenants(cfg, false)
  end
  local order = {}
  for t in pairs(tenants) do
    local head = redis.call('ZRANGE', tq(t), 0, 0, 'WITHSCORES')
    if head[1] then order[#order + 1] = {tonumber(head[2]), t} end
  end
  table.sort(order, function(a, b) return a[1] < b[1] end)
  for _, e in ipairs(order) do t_place(cfg, e[2]) end
end

-- A tenant key deleted on its own (an evicting maxmemory-policy, a DEL: recovery rule 15 in
-- docs/design.md) — a tenant's queue, tready or tparked — strands waiters: in the queue, but no
-- tenant of theirs is ready. Found where a tenant in tready has an empty queue (dispatch_tenants),
-- where a tenant at its cap with waiters releases and was not parked (holder_remove), and by a
-- heartbeat or an arrival that sees room and a queue the parked tenants' queues do not hold
-- (tenants_whole, I3'). Rebuilds every tenant key from the queue and the holders
-- (O(waiters + permits)), once per script; counted in cfg tenants_lost. True when it did.
function repair_tenants(cfg)
  if cfg.repaired then return false end
  cfg.repaired = true
  redis.call('HINCRBY', K_CFG, 'tenants_lost', 1)
  local tenants = {}
  for _, t in ipairs(redis.call('ZRANGE', K_TREADY, 0, -1)) do tenants[t] = true end
  for _, t in ipairs(redis.call('SMEMBERS', K_TPARKED)) do tenants[t] = true end
  for _, member in ipairs(redis.call('ZRANGE', K_QUEUE, 0, -1)) do
    local _, _, _, _, t = split_waiter(member)
    tenants[t] = true
  end
  for t in pairs(tenants) do redis.call('DEL', tq(t)) end
  rebuild_tenants(nil, cfg)
  return true
end

-- After a dispatch with room, every waiting tenant is parked (I3'): the parked tenants' queues
-- hold the whole queue, `queued` waiters (1 + one ZCARD per parked tenant, at most
-- max_concurrent: each holds a permit). False when a tenant key was deleted and stranded some.
local function tenants_whole(queued)
  local parked = 0
  for _, t in ipairs(redis.call('SMEMBERS', K_TPARKED)) do parked = parked + redis.call('ZCARD', tq(t)) end
  return parked == queued
end

-- Tenant-aware dispatch: serve the head of the first tenant in tready.
local function dispatch_tenants(cfg, now, holders)
  local granted = 0
  while has_room(cfg, holders, now) do
    local t = redis.call('ZRANGE', K_TREADY, 0, 0)[1]
    if not t then break end
    local held = cfg.cap and held_by(cfg, t) or 0
    local key = tq(t)
    local head, score = nil, nil
    if cfg.cap and held >= cfg.cap then
      park(t)  -- its cap was lowered: skip it until one of its permits returns
    else
      head, score = pop_head(key)
      if not head and not repair_tenants(cfg) then
        -- Cannot happen while the keys are whole (its queue was deleted: repaired above, once
        -- per script); never loop on it.
        redis.call('ZREM', K_TREADY, t)
        redis.call('HDEL', K_TCREDIT, t)
      end
    end
    if head then
      -- Not waiting any more (left while a key of the state was deleted, rule 15): skipped.
      local waiting = q_remove(head) == 1
      local inst, id, deadline, weight = split_waiter(head)
      local ok = waiting and deadline > now and alive(inst, now)
      if ok and not room_to_grant(cfg, holders, now) then
        -- Fenced this moment (another Redis): back where it was, in both queues.
        redis.call('ZADD', key, score, head)
        q_add(head, score)
        break
      end
      if ok then
        holder_add(cfg, id, t)
        took_room(cfg, now)
        redis.call('SPUBLISH', WAKE_PREFIX .. inst, id)
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
          redis.call('ZADD', K_TREADY, next_turn(), t)  -- to the back
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
  if not cfg then return 0, 0 end  -- the state is gone: nothing to grant (its callers ignore the count)
  local holders = count_holders(cfg, now)
  if cfg.tmode then return dispatch_tenants(cfg, now, holders) end
  local granted = 0
  while has_room(cfg, holders, now) do
    local head, score = pop_head(K_QUEUE)
    if not head then break end
    local inst, id, deadline, _, t = split_waiter(head)
    local ok = deadline > now and alive(inst, now)
    if ok and not room_to_grant(cfg, holders, now) then
      redis.call('ZADD', K_QUEUE, score, head)  -- fenced this moment (another Redis): back in place
      break
    end
    redis.call('ZREM', K_BYINST, head)  -- I5: out of byinst as it is out of the queue
    if ok then
      holder_add(cfg, id, t)
      took_room(cfg, now)
      redis.call('SPUBLISH', WAKE_PREFIX .. inst, id)
      holders = holders + 1
      granted = granted + 1
    end
  end
  return granted, holders
end

-- Removes up to `budget` permits and waiters of instance `inst` (they go with
-- it). Returns permits returned, members removed, and whether none is left.
local function purge(cfg, inst, budget)
  local lo, hi = range_of(inst)
  local returned, removed = 0, 0
  local ids = redis.call('ZRANGEBYLEX', K_HOLDERS, lo, hi, 'LIMIT', 0, budget)
  for _, member in ipairs(ids) do
    local id, _, t = split_holder(member)  -- t nil for an earlier member: holder_remove reads ptenant
    returned = returned + holder_remove(cfg, id, t)
  end
  local left = budget - #ids
  local members = {}
  if left > 0 then members = redis.call('ZRANGEBYLEX', K_BYINST, lo, hi, 'LIMIT', 0, left) end
  for _, member in ipairs(members) do removed = removed + waiter_remove(cfg, member) end
  return returned, #ids + #members, (#ids < budget and #members < left)
end

-- Reaps instance `inst` (dead, or leaving: leave.lua) within `budget`: marked as being reaped
-- (score -1: never alive again, nothing granted to it), purged, and out of instances once none
-- of it is left (`marked`: it was already, a reap went on from an earlier call). Returns what
-- purge() does.
local function reap_instance(cfg, inst, budget, marked)
  if not marked then redis.call('ZADD', K_INSTANCES, -1, inst) end
  local returned, used, done = purge(cfg, inst, budget)
  if done then redis.call('ZREM', K_INSTANCES, inst) end
  return returned, used, done
end

-- Reaps the instances whose liveness ran out (listed in `list`, a ZRANGE
-- instances WITHSCORES reply), never `self`: their permits return and their
-- waiters leave (with their tenants' counts). Work is bounded by REAP_BUDGET;
-- an instance not yet done stays with score -1 and goes on at the next call.
-- With `only_tombstones`, only those already started. Returns permits returned.
local function reap(now, self, list, only_tombstones)
  local budget = REAP_BUDGET
  local cfg = nil
  local returned = 0
  for i = 1, #list, 2 do
    local inst, deadline = list[i], tonumber(list[i + 1])
    if inst ~= self and deadline <= now and (deadline < 0 or not only_tombstones) then
      if budget <= 0 then break end
      cfg = cfg or load_cfg()
      local r, used = reap_instance(cfg, inst, budget, deadline < 0)
      returned = returned + r
      budget = budget - used
    end
  end
  return returned
end

-- Removes every waiter (disabled in reject mode: their instances end them with
-- 'disabled' when they see the config). O(tenants) plus the queue's deletion.
local function clear_waiters(cfg)
  if cfg.tmode then
    local tenants = redis.call('ZRANGE', K_TREADY, 0, -1)
    for _, t in ipairs(redis.call('SMEMBERS', K_TPARKED)) do tenants[#tenants + 1] = t end
    for _, t in ipairs(tenants) do redis.call('DEL', tq(t)) end
    redis.call('DEL', K_TREADY, K_TPARKED, K_TCREDIT)
  end
  redis.call('DEL', K_QUEUE, K_BYINST)
end

-- Tells every registered instance to heartbeat now (its settings changed).
local function notify_instances()
  local list = redis.call('ZRANGE', K_INSTANCES, 0, -1, 'WITHSCORES')
  for i = 1, #list, 2 do
    if tonumber(list[i + 1]) >= 0 then redis.call('SPUBLISH', WAKE_PREFIX .. list[i], '!cfg') end
  end
end

-- Positions under tenant fairness (F12), as core::LimiterState::position(): the tenants that
-- wait in rotation order (tready, then tparked by their oldest waiter: they rejoin at the
-- back) and their queue lengths; the k-th waiter of tenant t comes after every tenant's first
-- k-1 waiters (all of a shorter queue) and the k-th of each tenant ahead of t — the order of
-- service with weights 1, no cap binding and nobody arriving meanwhile. rotation() reads
-- O(tenants) keys once; the place(t, k) it returns costs no command, and O(tenants) Lua steps.
-- Callers go through places() below, which reads it only up to COUNTED_TENANTS tenants.
local function rotation()
  local order = redis.call('ZRANGE', K_TREADY, 0, -1)
  local parked, oldest = redis.call('SMEMBERS', K_TPARKED), {}
  for _, t in ipairs(parked) do
    oldest[t] = tonumber(redis.call('ZRANGE', tq(t), 0, 0, 'WITHSCORES')[2] or '0')
  end
  table.sort(parked, function(a, b) return oldest[a] < oldest[b] end)
  for _, t in ipairs(parked) do order[#order + 1] = t end
  local lengths, index = {}, {}
  for i, t in ipairs(order) do
    lengths[i] = redis.call('ZCARD', tq(t))
    index[t] = i
  end
  return function(t, k)
    local mine, position = index[t] or #order + 1, 1
    for u, length in ipairs(lengths) do
      position = position + math.min(length, k - 1)
      if u < mine and length >= k then position = position + 1 end
    end
    return position
  end
end

-- The arrival path's estimate, flat in tenants (no tenant's queue read but its own): the
-- k-th waiter of `tenant`, min((k-1)*T + r, queued), T = tenants that wait, r = its tenant's
-- place in tready (T when parked) — an upper bound of rotation()'s (each tenant takes at most
-- one grant per round); the heartbeat then tells the place rotation() counts. `joining`: the
-- arrival is not queued yet (a tenant with no waiter joins at the back: T + 1).
local function tenants_waiting() return redis.call('ZCARD', K_TREADY) + redis.call('SCARD', K_TPARKED) end

local function rotation_bound(tenant, k, queued, joining)
  local tenants = tenants_waiting()
  if joining and k == 1 then return math.min(tenants + 1, queued) end
  local r = redis.call('ZRANK', K_TREADY, tenant)
  return math.min((k - 1) * tenants + (r and r + 1 or tenants), queued)
end

-- The places of rotation() bounded from above where it would read too many tenants: O(1)
-- commands per tenant asked about. The k-th waiter of t comes before every waiter t does not
-- wait behind in the worst case: queued - len(t) + k (every other tenant's waiters first); or
-- rotation_bound's (k-1)*T + r; the lesser. The first is exact for a tenant whose waiters come
-- after all the others' (one heavy tenant among many light ones).
local function bounded_places(queued, tenants)
  local rank, length = {}, {}
  return function(t, k)
    if rank[t] == nil then
      local r = redis.call('ZRANK', K_TREADY, t)
      rank[t], length[t] = r and r + 1 or tenants, redis.call('ZCARD', tq(t))
    end
    return math.max(1, math.min((k - 1) * tenants + rank[t], queued - length[t] + k, queued))
  end
end

-- place(t, k) under tenant fairness for the heartbeat, a status page and reject_early: counted
-- (rotation()) while at most COUNTED_TENANTS tenants wait, else bounded_places(), so each costs
-- at most ~COUNTED_TENANTS + its waiters' commands however many tenants wait. `queued`: the
-- queue's length (with the arrival, for reject_early).
local COUNTED_TENANTS = 128
local function places(queued)
  local tenants = tenants_waiting()
  if tenants > COUNTED_TENANTS then return bounded_places(queued, tenants) end
  return rotation()
end

-- Position of waiter `member` of `tenant` (1 = next), as acquire reports it: its rank in the
-- global FIFO; with tenant fairness rotation_bound().
local function position_of(cfg, member, tenant)
  local rank = redis.call('ZRANK', K_QUEUE, member)
  if not rank then return 0 end
  if not (cfg.tmode and cfg.fair) then return rank + 1 end
  local k = (redis.call('ZRANK', tq(tenant), member) or 0) + 1
  return rotation_bound(tenant, k, redis.call('ZCARD', K_QUEUE))
end
