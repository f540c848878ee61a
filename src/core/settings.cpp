#include <fairgate/settings.hpp>

#include "core/settings_table.hpp"

#include <array>
#include <optional>
#include <stdexcept>
#include <string>

namespace fairgate {

bool valid_tenant(std::string_view tenant) noexcept {
  if (tenant.empty() || tenant.size() > kMaxTenantLength) return false;
  for (const char c : tenant)
    if (c < '!' || c > '~') return false;
  return true;
}

namespace {

// The names of each choice live once, in the settings table (core/settings_table.hpp), in enum order.
template <class Enum, std::size_t N>
std::string_view name_of(const std::array<std::string_view, N>& names, Enum e) noexcept {
  const auto i = static_cast<std::size_t>(e);
  return i < N ? names[i] : std::string_view("?");
}

template <class Enum, std::size_t N>
std::optional<Enum> parse_name(const std::array<std::string_view, N>& names, std::string_view text) noexcept {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == text) return static_cast<Enum>(i);
  return std::nullopt;
}

}  // namespace

std::string_view to_string(DisabledMode mode) noexcept { return name_of(core::detail::kDisabledModes, mode); }

std::string_view to_string(LimiterMode mode) noexcept { return name_of(core::detail::kLimiterModes, mode); }

std::optional<LimiterMode> parse_limiter_mode(std::string_view text) noexcept {
  return parse_name<LimiterMode>(core::detail::kLimiterModes, text);
}

std::string_view to_string(RedisDownPolicy policy) noexcept {
  return name_of(core::detail::kRedisDownPolicies, policy);
}

std::optional<RedisDownPolicy> parse_redis_down_policy(std::string_view text) noexcept {
  return parse_name<RedisDownPolicy>(core::detail::kRedisDownPolicies, text);
}

void throw_exception_from_error(const SettingsError& error, const boost::source_location&) {
  throw std::invalid_argument(error.message());
}

std::optional<SettingsError> validate(const Settings& s) {
  if (s.max_concurrent < 1 || s.max_concurrent > kMaxConcurrentLimit) {
    return SettingsError{"max_concurrent", "must be between 1 and " + std::to_string(kMaxConcurrentLimit) +
                                               ", got " + std::to_string(s.max_concurrent)};
  }
  if (s.max_wait.count() < 0 || s.max_wait > kMaxWaitLimit) {
    return SettingsError{"max_wait", "must be between 0 ms and " + std::to_string(kMaxWaitLimit.count()) +
                                         " ms, got " + std::to_string(s.max_wait.count()) + " ms"};
  }
  if (s.max_queue && *s.max_queue > kMaxQueueLimit) {
    return SettingsError{"max_queue", "must be at most " + std::to_string(kMaxQueueLimit) + ", got " +
                                          std::to_string(*s.max_queue)};
  }
  if (s.max_per_tenant && (*s.max_per_tenant < 1 || *s.max_per_tenant > kMaxConcurrentLimit)) {
    std::string problem = "must be between 1 and ";
    problem.append(std::to_string(kMaxConcurrentLimit))
        .append(" (or unset for no per-tenant cap), got ")
        .append(std::to_string(*s.max_per_tenant));
    return SettingsError{"max_per_tenant", std::move(problem)};
  }
  if (s.local_share && *s.local_share > kMaxConcurrentLimit) {
    return SettingsError{"local_share", "must be between 0 and " + std::to_string(kMaxConcurrentLimit) +
                                            " (or unset for the seats held), got " +
                                            std::to_string(*s.local_share)};
  }
  return std::nullopt;
}

std::optional<SettingsError> validate_limiter_name(std::string_view name) {
  if (name.empty()) return SettingsError{"name", "must not be empty"};
  if (name.size() > kMaxNameLength) {
    return SettingsError{"name", "must be at most " + std::to_string(kMaxNameLength) + " characters, got " +
                                     std::to_string(name.size())};
  }
  if (name.front() == '.' || name.front() == '-') {
    return SettingsError{"name", "must not start with '.' or '-'"};
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return SettingsError{"name", "may contain only letters, digits, '.', '_' and '-'"};
  }
  return std::nullopt;
}

Settings apply(Settings base, const SettingsUpdate& u) {
  for (const auto& spec : core::kSettings)
    if (spec.in_update(u)) spec.set(base, spec.get_update(u));
  return base;
}

}  // namespace fairgate
