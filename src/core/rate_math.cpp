#include "core/rate_math.hpp"

#include <algorithm>
#include <cassert>
#include <limits>

namespace fairgate::core::rate {

namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// --- fixed_window -----------------------------------------------------------
Decision fixed_window(const RateRule& r, FixedWindowState& s, std::int64_t now, std::int64_t cost,
                      bool commit) {
  const std::int64_t p = r.period_ms;
  std::int64_t w = now / p;
  if (s.window > w) {  // the clock went back: stay in the newest window seen
    w = s.window;
    now = w * p;
  }
  std::int64_t count = s.window == w ? s.count : 0;
  const std::int64_t end = (w + 1) * p - now;
  Decision d;
  d.allowed = cost <= r.rate && count + cost <= r.rate;
  if (d.allowed) {
    count += cost;
    if (commit) s = {w, count};
  }
  d.remaining = r.rate - count;
  d.reset_ms = count > 0 ? end : 0;
  d.retry_after_ms = d.allowed ? 0 : cost > r.rate ? -1 : end;
  return d;
}

// --- sliding_log ------------------------------------------------------------
Decision sliding_log(const RateRule& r, SlidingLogState& s, std::int64_t now, std::int64_t cost,
                     bool commit) {
  const std::int64_t p = r.period_ms;
  if (!s.entries.empty() && s.entries.back().first > now) now = s.entries.back().first;  // clock went back
  while (!s.entries.empty() && s.entries.front().first <= now - p) s.entries.pop_front();
  std::int64_t sum = 0;
  for (const auto& e : s.entries) sum += e.second;
  Decision d;
  d.allowed = cost <= r.rate && sum + cost <= r.rate;
  if (d.allowed) {
    sum += cost;
    if (commit) {
      if (!s.entries.empty() && s.entries.back().first == now)
        s.entries.back().second += cost;
      else
        s.entries.emplace_back(now, cost);
    }
  }
  d.remaining = r.rate - sum;
  const std::int64_t newest = d.allowed ? now : (s.entries.empty() ? now - p : s.entries.back().first);
  d.reset_ms = sum > 0 ? newest + p - now : 0;
  if (!d.allowed) {
    if (cost > r.rate) {
      d.retry_after_ms = -1;
    } else {
      // The earliest time enough of the oldest entries have left the period.
      std::int64_t left = sum;
      std::int64_t at = now;
      for (const auto& e : s.entries) {
        if (left + cost <= r.rate) break;
        left -= e.second;
        at = e.first + p;
      }
      d.retry_after_ms = at - now;
    }
  }
  return d;
}

// --- sliding_window (counter) -----------------------------------------------
Decision sliding_window(const RateRule& r, SlidingWindowState& s, std::int64_t now, std::int64_t cost,
                        bool commit) {
  const std::int64_t p = r.period_ms;
  std::int64_t w = now / p;
  if (s.window > w) {  // the clock went back
    w = s.window;
    now = w * p;
  }
  std::int64_t cur = 0, prev = 0;
  if (s.window == w) {
    cur = s.current;
    prev = s.previous;
  } else if (s.window == w - 1) {
    prev = s.current;
  }
  const std::int64_t e = now - w * p;  // 0 .. p-1
  const std::int64_t weight = p - e;   // the previous window's share of the period, in ms
  Decision d;
  d.allowed = cost <= r.rate && prev * weight + (cur + cost) * p <= r.rate * p;
  if (d.allowed) {
    cur += cost;
    if (commit) s = {w, cur, prev};
  }
  d.remaining = std::max<std::int64_t>(0, r.rate * p - prev * weight - cur * p) / p;
  d.reset_ms = cur > 0 ? (w + 2) * p - now : prev > 0 ? (w + 1) * p - now : 0;
  if (!d.allowed) {
    if (cost > r.rate) {
      d.retry_after_ms = -1;
    } else {
      std::int64_t at = -1;
      const std::int64_t room = (r.rate - cur - cost) * p;
      if (room >= 0 && prev > 0) {  // later in this window, as the previous one weighs less
        const std::int64_t e1 = p - room / prev;
        if (e1 < p) at = w * p + e1;
      }
      if (at < 0) {  // in the next window, where this window is the previous one
        const std::int64_t room2 = (r.rate - cost) * p;
        if (cur == 0) {
          at = (w + 1) * p;
        } else {
          const std::int64_t e2 = std::max<std::int64_t>(0, p - room2 / cur);
          at = e2 < p ? (w + 1) * p + e2 : (w + 2) * p;
        }
      }
      d.retry_after_ms = at - now;
    }
  }
  return d;
}

// --- token_bucket -------------------------------------------------------------
std::int64_t refill(const RateRule& r, const TokenBucketState& s, std::int64_t now) {
  const std::int64_t full = r.capacity() * r.period_ms;
  if (s.at_ms < 0) return full;
  const std::int64_t elapsed = std::max<std::int64_t>(0, now - s.at_ms);
  if (elapsed >= ceil_div(full - s.scaled_tokens, r.rate)) return full;
  return s.scaled_tokens + elapsed * r.rate;
}

Decision token_bucket(const RateRule& r, TokenBucketState& s, std::int64_t now, std::int64_t cost,
                      bool commit) {
  const std::int64_t p = r.period_ms;
  const std::int64_t full = r.capacity() * p;
  std::int64_t tokens = refill(r, s, now);
  Decision d;
  d.allowed = cost <= r.capacity() && cost * p <= tokens;
  if (d.allowed) {
    tokens -= cost * p;
    if (commit) s = {tokens, std::max(now, s.at_ms)};
  }
  d.remaining = tokens / p;
  d.reset_ms = ceil_div(full - tokens, r.rate);
  d.retry_after_ms = d.allowed ? 0 : cost > r.capacity() ? -1 : ceil_div(cost * p - tokens, r.rate);
  return d;
}

// --- gcra ---------------------------------------------------------------------
// Time in ticks: 1 ms = rate ticks, so one unit's emission interval is
// period_ms ticks and the tolerance (the bucket) is capacity x period_ms ticks.
std::int64_t debt_ticks(const RateRule& r, const GcraState& s, std::int64_t now) {
  if (s.tat_ms < now) return 0;
  // Going forward the debt stays within the tolerance (<= 2^50 ticks). A
  // clock that went back far (days at a high rate) would overflow it: it is
  // held at a value far above any tolerance (refused, nothing remains) that
  // still leaves room to add a cost. (Redis' Lua counts in doubles: no overflow.)
  constexpr std::int64_t kSaturated = std::numeric_limits<std::int64_t>::max() / 4;
  if (s.tat_ms - now > (kSaturated - s.tat_frac) / r.rate) return kSaturated;
  return (s.tat_ms - now) * r.rate + s.tat_frac;
}

void set_tat(const RateRule& r, GcraState& s, std::int64_t now, std::int64_t debt) {
  s.tat_ms = now + debt / r.rate;
  s.tat_frac = debt % r.rate;
}

Decision gcra(const RateRule& r, GcraState& s, std::int64_t now, std::int64_t cost, bool commit) {
  const std::int64_t p = r.period_ms;
  const std::int64_t tolerance = r.capacity() * p;
  std::int64_t debt = debt_ticks(r, s, now);
  Decision d;
  d.allowed = cost <= r.capacity() && debt + cost * p <= tolerance;
  if (d.allowed) {
    debt += cost * p;
    if (commit) set_tat(r, s, now, debt);
  }
  // (Debt beyond the tolerance only when the clock went back: nothing remains.)
  d.remaining = std::max<std::int64_t>(0, (tolerance - debt) / p);
  d.reset_ms = ceil_div(debt, r.rate);
  d.retry_after_ms = d.allowed ? 0 : cost > r.capacity() ? -1 : ceil_div(debt + cost * p - tolerance, r.rate);
  return d;
}

Decision evaluate(const RateRule& rule, State& state, std::int64_t now, std::int64_t cost, bool commit) {
  return std::visit(Overloaded{
                        [&](FixedWindowState& s) { return fixed_window(rule, s, now, cost, commit); },
                        [&](SlidingLogState& s) { return sliding_log(rule, s, now, cost, commit); },
                        [&](SlidingWindowState& s) { return sliding_window(rule, s, now, cost, commit); },
                        [&](TokenBucketState& s) { return token_bucket(rule, s, now, cost, commit); },
                        [&](GcraState& s) { return gcra(rule, s, now, cost, commit); },
                    },
                    state);
}

}  // namespace

State initial_state(RateAlgorithm algorithm) {
  switch (algorithm) {
    case RateAlgorithm::fixed_window: return FixedWindowState{};
    case RateAlgorithm::sliding_log: return SlidingLogState{};
    case RateAlgorithm::sliding_window: return SlidingWindowState{};
    case RateAlgorithm::token_bucket: return TokenBucketState{};
    case RateAlgorithm::gcra: return GcraState{};
  }
  return TokenBucketState{};
}

Decision decide(const RateRule& rule, State& state, std::int64_t now_ms, std::int64_t cost) {
  assert(state.index() == static_cast<std::size_t>(rule.algorithm));
  return evaluate(rule, state, now_ms, cost, true);
}

Decision peek(const RateRule& rule, const State& state, std::int64_t now_ms, std::int64_t cost) {
  State copy = state;
  return evaluate(rule, copy, now_ms, cost, false);
}

bool decide_all(const std::vector<Check>& checks, std::int64_t now_ms, std::vector<Decision>& out) {
  out.clear();
  bool all = true;
  for (const Check& c : checks) {
    out.push_back(peek(*c.rule, *c.state, now_ms, c.cost));
    all = all && out.back().allowed;
  }
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const Check& c = checks[i];
    if (all) {
      out[i] = decide(*c.rule, *c.state, now_ms, c.cost);
    } else if (out[i].allowed) {
      const Decision still = peek(*c.rule, *c.state, now_ms, c.rule->capacity() + 1);
      out[i].remaining = still.remaining;
      out[i].reset_ms = still.reset_ms;
    }
  }
  return all;
}

std::int64_t ttl_ms(const RateRule& rule, const State& state, std::int64_t now_ms) {
  // The time until the capacity is whole again is the time until the state
  // equals the initial one (see reset_ms).
  State copy = state;
  return evaluate(rule, copy, now_ms, rule.capacity() + 1, false).reset_ms;  // refused: takes nothing
}

std::int64_t refund(const RateRule& rule, State& state, std::int64_t now, std::int64_t at_ms,
                    std::int64_t amount) {
  if (amount <= 0 || at_ms > now) return 0;
  const std::int64_t p = rule.period_ms;
  return std::visit(Overloaded{
                        [&](FixedWindowState& s) -> std::int64_t {
                          if (s.window != now / p || at_ms / p != s.window) return 0;
                          const std::int64_t give = std::min(amount, s.count);
                          s.count -= give;
                          return give;
                        },
                        [&](SlidingLogState& s) -> std::int64_t {
                          while (!s.entries.empty() && s.entries.front().first <= now - p)
                            s.entries.pop_front();
                          for (auto it = s.entries.begin(); it != s.entries.end(); ++it) {
                            if (it->first != at_ms) continue;
                            const std::int64_t give = std::min(amount, it->second);
                            it->second -= give;
                            if (it->second == 0) s.entries.erase(it);
                            return give;
                          }
                          return 0;
                        },
                        [&](SlidingWindowState& s) -> std::int64_t {
                          const std::int64_t w = now / p;
                          if (s.window == w - 1) s = {w, 0, s.current};
                          if (s.window != w) return 0;
                          std::int64_t* count = nullptr;
                          if (at_ms / p == w) count = &s.current;
                          if (at_ms / p == w - 1) count = &s.previous;
                          if (count == nullptr) return 0;
                          const std::int64_t give = std::min(amount, *count);
                          *count -= give;
                          return give;
                        },
                        [&](TokenBucketState& s) -> std::int64_t {
                          if (now - at_ms >= p || s.at_ms < 0) return 0;
                          const std::int64_t full = rule.capacity() * p;
                          const std::int64_t tokens = refill(rule, s, now);
                          const std::int64_t back = std::min(amount * p, full - tokens);
                          s = {tokens + back, std::max(now, s.at_ms)};
                          return ceil_div(back, p);
                        },
                        [&](GcraState& s) -> std::int64_t {
                          if (now - at_ms >= p) return 0;
                          const std::int64_t debt = debt_ticks(rule, s, now);
                          const std::int64_t back = std::min(amount * p, debt);
                          set_tat(rule, s, now, debt - back);
                          return ceil_div(back, p);
                        },
                    },
                    state);
}

RateRule local_share(const RateRule& rule) {
  RateRule r = rule;
  r.rate = std::max<std::int64_t>(1, rule.rate / rule.local_divisor);
  if (rule.burst > 0) r.burst = std::max<std::int64_t>(1, rule.burst / rule.local_divisor);
  return r;
}

}  // namespace fairgate::core::rate
