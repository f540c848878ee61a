-- ratelimit/rl_refund.lua — gives back units of an allowed decision.
-- KEYS[1]  the rule's state for the key
-- ARGV     algorithm, rate, period_ms, capacity, at_ms (the decision's server time), amount
-- Returns  {units given back, now_ms}
-- What each algorithm does with a refund: docs/ratelimit.md ("Refunds").
local r = read_rule(ARGV, 1)
local at, amount = tonumber(ARGV[5]), tonumber(ARGV[6])
if not at or not amount or amount < 1 then error('fairgate ratelimit: bad refund arguments') end
local now = server_time()
if at > now then return {0, now} end
local s = A[r.alg].load(KEYS[1])
local given = A[r.alg].refund(r, s, now, at, amount)
if given > 0 or (r.alg == 2 and s.dropped > 0) then A[r.alg].save(KEYS[1], s, ttl_of(r, s, now)) end
return {given, now}
