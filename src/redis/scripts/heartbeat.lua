-- heartbeat.lua — one instance says it is alive (about once a second), and learns whether
-- Redis still has what it holds.
-- KEYS: see lib.lua.
-- ARGV[2] instance id, ARGV[3] liveness TTL ms, ARGV[4] key expiry ms (0 = leave as is; -1 =
--           no expiry: only the housekeeping that rides with it, the ptenant_sweep of lib.lua),
-- ARGV[5] recovery fence ms (how long a created state grants nothing; 0 = no fence),
-- ARGV[6] permits this instance holds, ARGV[7] waiters it has queued in Redis,
-- ARGV[8] the queue's version (below) when the instance last heard it ('' none), ARGV[9] s,
-- ARGV[10] m, then m (tenant, order score) pairs: waiters of this instance whose positions under
--           tenant fairness it asks for (positions below), the first s of them not counted at
--           ARGV[8]'s version; without fairness, those it asks the rank of (s unused),
-- ARGV[11 + 2m ..] the instance's current settings as field, value pairs: a field missing from
--           cfg is filled from them (one by one, never "only if cfg is empty"); and, never stored:
--           'fence_seen', the cfg fence_ms this instance last saw (a re-created state is fenced
--           for the longer of it and ARGV[5]); 'queue_seen', the queue as this instance's last
--           heartbeat found it whole, "h<head_order>:<queued>" ('' or absent: not known), so that
--           a queue that did not change is not counted against its index again (below);
--           'liveness_tag', 1..255: this process's tag, put in its liveness deadline (below);
--           'probe', 1: the instance has heard no reply for about a liveness TTL, so this call
--           extends nothing of its own (below); 'check_source', 1: its connection to Redis was
--           made anew (a restart, a failover), so this call asks which Redis this is (lib.lua,
--           "Which Redis"): a switch fences the state now, not at the first grant, however late
-- Creates the state when it is gone (see lib.lua: new epoch, arrival counter moved past every
-- older order score, fenced for ARGV[5] ms or the longer fence_seen). Extends this instance's
-- liveness — even if it had run out, as long as nobody reaped it: an instance never reaps itself. If no liveness ran
-- past now, Redis was away (nobody could reach it for a TTL): every liveness is extended
-- instead of reaping. Then reaps dead instances and dispatches (so a crashed holder's permits
-- move on without waiting for a new arrival).
-- An instance that is not registered (new, reaped, or the state is new) is registered here
-- only when it has nothing to restore (ARGV[6] = ARGV[7] = 0); otherwise 'lost' says:
-- restore first (restore.lua registers it together with what it holds, atomically).
-- Returns {lost, held, head_order, queued, in_use, cfg, reaped, granted, created, away,
--          fence_left_ms, my_waiters, epoch, older, instances, now, positions, version, liveness}:
--   lost        1: this instance is not registered: restore.lua before anything else
--   held        this instance's permits as Redis knows them (a waiter of ours that appears
--               here was granted, even if the wake message was lost)
--   head_order  order score of the queue head (0 if empty), for positions
--   cfg         flat field/value list of the settings (and engine fields)
--   created     1 when this call created the state (it was gone)
--   away        1 when every liveness had run out (Redis was away) and was extended
--   my_waiters  this instance's waiters in Redis (level-triggered loss detection): those in the
--               queue, when the queue lost members its index still has
--   older       waiters whose order score is below the epoch (restored from an older state)
--   instances   the registered instances (ids), for local shares while Redis is unreachable
--   now         Redis time in ms (the pace fields in cfg are in it: wait estimates, F7)
--   positions   under tenant fairness, the place rotation() (lib.lua) counts for each waiter
--               ARGV[10] lists, after this call's grants: the order score says nothing
--               about the rotation, so the instance cannot tell it from head_order. A waiter no
--               longer in its tenant's queue (granted, or it left) gets the place it had. Empty
--               without fairness. One ZCOUNT per waiter asked about and places()' reads
--               (rotation() up to COUNTED_TENANTS, else bounded_places: lib.lua), only while this
--               instance has waiters under fairness, and only for the first s of them when
--               the version is still ARGV[8]'s: an idle queue costs its heartbeat one GET.
--               Without fairness, the rank of each waiter asked about (one ZCOUNT each), only
--               when waiters left from the middle of the queue (the order scores from the head
--               to the tail have gaps) and the version changed: else the order scores tell the
--               places (empty).
--   version     under tenant fairness, while this instance asks about waiters: "seq:queued",
--               the arrival counter and the queue's length. Every arrival moves the first,
--               every departure without one (grant, timeout, cancel) the second, so the places
--               counted at one version still hold while it stays (a rotation changed alone — a
--               capped tenant parked or unparked, a tenant key rebuilt — is seen at the next
--               arrival or departure). Without fairness "h<head_order>:queued" (no command of
--               its own): ranks change only when the head moves or somebody leaves.
--               '' otherwise.
--   liveness    the tag in this instance's liveness deadline as the call found it (0: none, or a
--               deadline without one: set by a restore, or by the extension after an outage):
--               another tag than this process's own, beat after beat, means another process
--               heartbeats with the same instance id
local inst, ttl, expiry, fence_ms = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local has_state = tonumber(ARGV[6]) > 0 or tonumber(ARGV[7]) > 0
local stale, asked = tonumber(ARGV[9]), tonumber(ARGV[10])
local settings_from = 11 + 2 * asked
local now = now_ms()
local seen = {}  -- the fields of ARGV[11 + 2m ..] that are not settings
for i = settings_from, #ARGV - 1, 2 do
  if ARGV[i] == 'fence_seen' or ARGV[i] == 'queue_seen' or ARGV[i] == 'liveness_tag' or ARGV[i] == 'probe' or
      ARGV[i] == 'check_source' then
    seen[ARGV[i]] = ARGV[i + 1]
  end
end
local flat = redis.call('HGETALL', K_CFG)
local h = hash_of(flat)
local created, changed = 0, false
if not h.epoch then
  local epoch = now * 1000
  -- Fenced as long as the longest fence this instance last saw in cfg (another instance's, with a
  -- longer TTL or heartbeat: it must re-register before anything is granted), or its own.
  local create_fence = math.max(fence_ms, tonumber(seen.fence_seen or '') or 0)
  redis.call('HSET', K_CFG, 'epoch', int(epoch), 'fence_until', int(create_fence > 0 and now + create_fence or 0),
             'fence_credit', 0, 'source', replication_id() or '', 'holders_mark', '1')
  redis.call('ZADD', K_HOLDERS, 0, HOLDERS_MARK)
  seq_at_least(epoch)
  created, changed = 1, true
end
-- How long a loss or a switch of Redis fences the state ("Which Redis" in lib.lua): the longest
-- of the instances' fences (their liveness TTL + heartbeat interval), so that the slowest has
-- re-registered and restored before anything more is granted. Raised by any instance; only the
-- instance that set it lowers it (its settings changed).
local cfg_fence = tonumber(h.fence_ms or '')
if cfg_fence == nil or cfg_fence < fence_ms or (h.fence_by == inst and cfg_fence ~= fence_ms) then
  redis.call('HSET', K_CFG, 'fence_ms', ARGV[5], 'fence_by', inst)
  changed = true
end
for i = settings_from, #ARGV - 1, 2 do
  if h[ARGV[i]] == nil and seen[ARGV[i]] == nil then
    redis.call('HSET', K_CFG, ARGV[i], ARGV[i + 1])
    changed = true
  end
end
if changed then flat = redis.call('HGETALL', K_CFG) end
local cfg = make_cfg(hash_of(flat))

if seen.check_source == '1' and created == 0 then  -- (a created state has it)
  local was = cfg.source
  check_source(cfg, now)
  if cfg.source ~= was then flat = redis.call('HGETALL', K_CFG) end  -- the reply tells the new source
end
local list = redis.call('ZRANGE', K_INSTANCES, 0, -1, 'WITHSCORES')
local top, mine = nil, nil
for i = 1, #list, 2 do
  local d = tonumber(list[i + 1])
  if list[i] == inst then mine = d end
  if d >= 0 and (top == nil or d > top) then top = d end
end
local away = 0
if top ~= nil and top <= now then
  away = 1
  for i = 1, #list, 2 do
    if tonumber(list[i + 1]) >= 0 then redis.call('ZADD', K_INSTANCES, now + ttl, list[i]) end
  end
end
local lost = 0
-- This process's tag rides in the deadline's fraction (1..255 / 256 of a ms: exact in a double):
-- a deadline found with another tag was set by another process with the same instance id.
local tag = math.floor(tonumber(seen.liveness_tag or '') or 0)
if tag < 0 or tag > 255 then tag = 0 end
-- A probe (the instance heard no reply for about a TTL: a slow or one-way link) neither extends
-- nor registers: whatever reaches Redis from an instance that cannot hear the answers must not
-- keep it alive, or what Redis granted to it (acquires whose replies never came back) stays
-- held by nobody for as long as the link is bad, and every seat can end up so (docs/design.md,
-- recovery rule 16). It is reaped as a cut-off instance is; its first reply heard ends probing.
if seen.probe == '1' then
  if mine == nil or mine < 0 then lost = 1 end
elseif (mine ~= nil and mine >= 0) or (mine == nil and not has_state) then
  redis.call('ZADD', K_INSTANCES, now + ttl + tag / 256, inst)
else
  lost = 1
end
local reaped = reap(now, inst, list, away == 1)
local granted, in_use = dispatch(cfg, now)
local waiting = cfg.tmode and cfg.enabled and has_room(cfg, in_use, now) and redis.call('ZCARD', K_QUEUE)
if waiting and waiting > 0 and not tenants_whole(waiting) and repair_tenants(cfg) then
  -- Room left and a queue that the parked tenants do not account for (I3'): a tenant key was
  -- deleted on its own and stranded waiters; rebuilt (repair_tenants), now served.
  local more
  more, in_use = dispatch(cfg, now)
  granted = granted + more
end
local held, my_waiters = {}, 0
if lost == 0 then
  local lo, hi = range_of(inst)
  held = holder_ids(redis.call('ZRANGEBYLEX', K_HOLDERS, lo, hi))
  my_waiters = redis.call('ZLEXCOUNT', K_BYINST, lo, hi)
end
local head = redis.call('ZRANGE', K_QUEUE, 0, 0, 'WITHSCORES')
local head_order = head[2] and tonumber(head[2]) or 0
local queued = head[2] and redis.call('ZCARD', K_QUEUE) or 0
local queue_now = 'h' .. int(head_order) .. ':' .. queued
if my_waiters > 0 and queue_now ~= seen.queue_seen and queued < redis.call('ZCARD', K_BYINST) then
  -- Fewer queued than indexed (I5 says as many): the queue key was deleted (evicted, DEL).
  -- Only this instance's waiters still in the queue count, so it restores the others (restore.lua
  -- puts them back at their place). Not counted while the queue's head and length are as this
  -- instance's last heartbeat found them whole (an idle queue costs nothing more): a deleted
  -- queue changes them, since what arrives after has order scores above every lost waiter's
  -- (next_order). Only a queue and its seq key deleted together, then refilled within a beat to
  -- the same length from the same first score, would look unchanged: the check waits for the
  -- queue's next arrival or departure then.
  local lo, hi = range_of(inst)
  my_waiters = 0
  for _, member in ipairs(redis.call('ZRANGEBYLEX', K_BYINST, lo, hi)) do
    if redis.call('ZSCORE', K_QUEUE, member) ~= false then my_waiters = my_waiters + 1 end
  end
end
local older = 0
if head_order > 0 and head_order < cfg.epoch then
  older = redis.call('ZCOUNT', K_QUEUE, '-inf', '(' .. int(cfg.epoch))
end
if expiry > 0 then
  for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], expiry) end
  if redis.call('PEXPIRE', K_PTENANT, expiry) == 1 then ptenant_sweep() end
  if cfg.tmode then
    for _, key in ipairs(TENANT_KEYS) do redis.call('PEXPIRE', key, expiry) end
  end
elseif expiry < 0 and redis.call('EXISTS', K_PTENANT) == 1 then
  ptenant_sweep()
end
local positions, version = {}, ''
if asked > 0 and lost == 0 and queued > 0 and cfg.tmode and cfg.fair then
  version = (redis.call('GET', K_SEQ) or '') .. ':' .. queued
  local answer = version == ARGV[8] and stale or asked
  local place = answer > 0 and places(queued)
  for i = 11, 10 + 2 * answer, 2 do
    local t = ARGV[i]
    positions[#positions + 1] = place(t, redis.call('ZCOUNT', tq(t), '-inf', '(' .. ARGV[i + 1]) + 1)
  end
elseif asked > 0 and lost == 0 and queued > 0 then
  -- One FIFO: a waiter's place is its rank, which its order score gives (head_order) unless
  -- waiters left from the middle (cancels, timeouts, a reaped instance's): then the ranks are
  -- counted, once per change of the head or of the length (free: both read above).
  version = queue_now
  if version ~= ARGV[8] then
    local tail = tonumber(redis.call('ZRANGE', K_QUEUE, -1, -1, 'WITHSCORES')[2])
    if older > 0 or tail - head_order + 1 ~= queued then
      for i = 11, 10 + 2 * asked, 2 do
        positions[#positions + 1] = redis.call('ZCOUNT', K_QUEUE, '-inf', '(' .. ARGV[i + 1]) + 1
      end
    end
  end
end
local ids = {}
for i = 1, #list, 2 do
  local d = tonumber(list[i + 1])
  if list[i] ~= inst and (d > now or (away == 1 and d >= 0)) then ids[#ids + 1] = list[i] end
end
if lost == 0 then ids[#ids + 1] = inst end
return {lost, held, head_order, queued, in_use, flat, reaped, granted, created, away,
        math.max(0, cfg.fence - now), my_waiters, cfg.epoch, older, ids, now, positions, version,
        (mine and mine > 0) and math.floor((mine % 1) * 256 + 0.5) or 0}
