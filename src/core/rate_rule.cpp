#include <fairgate/rate_rule.hpp>

#include <array>
#include <cmath>
#include <string>

namespace fairgate {

namespace {
constexpr std::array<std::string_view, 5> kNames = {"fixed_window", "sliding_log", "sliding_window",
                                                    "token_bucket", "gcra"};

std::string range_problem(std::int64_t value, std::int64_t lo, std::int64_t hi) {
  return std::to_string(value) + " is not in " + std::to_string(lo) + ".." + std::to_string(hi);
}
}  // namespace

std::string_view to_string(RateAlgorithm algorithm) noexcept {
  const auto i = static_cast<std::size_t>(algorithm);
  return i < kNames.size() ? kNames[i] : std::string_view("unknown");
}

std::optional<RateAlgorithm> parse_rate_algorithm(std::string_view name) noexcept {
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return static_cast<RateAlgorithm>(i);
  return std::nullopt;
}

std::int64_t RateRule::capacity() const noexcept {
  const bool bucket = algorithm == RateAlgorithm::token_bucket || algorithm == RateAlgorithm::gcra;
  return bucket && burst > 0 ? burst : rate;
}

std::optional<SettingsError> validate(const RateRule& rule) {
  if (static_cast<std::size_t>(rule.algorithm) >= kNames.size())
    return SettingsError{"algorithm",
                         "must be one of fixed_window, sliding_log, sliding_window, token_bucket, gcra"};
  if (rule.rate < 1 || rule.rate > kMaxRate)
    return SettingsError{"rate", range_problem(rule.rate, 1, kMaxRate)};
  if (rule.period_ms < 1 || rule.period_ms > kMaxPeriodMs)
    return SettingsError{"period_ms", range_problem(rule.period_ms, 1, kMaxPeriodMs)};
  const bool bucket = rule.algorithm == RateAlgorithm::token_bucket || rule.algorithm == RateAlgorithm::gcra;
  if (!bucket && rule.burst != 0)
    return SettingsError{"burst",
                         std::string(to_string(rule.algorithm)) +
                             " has no burst (it admits `rate` per window): only token_bucket and gcra do"};
  if (rule.burst < 0 || rule.burst > kMaxRate)
    return SettingsError{"burst", range_problem(rule.burst, 0, kMaxRate) + " (0 = rate)"};
  if (rule.capacity() > kMaxCapacityTimesPeriod / rule.period_ms)
    return SettingsError{"period_ms", "capacity " + std::to_string(rule.capacity()) + " x period_ms " +
                                          std::to_string(rule.period_ms) +
                                          " exceeds 2^50 (the math must stay exact in Redis' Lua)"};
  if (rule.local_divisor < 1 || rule.local_divisor > 1000)
    return SettingsError{"local_divisor", range_problem(rule.local_divisor, 1, 1000)};
  return std::nullopt;
}

std::optional<SettingsError> validate_rule_name(std::string_view name) {
  if (auto e = validate_limiter_name(name)) return SettingsError{"rule", e->problem};
  return std::nullopt;
}

std::optional<SettingsError> validate_rate_key(std::string_view key) {
  if (key.empty()) return SettingsError{"key", "must not be empty"};
  if (key.size() > kMaxKeyBytes)
    return SettingsError{"key", "must be at most " + std::to_string(kMaxKeyBytes) + " bytes, got " +
                                    std::to_string(key.size())};
  for (std::size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    // C0 and DEL, and the C1 controls as UTF-8 encodes them (U+0080..U+009F: C2 80..C2 9F).
    const bool c1 = c == 0xc2 && i + 1 < key.size() && static_cast<unsigned char>(key[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(key[i + 1]) <= 0x9f;
    if (c < 0x20 || c == 0x7f || c1) return SettingsError{"key", "must not contain control characters"};
  }
  return std::nullopt;
}

std::optional<SettingsError> validate_cost(std::int64_t cost) {
  if (cost < 1 || cost > kMaxCost)
    return SettingsError{"cost",
                         std::to_string(cost) + " is not a whole number in 1.." + std::to_string(kMaxCost)};
  return std::nullopt;
}

std::optional<SettingsError> validate_cost(double cost) {
  if (std::isnan(cost)) return SettingsError{"cost", "NaN is not a whole number"};
  if (std::isinf(cost)) return SettingsError{"cost", "infinity is not a whole number"};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", cost);  // 1.5, not std::to_string's 1.500000
  if (cost != std::floor(cost)) return SettingsError{"cost", std::string(buf) + " is not a whole number"};
  if (cost < 1 || cost > static_cast<double>(kMaxCost))
    return SettingsError{"cost",
                         std::string(buf) + " is not a whole number in 1.." + std::to_string(kMaxCost)};
  return std::nullopt;
}

}  // namespace fairgate
