-- ratelimit/rl_decide.lua — one decision over N rules, atomically.
-- KEYS[i]  the state of rule i for the caller's key ("<prefix>:rl:{<rule>:<key>}:<algorithm>")
-- ARGV     n, then per rule: algorithm, rate, period_ms, capacity, cost
-- Returns  {all_allowed (0/1), now_ms, now_us, then per rule: allowed, remaining, reset_ms, retry_after_ms}
-- Invariants: all rules allow, and each takes its cost, or none takes anything
-- (a refused cost leaves every key as it was, apart from dropping entries
-- that already left a sliding log); every key written gets a PX equal to
-- the time until its state is initial again.
local n = tonumber(ARGV[1])
if not n or n < 1 or #KEYS ~= n or #ARGV ~= 1 + 5 * n then error('fairgate ratelimit: bad arguments') end
local now, now_us = server_time()
local rules, states, costs, ds = {}, {}, {}, {}
local all = true
for i = 1, n do
  local base = 2 + (i - 1) * 5
  rules[i] = read_rule(ARGV, base)
  costs[i] = tonumber(ARGV[base + 4])
  if not costs[i] or costs[i] < 1 then error('fairgate ratelimit: bad cost') end
  states[i] = A[rules[i].alg].load(KEYS[i])
  ds[i] = A[rules[i].alg].eval(rules[i], states[i], now, costs[i], false)
  if not ds[i].allowed then all = false end
end
local out = {all and 1 or 0, now, now_us}
for i = 1, n do
  local r, s = rules[i], states[i]
  local d = ds[i]
  if all then
    d = A[r.alg].eval(r, s, now, costs[i], true)
    A[r.alg].save(KEYS[i], s, d.reset)
  else
    if d.allowed then
      -- This rule would allow, but another refused: nothing is taken; report
      -- the state as it stays.
      local still = A[r.alg].eval(r, s, now, r.cap + 1, false)
      d.remaining = still.remaining
      d.reset = still.reset
      d.retry = 0
    end
    if r.alg == 2 and s.dropped > 0 then A[2].save(KEYS[i], s, ttl_of(r, s, now)) end
  end
  out[#out + 1] = d.allowed and 1 or 0
  out[#out + 1] = d.remaining
  out[#out + 1] = d.reset
  out[#out + 1] = d.retry
end
return out
