-- lib.lua — shared by every limiter script; prepended to each at build time.
--
-- Keys (all of one limiter share the hash tag {L}, so Redis Cluster keeps them
-- on one shard):
--   KEYS[1] cfg        hash  max_concurrent, max_queue ('' = unbounded), enabled ('1'|'0'),
--                            when_disabled ('pass'|'reject'), max_wait_ms
--   KEYS[2] holders    zset  "inst|n" -> 0      (score 0: lex ranges find one instance's permits)
--   KEYS[3] queue      zset  "inst|n|deadline_ms" -> sequence   (the FIFO)
--   KEYS[4] seq        string INCR counter of arrivals
--   KEYS[5] instances  zset  instance id -> liveness deadline (ms, Redis time)
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
--   time is Redis server time (TIME), never a client clock.
-- Instance ids match [A-Za-z0-9._-]+ (no '|', no glob characters).

local K_CFG, K_HOLDERS, K_QUEUE, K_SEQ, K_INSTANCES = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local WAKE_PREFIX = ARGV[1]

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- "inst|n|deadline" -> inst, "inst|n", deadline
local function split_waiter(member)
  local inst, n, deadline = string.match(member, '^([^|]+)|([^|]+)|(%d+)$')
  return inst, inst .. '|' .. n, tonumber(deadline)
end

local function alive(inst, now)
  local deadline = redis.call('ZSCORE', K_INSTANCES, inst)
  return deadline ~= false and tonumber(deadline) > now
end

local function make_cfg(max_concurrent, enabled, when_disabled, max_queue)
  if not max_concurrent then return nil end
  return {
    max = tonumber(max_concurrent),
    enabled = enabled ~= '0',
    pass = when_disabled ~= 'reject',
    max_queue = tonumber(max_queue or ''),
  }
end

local function load_cfg()
  local v = redis.call('HMGET', K_CFG, 'max_concurrent', 'enabled', 'when_disabled', 'max_queue')
  return make_cfg(v[1], v[2], v[3], v[4])
end

-- The config from an HGETALL reply (flat field/value list); nil if empty.
local function cfg_from_flat(flat)
  local h = {}
  for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
  return make_cfg(h.max_concurrent, h.enabled, h.when_disabled, h.max_queue)
end

local function has_room(cfg, holders)
  if not cfg.enabled then return cfg.pass end
  return holders < cfg.max
end

-- Grants queue heads while there is room, publishing each grant to the one
-- instance that waits for it. Heads that expired or whose instance died are
-- dropped. Returns the number of grants and the number of holders after
-- (wrap the call in parentheses where only the first is wanted).
local function dispatch(cfg, now)
  if not cfg then return 0, redis.call('ZCARD', K_HOLDERS) end
  local holders = redis.call('ZCARD', K_HOLDERS)
  local granted = 0
  while has_room(cfg, holders) do
    local head = redis.call('ZRANGE', K_QUEUE, 0, 0)[1]
    if not head then break end
    redis.call('ZREM', K_QUEUE, head)
    local inst, id, deadline = split_waiter(head)
    if deadline > now and alive(inst, now) then
      redis.call('ZADD', K_HOLDERS, 0, id)
      redis.call('PUBLISH', WAKE_PREFIX .. inst, id)
      holders = holders + 1
      granted = granted + 1
    end
  end
  return granted, holders
end

-- Removes instances whose liveness ran out, with their permits and waiters.
-- Returns the number of permits returned.
local function reap(now)
  local dead = redis.call('ZRANGEBYSCORE', K_INSTANCES, '-inf', now)
  local returned = 0
  for _, inst in ipairs(dead) do
    returned = returned + redis.call('ZREMRANGEBYLEX', K_HOLDERS, '[' .. inst .. '|', '(' .. inst .. '}')
    local cursor = '0'
    repeat
      local page = redis.call('ZSCAN', K_QUEUE, cursor, 'MATCH', inst .. '|*', 'COUNT', 1000)
      cursor = page[1]
      for i = 1, #page[2], 2 do redis.call('ZREM', K_QUEUE, page[2][i]) end
    until cursor == '0'
    redis.call('ZREM', K_INSTANCES, inst)
  end
  return returned
end
