// core/rate_math.hpp — the rate-limit algorithms as pure functions: no clock
// reads (`now_ms` is a parameter), no I/O, exact integer arithmetic.
//
// decide(rule, state, now_ms, cost) → a Decision and the new state. The Redis
// scripts (src/redis/scripts/rl_*.lua) are line-by-line ports of these
// functions; tests/unit/rate_math_test.cpp checks both against a reference
// model written from docs/ratelimit.md.
//
// Preconditions (checked by the callers, see fairgate/rate_rule.hpp):
// validate(rule) passed, 1 <= cost <= kMaxCost, now_ms >= 0. A cost above
// rule.capacity() is refused with retry_after = -1 ("never").
#pragma once

#include <fairgate/rate_rule.hpp>

#include <cstdint>
#include <deque>
#include <utility>
#include <variant>
#include <vector>

namespace fairgate::core::rate {

/// One decision.
struct Decision {
  bool allowed = false;
  /// Units still available right after the decision (allowed: after this
  /// cost was taken).
  std::int64_t remaining = 0;
  /// Milliseconds until the full capacity is available again (if nothing else
  /// arrives).
  std::int64_t reset_ms = 0;
  /// Refused: milliseconds until this same cost would be allowed if nothing
  /// else arrives (-1: never, the cost exceeds the capacity). Allowed: 0.
  std::int64_t retry_after_ms = 0;
  friend bool operator==(const Decision&, const Decision&) = default;
};

/// fixed_window: the count of the aligned window `window` (= now / period).
struct FixedWindowState {
  std::int64_t window = -1;
  std::int64_t count = 0;
  friend bool operator==(const FixedWindowState&, const FixedWindowState&) = default;
};

/// sliding_log: admitted costs by timestamp, oldest first (one entry per ms).
struct SlidingLogState {
  std::deque<std::pair<std::int64_t, std::int64_t>> entries;  // (ms, cost)
  friend bool operator==(const SlidingLogState&, const SlidingLogState&) = default;
};

/// sliding_window: counts of the current aligned window and the one before.
struct SlidingWindowState {
  std::int64_t window = -1;
  std::int64_t current = 0;
  std::int64_t previous = 0;
  friend bool operator==(const SlidingWindowState&, const SlidingWindowState&) = default;
};

/// token_bucket: tokens scaled by period_ms (one unit = period_ms), as of `at_ms`.
/// A fresh bucket (at_ms < 0) is full.
struct TokenBucketState {
  std::int64_t scaled_tokens = 0;
  std::int64_t at_ms = -1;
  friend bool operator==(const TokenBucketState&, const TokenBucketState&) = default;
};

/// gcra: the theoretical arrival time, tat_ms + tat_frac / rate exactly
/// (0 <= tat_frac < rate). A fresh state (tat_ms = 0) is full.
struct GcraState {
  std::int64_t tat_ms = 0;
  std::int64_t tat_frac = 0;
  friend bool operator==(const GcraState&, const GcraState&) = default;
};

using State =
    std::variant<FixedWindowState, SlidingLogState, SlidingWindowState, TokenBucketState, GcraState>;

/// The empty state of `algorithm` (nothing admitted yet).
State initial_state(RateAlgorithm algorithm);

/// Decides one request of `cost` at `now_ms`; updates `state` only if allowed
/// (a refusal consumes nothing). `state` must be of the rule's algorithm.
Decision decide(const RateRule& rule, State& state, std::int64_t now_ms, std::int64_t cost);

/// What decide() would answer, without changing anything.
Decision peek(const RateRule& rule, const State& state, std::int64_t now_ms, std::int64_t cost);

/// Gives back up to `amount` units of a decision allowed at `at_ms`; returns
/// the units given back (0 when the decision's window has passed). Per
/// algorithm: fixed_window: from the count, only while `at_ms`'s window is
/// current; sliding_log: from the entry at `at_ms`, while it is in the log;
/// sliding_window: from the current or previous window's count, whichever
/// `at_ms` belongs to; token_bucket: tokens back, the bucket never above its
/// capacity; gcra: the TAT back, never before now. The callers make sure
/// `amount` is no more than the decision took.
std::int64_t refund(const RateRule& rule, State& state, std::int64_t now_ms, std::int64_t at_ms,
                    std::int64_t amount);

/// One rule of a multi-rule decision.
struct Check {
  const RateRule* rule;
  State* state;
  std::int64_t cost;
};

/// Decides several rules for one request atomically: if every rule allows,
/// each takes its cost and every decision is as decide()'s; otherwise nothing
/// is taken from any, a refusing rule's decision is as decide()'s and an
/// allowing rule's says allowed with its remaining and reset as they stay.
/// Returns whether all allowed. The states must be distinct.
bool decide_all(const std::vector<Check>& checks, std::int64_t now_ms, std::vector<Decision>& out);

/// How long the state must be kept after `now_ms` (the Redis key's TTL): 0 =
/// it equals the initial state already (nothing to keep).
std::int64_t ttl_ms(const RateRule& rule, const State& state, std::int64_t now_ms);

/// The rule as the local layer's fallback share (on_redis_down = local):
/// rate and burst divided by local_divisor (at least 1).
RateRule local_share(const RateRule& rule);

}  // namespace fairgate::core::rate
