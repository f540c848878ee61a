-- acquire.lua — a new request asks for a permit.
-- KEYS: see lib.lua.
-- ARGV[2] instance id, ARGV[3] request number n (unique per instance), ARGV[4] max wait ms
-- Returns one of:
--   {'granted'}                             the permit "inst|n" is held now
--   {'queued', member, sequence, position}  waiting; member = "inst|n|deadline"
--   {'rejected', reason}                    reason: queue_full | disabled | timeout
--   {'dead'}                                this instance's liveness expired: heartbeat first
--   {'lost'}                                the limiter's config is gone: heartbeat first
local inst, n, max_wait = ARGV[2], ARGV[3], tonumber(ARGV[4])
local now = now_ms()
if not alive(inst, now) then return {'dead'} end
local cfg = load_cfg()
if not cfg then return {'lost'} end
local id = inst .. '|' .. n
if not cfg.enabled then
  if cfg.pass then
    redis.call('ZADD', K_HOLDERS, 0, id)
    return {'granted'}
  end
  return {'rejected', 'disabled'}
end
-- I3 holds before this script, so a non-empty queue means there is no room.
local queued = redis.call('ZCARD', K_QUEUE)
if queued == 0 and redis.call('ZCARD', K_HOLDERS) < cfg.max then
  redis.call('ZADD', K_HOLDERS, 0, id)
  return {'granted'}
end
if max_wait <= 0 then return {'rejected', 'timeout'} end
if cfg.max_queue and queued >= cfg.max_queue then return {'rejected', 'queue_full'} end
local seq = redis.call('INCR', K_SEQ)
local member = id .. '|' .. (now + max_wait)
redis.call('ZADD', K_QUEUE, seq, member)
return {'queued', member, seq, queued + 1}
