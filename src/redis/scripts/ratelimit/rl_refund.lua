-- ratelimit/rl_refund.lua — gives back units of an allowed decision.
-- KEYS[1]  the rule's state for the key
-- KEYS[2]  this refund's marker (optional; same hash tag as KEYS[1]): set to the units given
--          back, for ARGV[7] ms. A marker already there means this refund was settled before
--          it ran: applied (its units), or called off by the instance ("x": SET NX after a
--          call that got no reply, redis_rate_store.cpp), so it runs at most once, and the
--          instance can tell whether a call that timed out ran.
-- ARGV     algorithm, rate, period_ms, capacity, at_ms (the decision's server time), amount,
--          marker ttl ms (with KEYS[2])
-- Returns  {units given back, now_ms}
-- What each algorithm does with a refund: docs/ratelimit.md ("Refunds").
local r = read_rule(ARGV, 1)
local at, amount = tonumber(ARGV[5]), tonumber(ARGV[6])
if not at or not amount or amount < 1 then error('fairgate ratelimit: bad refund arguments') end
local now = server_time()
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then return {0, now} end  -- settled already
local function mark(given)
  if KEYS[2] then redis.call('SET', KEYS[2], given, 'PX', tonumber(ARGV[7]) or 60000) end
  return {given, now}
end
if at > now then return mark(0) end
local s = A[r.alg].load(KEYS[1])
local given = A[r.alg].refund(r, s, now, at, amount)
if given > 0 or (r.alg == 2 and s.dropped > 0) then A[r.alg].save(KEYS[1], s, ttl_of(r, s, now)) end
return mark(given)
