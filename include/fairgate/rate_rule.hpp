// fairgate/rate_rule.hpp — a rate-limit rule ("how many per period") and one
// decision about it. The exact semantics of each algorithm are in
// docs/ratelimit.md; the math is in src/core/rate_math.hpp.
#pragma once

#include <fairgate/settings.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fairgate {

/// The five algorithms (R1). All use exact integer arithmetic.
enum class RateAlgorithm : std::uint8_t {
  fixed_window,    ///< at most `rate` per aligned window [k·period, (k+1)·period)
  sliding_log,     ///< at most `rate` in any period (t − period, t]
  sliding_window,  ///< sliding window counter: previous window weighted by its overlap
  token_bucket,    ///< bucket of `burst` units refilled at rate/period
  gcra,            ///< generic cell rate algorithm: the token bucket as one timestamp
};

/// "fixed_window", "sliding_log", "sliding_window", "token_bucket", "gcra".
std::string_view to_string(RateAlgorithm algorithm) noexcept;
/// The algorithm named `name` (as to_string spells it), if any.
std::optional<RateAlgorithm> parse_rate_algorithm(std::string_view name) noexcept;

/// Limits on rules and costs, chosen so that every intermediate value of the
/// math stays below 2^53 (exact in the doubles of Redis' Lua).
inline constexpr std::int64_t kMaxRate = 1'000'000'000;
inline constexpr std::int64_t kMaxPeriodMs = 366LL * 24 * 3600 * 1000;
/// capacity × period_ms must not exceed this (2^50).
inline constexpr std::int64_t kMaxCapacityTimesPeriod = std::int64_t{1} << 50;
/// Costs above this are invalid input (an error), not a refusal.
inline constexpr std::int64_t kMaxCost = 1'000'000'000'000LL;
/// Keys (the dimension value: a user id, an IP, ...): 1..kMaxKeyBytes bytes.
inline constexpr std::size_t kMaxKeyBytes = 512;

/// One rule: `rate` units per `period_ms` milliseconds.
struct RateRule {
  RateAlgorithm algorithm = RateAlgorithm::token_bucket;
  /// Units admitted per period, 1..kMaxRate.
  std::int64_t rate = 1;
  /// The period in milliseconds, 1..kMaxPeriodMs.
  std::int64_t period_ms = 1000;
  /// token_bucket and gcra only: the most units that may pass at once (the
  /// bucket's size), 1..kMaxRate, or 0 = `rate`. The window algorithms have
  /// no burst (0 only): they admit `rate` per window.
  std::int64_t burst = 0;
  /// Redis backend: what a decision does while Redis is unreachable (D1):
  /// `local` = decide in this process with local_share of the rate, `open` =
  /// allow, `closed` = refuse (reason unavailable).
  RedisDownPolicy on_redis_down = RedisDownPolicy::local;
  /// Policy `local`: the share of `rate` (and of the burst) this instance
  /// allows on its own, 1/local_divisor (e.g. the number of instances), so
  /// the cluster stays near the rule's figure. 1..1000.
  std::int64_t local_divisor = 1;
  /// enforce (the default), or shadow (F14, docs/shadow.md): the rule is
  /// decided and counted as usual (what it would allow takes units), but a
  /// refusal refuses nothing — RateDecision::shadow is set and
  /// RateResult::allowed ignores the rule.
  LimiterMode mode = LimiterMode::enforce;

  /// The most units one decision can ever be allowed: burst (or rate) for
  /// token_bucket/gcra, rate for the window algorithms.
  std::int64_t capacity() const noexcept;

  friend bool operator==(const RateRule&, const RateRule&) = default;
};

/// std::nullopt if the rule is acceptable, else the first problem found
/// ("rate: 0 is not in 1..1000000000", ...).
std::optional<SettingsError> validate(const RateRule& rule);

/// Rule names: the limiter name rule, 1..64 characters of [A-Za-z0-9._-].
std::optional<SettingsError> validate_rule_name(std::string_view name);
/// Keys: 1..kMaxKeyBytes bytes, no control characters.
std::optional<SettingsError> validate_rate_key(std::string_view key);
/// A cost as it comes from outside (a JSON number): a whole number in
/// 1..kMaxCost, else the problem ("cost: -1 is not a positive whole number").
std::optional<SettingsError> validate_cost(double cost);
std::optional<SettingsError> validate_cost(std::int64_t cost);

}  // namespace fairgate
