-- ratelimit/lib.lua — the rate-limit algorithms in Lua, prepended to every
-- rate-limit script. A line-by-line port of src/core/rate_math.cpp (read that
-- file for the reasoning); docs/ratelimit.md states the semantics.
--
-- Numbers: every value stays below 2^51 (rules are validated so that
-- capacity x period_ms <= 2^50), so the doubles of Lua hold them exactly and
-- math.floor(a / b) is the exact integer quotient. Values are stored with
-- string.format('%d') (tostring would switch to exponent notation).
--
-- Time: Redis TIME only (never the caller's clock).
--
-- A rule travels as 4 ARGV fields: algorithm code (1 fixed_window,
-- 2 sliding_log, 3 sliding_window, 4 token_bucket, 5 gcra), rate, period_ms,
-- capacity. Each (rule, key) has one key; its TTL is the time until the state
-- is the initial one again (the decision's reset), so no key outlives its use.

local function fmt(x) return string.format('%d', x) end
local function floor_div(a, b) return math.floor(a / b) end
local function ceil_div(a, b)
  if a <= 0 then return 0 end
  return math.floor((a + b - 1) / b)
end

local function server_time()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

local function read_numbers(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  local out = {}
  for n in string.gmatch(v, '%-?%d+') do out[#out + 1] = tonumber(n) end
  return out
end

local function write_numbers(key, values, ttl)
  if ttl <= 0 then
    redis.call('DEL', key)
    return
  end
  local parts = {}
  for i, v in ipairs(values) do parts[i] = fmt(v) end
  redis.call('SET', key, table.concat(parts, ' '), 'PX', fmt(ttl))
end

-- Each algorithm: load(key) -> state; eval(r, s, now, cost, commit) -> d
-- (commit: update s when allowed); save(key, s, ttl); refund(r, s, now, at, amount) -> given.
local A = {}

-- 1 fixed_window: "window count"
A[1] = {
  load = function(key)
    local v = read_numbers(key)
    if not v then return {w = -1, c = 0} end
    return {w = v[1], c = v[2]}
  end,
  eval = function(r, s, now, cost, commit)
    local p = r.period
    local w = floor_div(now, p)
    if s.w > w then w = s.w; now = w * p end
    local count = 0
    if s.w == w then count = s.c end
    local ends = (w + 1) * p - now
    local d = {allowed = cost <= r.rate and count + cost <= r.rate}
    if d.allowed then
      count = count + cost
      if commit then s.w = w; s.c = count end
    end
    d.remaining = r.rate - count
    d.reset = 0
    if count > 0 then d.reset = ends end
    if d.allowed then d.retry = 0 elseif cost > r.rate then d.retry = -1 else d.retry = ends end
    return d
  end,
  save = function(key, s, ttl) write_numbers(key, {s.w, s.c}, ttl) end,
  refund = function(r, s, now, at, amount)
    local p = r.period
    if s.w ~= floor_div(now, p) or floor_div(at, p) ~= s.w then return 0 end
    local give = math.min(amount, s.c)
    s.c = s.c - give
    return give
  end,
}

-- 2 sliding_log: a sorted set, one member "ms:cost" per ms, score = ms.
A[2] = {
  load = function(key)
    local flat = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    local s = {key = key, e = {}, dropped = 0, added = nil, removed = nil}
    for i = 1, #flat, 2 do
      local ts, c = string.match(flat[i], '^(%d+):(%d+)$')
      s.e[#s.e + 1] = {tonumber(ts), tonumber(c), flat[i]}
    end
    return s
  end,
  -- Drops the entries that left the period (ZREMRANGEBYRANK at save time).
  normalize = function(r, s, now)
    if #s.e > 0 and s.e[#s.e][1] > now then now = s.e[#s.e][1] end
    local first = 1
    while first <= #s.e and s.e[first][1] <= now - r.period do first = first + 1 end
    if first > 1 then
      local kept = {}
      for i = first, #s.e do kept[#kept + 1] = s.e[i] end
      s.dropped = s.dropped + first - 1
      s.e = kept
    end
    return now
  end,
  eval = function(r, s, now, cost, commit)
    local p = r.period
    now = A[2].normalize(r, s, now)
    local sum = 0
    for _, e in ipairs(s.e) do sum = sum + e[2] end
    local d = {allowed = cost <= r.rate and sum + cost <= r.rate}
    if d.allowed then
      sum = sum + cost
      if commit then
        local last = s.e[#s.e]
        if last and last[1] == now then
          s.removed = last[3]
          last[2] = last[2] + cost
        else
          last = {now, cost}
          s.e[#s.e + 1] = last
        end
        last[3] = fmt(now) .. ':' .. fmt(last[2])
        s.added = last
      end
    end
    d.remaining = r.rate - sum
    local newest = now - p
    if d.allowed then newest = now elseif #s.e > 0 then newest = s.e[#s.e][1] end
    d.reset = 0
    if sum > 0 then d.reset = newest + p - now end
    d.retry = 0
    if not d.allowed then
      if cost > r.rate then
        d.retry = -1
      else
        local left, at = sum, now
        for _, e in ipairs(s.e) do
          if left + cost <= r.rate then break end
          left = left - e[2]
          at = e[1] + p
        end
        d.retry = at - now
      end
    end
    return d
  end,
  save = function(key, s, ttl)
    if ttl <= 0 then redis.call('DEL', key); return end
    if s.dropped > 0 then redis.call('ZREMRANGEBYRANK', key, 0, s.dropped - 1) end
    if s.removed then redis.call('ZREM', key, s.removed) end
    if s.added then redis.call('ZADD', key, s.added[1], s.added[3]) end
    redis.call('PEXPIRE', key, fmt(ttl))
  end,
  refund = function(r, s, now, at, amount)
    A[2].normalize(r, s, now)
    for i, e in ipairs(s.e) do
      if e[1] == at then
        local give = math.min(amount, e[2])
        s.removed = e[3]
        e[2] = e[2] - give
        if e[2] > 0 then
          e[3] = fmt(e[1]) .. ':' .. fmt(e[2])
          s.added = e
        else
          table.remove(s.e, i)
        end
        return give
      end
    end
    return 0
  end,
}

-- 3 sliding_window (counter): "window current previous"
A[3] = {
  load = function(key)
    local v = read_numbers(key)
    if not v then return {w = -1, cur = 0, prev = 0} end
    return {w = v[1], cur = v[2], prev = v[3]}
  end,
  eval = function(r, s, now, cost, commit)
    local p = r.period
    local w = floor_div(now, p)
    if s.w > w then w = s.w; now = w * p end
    local cur, prev = 0, 0
    if s.w == w then cur = s.cur; prev = s.prev elseif s.w == w - 1 then prev = s.cur end
    local e = now - w * p
    local weight = p - e
    local d = {allowed = cost <= r.rate and prev * weight + (cur + cost) * p <= r.rate * p}
    if d.allowed then
      cur = cur + cost
      if commit then s.w = w; s.cur = cur; s.prev = prev end
    end
    d.remaining = floor_div(math.max(0, r.rate * p - prev * weight - cur * p), p)
    if cur > 0 then d.reset = (w + 2) * p - now elseif prev > 0 then d.reset = (w + 1) * p - now else d.reset = 0 end
    d.retry = 0
    if not d.allowed then
      if cost > r.rate then
        d.retry = -1
      else
        local at = -1
        local room = (r.rate - cur - cost) * p
        if room >= 0 and prev > 0 then
          local e1 = p - floor_div(room, prev)
          if e1 < p then at = w * p + e1 end
        end
        if at < 0 then
          local room2 = (r.rate - cost) * p
          if cur == 0 then
            at = (w + 1) * p
          else
            local e2 = math.max(0, p - floor_div(room2, cur))
            if e2 < p then at = (w + 1) * p + e2 else at = (w + 2) * p end
          end
        end
        d.retry = at - now
      end
    end
    return d
  end,
  save = function(key, s, ttl) write_numbers(key, {s.w, s.cur, s.prev}, ttl) end,
  refund = function(r, s, now, at, amount)
    local p = r.period
    local w = floor_div(now, p)
    if s.w == w - 1 then s.w = w; s.prev = s.cur; s.cur = 0 end
    if s.w ~= w then return 0 end
    local aw = floor_div(at, p)
    local give = 0
    if aw == w then
      give = math.min(amount, s.cur); s.cur = s.cur - give
    elseif aw == w - 1 then
      give = math.min(amount, s.prev); s.prev = s.prev - give
    end
    return give
  end,
}

-- 4 token_bucket: "scaled_tokens at_ms" (one unit = period_ms scaled tokens)
local function tb_refill(r, s, now)
  local full = r.cap * r.period
  if s.at < 0 then return full end
  local elapsed = math.max(0, now - s.at)
  if elapsed >= ceil_div(full - s.t, r.rate) then return full end
  return s.t + elapsed * r.rate
end
A[4] = {
  load = function(key)
    local v = read_numbers(key)
    if not v then return {t = 0, at = -1} end
    return {t = v[1], at = v[2]}
  end,
  eval = function(r, s, now, cost, commit)
    local p = r.period
    local full = r.cap * p
    local tokens = tb_refill(r, s, now)
    local d = {allowed = cost <= r.cap and cost * p <= tokens}
    if d.allowed then
      tokens = tokens - cost * p
      if commit then s.t = tokens; s.at = math.max(now, s.at) end
    end
    d.remaining = floor_div(tokens, p)
    d.reset = ceil_div(full - tokens, r.rate)
    if d.allowed then d.retry = 0 elseif cost > r.cap then d.retry = -1 else d.retry = ceil_div(cost * p - tokens, r.rate) end
    return d
  end,
  save = function(key, s, ttl) write_numbers(key, {s.t, s.at}, ttl) end,
  refund = function(r, s, now, at, amount)
    local p = r.period
    if now - at >= p or s.at < 0 then return 0 end
    local full = r.cap * p
    local tokens = tb_refill(r, s, now)
    local back = math.min(amount * p, full - tokens)
    s.t = tokens + back
    s.at = math.max(now, s.at)
    return ceil_div(back, p)
  end,
}

-- 5 gcra: "tat_ms tat_frac" (TAT = tat_ms + tat_frac / rate; 1 ms = rate ticks)
local function gcra_debt(r, s, now)
  if s.ms < now then return 0 end
  return (s.ms - now) * r.rate + s.frac
end
A[5] = {
  load = function(key)
    local v = read_numbers(key)
    if not v then return {ms = 0, frac = 0} end
    return {ms = v[1], frac = v[2]}
  end,
  eval = function(r, s, now, cost, commit)
    local p = r.period
    local tolerance = r.cap * p
    local debt = gcra_debt(r, s, now)
    local d = {allowed = cost <= r.cap and debt + cost * p <= tolerance}
    if d.allowed then
      debt = debt + cost * p
      if commit then s.ms = now + floor_div(debt, r.rate); s.frac = debt % r.rate end
    end
    -- (debt beyond the tolerance only when the clock went back: nothing remains)
    d.remaining = math.max(0, floor_div(tolerance - debt, p))
    d.reset = ceil_div(debt, r.rate)
    if d.allowed then d.retry = 0 elseif cost > r.cap then d.retry = -1 else d.retry = ceil_div(debt + cost * p - tolerance, r.rate) end
    return d
  end,
  save = function(key, s, ttl) write_numbers(key, {s.ms, s.frac}, ttl) end,
  refund = function(r, s, now, at, amount)
    local p = r.period
    if now - at >= p then return 0 end
    local debt = gcra_debt(r, s, now)
    local back = math.min(amount * p, debt)
    debt = debt - back
    s.ms = now + floor_div(debt, r.rate)
    s.frac = debt % r.rate
    return ceil_div(back, p)
  end,
}

local function read_rule(argv, i)
  local r = {alg = tonumber(argv[i]), rate = tonumber(argv[i + 1]), period = tonumber(argv[i + 2]),
             cap = tonumber(argv[i + 3])}
  if not A[r.alg] or not r.rate or r.rate < 1 or not r.period or r.period < 1 or not r.cap or r.cap < 1 then
    error('fairgate ratelimit: bad rule arguments')
  end
  return r
end

-- The state's TTL: the reset of a decision that takes nothing.
local function ttl_of(r, s, now)
  local copy = {}
  for k, v in pairs(s) do copy[k] = v end
  if r.alg == 2 then
    copy.e = {}
    for i, e in ipairs(s.e) do copy.e[i] = {e[1], e[2], e[3]} end
  end
  return A[r.alg].eval(r, copy, now, r.cap + 1, false).reset
end
