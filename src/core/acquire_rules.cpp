#include "core/acquire_rules.hpp"

namespace fairgate::core {

std::optional<std::chrono::milliseconds> effective_max_wait(
    const std::optional<std::chrono::milliseconds>& requested, const Settings& settings,
    std::string_view tenant, std::uint32_t weight) {
  const std::chrono::milliseconds max_wait = requested.value_or(settings.max_wait);
  if (max_wait.count() < 0 || max_wait > kMaxWaitLimit) return std::nullopt;
  if (!tenant.empty() && !valid_tenant(tenant)) return std::nullopt;
  if (weight < 1 || weight > kMaxTenantWeight) return std::nullopt;
  return max_wait;
}

std::string acquire_options_problem(const std::optional<std::chrono::milliseconds>& requested,
                                    const Settings& settings, std::string_view tenant, std::uint32_t weight) {
  const std::chrono::milliseconds max_wait = requested.value_or(settings.max_wait);
  if (max_wait.count() < 0 || max_wait > kMaxWaitLimit)
    return "max_wait: " + std::to_string(max_wait.count()) + " ms is not in 0.." +
           std::to_string(kMaxWaitLimit.count()) + " ms";
  if (!tenant.empty() && !valid_tenant(tenant)) return "tenant: must be " + std::string(kTenantRule);
  if (weight < 1 || weight > kMaxTenantWeight)
    return "weight: " + std::to_string(weight) + " is not in 1.." + std::to_string(kMaxTenantWeight);
  return {};
}

std::string ended_message(RejectReason reason, std::chrono::milliseconds waited,
                          std::chrono::milliseconds max_wait, const Settings& settings) {
  switch (reason) {
    case RejectReason::timeout:
      return "no permit became free within " + std::to_string(max_wait.count()) + " ms";
    case RejectReason::cancelled: return "cancelled after waiting " + std::to_string(waited.count()) + " ms";
    case RejectReason::queue_full:
      return settings.max_queue ? "queue is full (" + std::to_string(*settings.max_queue) + " waiting)"
                                : "queue is full";
    case RejectReason::disabled: return "limiter is disabled";
    case RejectReason::shutdown: return "limiter is shutting down";
    case RejectReason::would_time_out: return "the estimated wait already exceeds max_wait (reject_early)";
    case RejectReason::unavailable: return "limiter is unavailable (its backend cannot be reached)";
    case RejectReason::invalid_argument:
      return "invalid acquire options (max_wait must be 0.." + std::to_string(kMaxWaitLimit.count()) +
             " ms, tenant " + std::string(kTenantRule) + ", weight 1.." + std::to_string(kMaxTenantWeight) +
             ")";
  }
  return "rejected";
}

}  // namespace fairgate::core
